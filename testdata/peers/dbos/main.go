// Command dbospeer runs, on DBOS Transact Go, the workflow of Better Compute's
// workflow benchmarks: three steps, each one transaction that inserts one row of
// bench_wf_steps. It is the peer of BenchmarkWorkflowVsDBOS
// (workers/workflowworker), which builds it, runs it on a database of the same
// PostgreSQL server and reads the one JSON line it prints on stdout.
//
//	dbospeer -url postgres://…/db -mode throughput -n 2000
//	dbospeer -url postgres://…/db -mode latency -n 1000 -rate 100 -queue -poll 100ms
//
// throughput: -callers goroutines start -warmup workflows (not measured), then -n
// more, each start one RunWorkflow (or enqueue, with -queue), as fast as they
// can; workflows/s is n over the span from the first measured start to the last
// measured workflow's last step committed.
//
// latency: one start every 1/-rate s (a ticker; each start on its own
// goroutine), the first -warmup not measured; a workflow's latency runs from its
// start call's return to its last step's commit (the workflow function takes the
// clock right after its third step returned). Without -queue, it also reports
// the latency to GetResult's return (result_p50_ms, result_p99_ms); with -queue,
// GetResult polls the database (at 1 s by default), so it is only awaited after
// the measurement, to check every result.
//
// Both modes report the p50 of the step gaps (step 2's row's clock_timestamp()
// minus step 1's, and step 3's minus step 2's) and the CPU per workflow of this
// process (getrusage) and of the server processes connected to the database
// (/proc/<pid>/stat; -1 when it cannot be read) during the measured part.
//
// -step says how a step is written: "shared" (default) is DBOS's transactional
// step, dbos.RunAsTransaction on a data source, with the application's pool
// also given to DBOS as its system database pool (Config.SystemDBPool), so that
// the row and DBOS's checkpoint commit in one transaction (DBOS's own
// exactly-once form, and the like of ours: one transaction per step on one
// database); "datasource" is RunAsTransaction on a separate application pool
// (the row and a transaction_completion row in one transaction, DBOS's
// checkpoint in another); "step" is dbos.RunAsStep around the step's own
// transaction on the application pool (at least once: DBOS checkpoints it
// after the commit).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

const (
	stepDDL = `CREATE TABLE IF NOT EXISTS bench_wf_steps (id text NOT NULL, step int NOT NULL,
		at timestamptz NOT NULL DEFAULT clock_timestamp(), PRIMARY KEY (id, step))`
	stepSQL = `INSERT INTO bench_wf_steps (id, step) VALUES ($1, $2)`
)

type options struct {
	url     string
	mode    string
	n       int
	warmup  int
	callers int
	rate    float64
	queue   bool
	poll    time.Duration
	prefix  string
	step    string
	conns   int
	timeout time.Duration
	verbose bool
}

// result is the JSON line on stdout.
type result struct {
	Mode          string   `json:"mode"`
	Queue         bool     `json:"queue"`
	Step          string   `json:"step"`
	N             int      `json:"n"`
	Callers       int      `json:"callers"`
	Rate          float64  `json:"rate,omitempty"`
	WorkflowsPerS float64  `json:"workflows_per_s"`
	StepsPerS     float64  `json:"steps_per_s"`
	P50Ms         float64  `json:"p50_ms"`
	P99Ms         float64  `json:"p99_ms"`
	MaxMs         float64  `json:"max_ms"`
	ResultP50Ms   *float64 `json:"result_p50_ms,omitempty"`
	ResultP99Ms   *float64 `json:"result_p99_ms,omitempty"`
	StepGapP50Ms  float64  `json:"step_gap_p50_ms"`
	GoCPUMsPerWf  float64  `json:"go_cpu_ms_per_wf"`
	PgCPUMsPerWf  float64  `json:"pg_cpu_ms_per_wf"`
}

func main() {
	var o options
	flag.StringVar(&o.url, "url", "", "postgres URL of a database this may use (DBOS's system schema goes in it too)")
	flag.StringVar(&o.mode, "mode", "throughput", "throughput or latency")
	flag.IntVar(&o.n, "n", 1000, "workflows measured")
	flag.IntVar(&o.warmup, "warmup", 50, "workflows run first, not measured")
	flag.IntVar(&o.callers, "callers", 16, "concurrent starters (throughput)")
	flag.Float64Var(&o.rate, "rate", 100, "starts per second (latency)")
	flag.BoolVar(&o.queue, "queue", false, "start through a DBOS workflow queue instead of running in process")
	flag.DurationVar(&o.poll, "poll", 100*time.Millisecond, "the queue's polling interval (with -queue)")
	flag.StringVar(&o.prefix, "prefix", "d", "workflow id prefix")
	flag.StringVar(&o.step, "step", "shared", "how a step is written: shared, datasource or step (see the command's doc)")
	flag.IntVar(&o.conns, "conns", 20, "pool size (DBOS's default for its system database pool)")
	flag.DurationVar(&o.timeout, "timeout", 5*time.Minute, "give up after this long")
	flag.BoolVar(&o.verbose, "v", false, "log DBOS at info level")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "dbospeer: "+strings.ReplaceAll(err.Error(), "\n", " "))
		os.Exit(1)
	}
}

// peer is one run: DBOS, the application's pool and the workflows' clocks.
type peer struct {
	o     options
	dbos  dbos.Context
	pool  *pgxpool.Pool // the application's pool (also DBOS's with -step shared)
	ds    *dbos.DataSource
	queue dbos.Queue
	wf    dbos.Workflow[struct{}, int]

	mu       sync.Mutex
	finished map[string]time.Time // id -> when its third step returned (committed); zero if it failed
	fin      chan struct{}        // one per workflow finished
}

func run(o options) (err error) {
	switch {
	case o.url == "":
		return errors.New("-url is required")
	case o.mode != "throughput" && o.mode != "latency":
		return fmt.Errorf("-mode %q: want throughput or latency", o.mode)
	case o.step != "shared" && o.step != "datasource" && o.step != "step":
		return fmt.Errorf("-step %q: want shared, datasource or step", o.step)
	case o.n < 1 || o.warmup < 0 || o.callers < 1 || o.rate <= 0 || o.poll <= 0 || o.conns < 1:
		return errors.New("-n, -callers, -rate, -poll and -conns must be positive, -warmup not negative")
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()

	p := &peer{o: o, finished: map[string]time.Time{}, fin: make(chan struct{}, o.warmup+o.n)}
	cfg, err := pgxpool.ParseConfig(o.url)
	if err != nil {
		return fmt.Errorf("-url: %w", err)
	}
	cfg.MaxConns = int32(o.conns)
	if p.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return err
	}
	defer p.pool.Close()
	if _, err := p.pool.Exec(ctx, stepDDL); err != nil {
		return fmt.Errorf("create bench_wf_steps: %w", err)
	}
	// A workflow id already used would not run again (DBOS returns the
	// finished one): the run would wait for it in vain.
	var used bool
	if err := p.pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM bench_wf_steps WHERE starts_with(id, $1))`, o.prefix).Scan(&used); err != nil {
		return err
	}
	if used {
		return fmt.Errorf("bench_wf_steps has workflows of prefix %q already: use a fresh database or another -prefix", o.prefix)
	}

	level := slog.LevelWarn
	if o.verbose {
		level = slog.LevelInfo
	}
	dc := dbos.Config{
		AppName: "dbospeer",
		// Set, so that DBOS does not hash this binary to name the version.
		ApplicationVersion: "bench",
		Logger:             slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})),
	}
	if o.step == "shared" {
		dc.SystemDBPool = p.pool
	} else {
		// DBOS's own pool, of the same size as the application's.
		dc.DatabaseURL, err = withPoolMaxConns(o.url, o.conns)
		if err != nil {
			return err
		}
	}
	if p.dbos, err = dbos.NewContext(ctx, dc); err != nil {
		return fmt.Errorf("dbos: %w", err)
	}
	defer func() {
		if serr := dbos.Shutdown(p.dbos, 30*time.Second); serr != nil && err == nil {
			err = fmt.Errorf("dbos shutdown: %w", serr)
		}
	}()
	if o.step != "step" {
		if p.ds, err = dbos.NewDataSource(p.dbos, p.pool, dbos.WithDataSourceName("app")); err != nil {
			return fmt.Errorf("dbos data source: %w", err)
		}
	}
	p.wf = p.workflow
	dbos.RegisterWorkflow(p.dbos, p.wf, dbos.WithWorkflowName("bench_steps"))
	if o.queue {
		if p.queue, err = dbos.RegisterQueue(p.dbos, "bench", dbos.WithQueueBasePollingInterval(o.poll)); err != nil {
			return fmt.Errorf("dbos queue: %w", err)
		}
	}
	if err := dbos.Launch(p.dbos); err != nil {
		return fmt.Errorf("dbos launch: %w", err)
	}

	var res *result
	if o.mode == "throughput" {
		res, err = p.throughput(ctx)
	} else {
		res, err = p.latency(ctx)
	}
	if err != nil {
		return err
	}
	line, err := json.Marshal(res)
	if err != nil {
		return err
	}
	_, err = fmt.Println(string(line))
	return err
}

// withPoolMaxConns returns u with pool_max_conns set to n (unless it sets it).
func withPoolMaxConns(u string, n int) (string, error) {
	pu, err := url.Parse(u)
	if err != nil || pu.Scheme == "" {
		return u + " pool_max_conns=" + strconv.Itoa(n), nil // a key=value DSN
	}
	q := pu.Query()
	if !q.Has("pool_max_conns") {
		q.Set("pool_max_conns", strconv.Itoa(n))
	}
	pu.RawQuery = q.Encode()
	return pu.String(), nil
}

// workflow is the benchmark's workflow: three steps, each one transaction
// writing one row; it returns the number of steps run.
func (p *peer) workflow(ctx dbos.Context, _ struct{}) (steps int, err error) {
	id, err := dbos.GetWorkflowID(ctx)
	if err != nil {
		return 0, err
	}
	// The clock of the last step's commit (not a step: it only measures).
	defer func() { p.finish(id, err == nil) }()
	for s := 1; s <= 3; s++ {
		n, err := p.runStep(ctx, id, s)
		if err != nil {
			return steps, err
		}
		steps += n
	}
	return steps, nil
}

// finish records that workflow id finished, and when if ok (its last step
// committed: a failed one has no time, and its handle tells the error).
func (p *peer) finish(id string, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, seen := p.finished[id]; seen {
		return
	}
	var at time.Time
	if ok {
		at = time.Now()
	}
	p.finished[id] = at
	p.fin <- struct{}{}
}

func (p *peer) runStep(ctx dbos.Context, id string, s int) (int, error) {
	name := "s" + strconv.Itoa(s)
	if p.ds != nil {
		return dbos.RunAsTransaction(ctx, p.ds, func(ctx context.Context, tx dbos.Tx) (int, error) {
			if _, err := tx.Exec(ctx, stepSQL, id, s); err != nil {
				return 0, err
			}
			return 1, nil
		}, dbos.WithStepName(name))
	}
	return dbos.RunAsStep(ctx, func(ctx context.Context) (int, error) {
		err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, stepSQL, id, s)
			return err
		})
		if err != nil {
			return 0, err
		}
		return 1, nil
	}, dbos.WithStepName(name))
}

func (p *peer) id(i int) string { return p.o.prefix + strconv.Itoa(i) }

// start starts workflow i (RunWorkflow, on the queue with -queue).
func (p *peer) start(i int) (dbos.WorkflowHandle[int], error) {
	opts := []dbos.WorkflowOption{dbos.WithWorkflowID(p.id(i))}
	if p.queue != nil {
		opts = append(opts, dbos.WithQueue(p.queue))
	}
	return dbos.RunWorkflow(p.dbos, p.wf, struct{}{}, opts...)
}

// awaitFinished waits until n more workflows have finished their last step.
func (p *peer) awaitFinished(ctx context.Context, n int) error {
	for i := 0; i < n; i++ {
		select {
		case <-p.fin:
		case <-ctx.Done():
			return fmt.Errorf("timed out waiting for workflows to finish: %d of %d", i, n)
		}
	}
	return nil
}

func (p *peer) finishedAt(id string) (time.Time, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t := p.finished[id]
	return t, !t.IsZero()
}

// checkResults waits for each handle's result (each on its own goroutine) and
// checks it: 3 steps.
func checkResults(handles []dbos.WorkflowHandle[int]) error {
	errs := make([]error, len(handles))
	var wg sync.WaitGroup
	for i, h := range handles {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = checkResult(h) }()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func checkResult(h dbos.WorkflowHandle[int]) error {
	r, err := h.GetResult()
	if err == nil && r != 3 {
		err = fmt.Errorf("workflow %s returned %d, want 3", h.GetWorkflowID(), r)
	}
	return err
}

// startAll starts workflows [lo, hi) on p.o.callers goroutines, as fast as they
// can, and returns their handles and when each start call returned.
func (p *peer) startAll(lo, hi int) ([]dbos.WorkflowHandle[int], []time.Time, error) {
	handles := make([]dbos.WorkflowHandle[int], hi-lo)
	started := make([]time.Time, hi-lo)
	var next atomic.Int64
	next.Store(int64(lo))
	errs := make([]error, p.o.callers)
	var wg sync.WaitGroup
	for c := 0; c < p.o.callers; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= hi {
					return
				}
				h, err := p.start(i)
				started[i-lo] = time.Now()
				if err != nil {
					errs[c] = fmt.Errorf("start %s: %w", p.id(i), err)
					return
				}
				handles[i-lo] = h
			}
		}()
	}
	wg.Wait()
	return handles, started, errors.Join(errs...)
}

func (p *peer) throughput(ctx context.Context) (*result, error) {
	o := p.o
	if o.warmup > 0 {
		hs, _, err := p.startAll(0, o.warmup)
		if err != nil {
			return nil, err
		}
		if err := p.awaitFinished(ctx, o.warmup); err != nil {
			return nil, err
		}
		if err := checkResults(hs); err != nil {
			return nil, err
		}
	}

	cpu0, pg0 := processCPU(), p.serverCPU(ctx)
	begin := time.Now()
	handles, started, err := p.startAll(o.warmup, o.warmup+o.n)
	if err != nil {
		return nil, err
	}
	if err := p.awaitFinished(ctx, o.n); err != nil {
		return nil, err
	}
	cpu1, pg1 := processCPU(), p.serverCPU(ctx)
	if err := checkResults(handles); err != nil {
		return nil, err
	}

	res, last, err := p.measure(ctx, started, nil)
	if err != nil {
		return nil, err
	}
	res.WorkflowsPerS = float64(o.n) / last.Sub(begin).Seconds()
	p.cpu(res, cpu1-cpu0, pg0, pg1)
	return res, nil
}

func (p *peer) latency(ctx context.Context) (*result, error) {
	o := p.o
	total := o.warmup + o.n
	handles := make([]dbos.WorkflowHandle[int], total)
	started := make([]time.Time, total)
	results := make([]time.Time, total)
	errs := make([]error, total)    // of the starts
	resErrs := make([]error, total) // of GetResult (without -queue)
	var (
		cpu0     float64
		pg0      map[int]float64
		wg, wres sync.WaitGroup
	)
	t := time.NewTicker(time.Duration(float64(time.Second) / o.rate))
	defer t.Stop()
	begin := time.Now()
	for i := 0; i < total; i++ {
		if i > 0 {
			<-t.C
		}
		if i == o.warmup {
			cpu0, pg0 = processCPU(), p.serverCPU(ctx)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			h, err := p.start(i)
			started[i] = time.Now()
			if err != nil {
				errs[i] = fmt.Errorf("start %s: %w", p.id(i), err)
				return
			}
			handles[i] = h
			if !o.queue {
				wres.Add(1)
				go func() {
					defer wres.Done()
					resErrs[i] = checkResult(h)
					results[i] = time.Now()
				}()
			}
		}()
	}
	achieved := float64(max(total-1, 1)) / time.Since(begin).Seconds()
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if err := p.awaitFinished(ctx, total); err != nil {
		return nil, err
	}
	cpu1, pg1 := processCPU(), p.serverCPU(ctx)
	wres.Wait()
	if o.queue {
		if err := checkResults(handles); err != nil {
			return nil, err
		}
	}
	if err := errors.Join(resErrs...); err != nil {
		return nil, err
	}

	var measuredResults []time.Time
	if !o.queue {
		measuredResults = results[o.warmup:]
	}
	res, _, err := p.measure(ctx, started[o.warmup:], measuredResults)
	if err != nil {
		return nil, err
	}
	res.Rate = math.Round(achieved*10) / 10
	res.WorkflowsPerS = achieved
	p.cpu(res, cpu1-cpu0, pg0, pg1)
	return res, nil
}

// measure fills the figures of the measured workflows (ids warmup …
// warmup+n-1), given when each start call returned and, if known, when each
// GetResult returned; last is the last of their last steps' commits.
func (p *peer) measure(ctx context.Context, started, results []time.Time) (*result, time.Time, error) {
	o := p.o
	res := &result{Mode: o.mode, Queue: o.queue, Step: o.step, N: o.n, Callers: o.callers}
	ids := make([]string, o.n)
	lat := make([]time.Duration, o.n)
	var last time.Time
	for k := range ids {
		ids[k] = p.id(o.warmup + k)
		fin, ok := p.finishedAt(ids[k])
		if !ok {
			return nil, last, fmt.Errorf("workflow %s: not finished", ids[k])
		}
		lat[k] = fin.Sub(started[k])
		if fin.After(last) {
			last = fin
		}
	}
	res.P50Ms, res.P99Ms, res.MaxMs = ms(lat, .5), ms(lat, .99), ms(lat, 1)
	if results != nil {
		rl := make([]time.Duration, o.n)
		for k := range rl {
			rl[k] = results[k].Sub(started[k])
		}
		r50, r99 := ms(rl, .5), ms(rl, .99)
		res.ResultP50Ms, res.ResultP99Ms = &r50, &r99
	}

	var rows int
	var window float64
	err := p.pool.QueryRow(ctx, `SELECT count(*), coalesce(extract(epoch FROM max(at) - min(at)), 0)::float8
		FROM bench_wf_steps WHERE id = ANY($1)`, ids).Scan(&rows, &window)
	if err != nil {
		return nil, last, err
	}
	if rows != 3*o.n {
		return nil, last, fmt.Errorf("%d step rows for %d workflows, want 3 each", rows, o.n)
	}
	if window > 0 {
		res.StepsPerS = float64(rows) / window
	}
	r, err := p.pool.Query(ctx, `SELECT gap FROM (
		SELECT extract(epoch FROM at - lag(at) OVER (PARTITION BY id ORDER BY step))::float8 AS gap
		FROM bench_wf_steps WHERE id = ANY($1)) g WHERE gap IS NOT NULL`, ids)
	if err != nil {
		return nil, last, err
	}
	gapsS, err := pgx.CollectRows(r, pgx.RowTo[float64])
	if err != nil {
		return nil, last, err
	}
	gaps := make([]time.Duration, len(gapsS))
	for i, g := range gapsS {
		gaps[i] = time.Duration(g * float64(time.Second))
	}
	res.StepGapP50Ms = ms(gaps, .5)
	return res, last, nil
}

// cpu fills the CPU per workflow: this process's goCPU s, and the server's from
// its processes' CPU at the start (pg0) and at the end (pg1) of the measured part.
func (p *peer) cpu(res *result, goCPU float64, pg0, pg1 map[int]float64) {
	res.GoCPUMsPerWf = 1000 * goCPU / float64(p.o.n)
	res.PgCPUMsPerWf = -1
	if pg0 != nil && pg1 != nil {
		var s float64
		for pid, t := range pg1 {
			s += t - pg0[pid] // a backend new at the end counts from zero
		}
		res.PgCPUMsPerWf = 1000 * s / float64(p.o.n)
	}
}

// ms is the q-quantile (nearest rank) of ds in ms (0 when ds is empty).
func ms(ds []time.Duration, q float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := min(max(int(math.Ceil(q*float64(len(s))))-1, 0), len(s)-1)
	return float64(s[i]) / float64(time.Millisecond)
}

// processCPU is the CPU time this process used so far, in s.
func processCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// serverCPU returns the CPU time, in s, that each server process connected to
// the database used so far (from /proc: a server on this machine), or nil when
// it cannot tell.
func (p *peer) serverCPU(ctx context.Context) map[int]float64 {
	rows, err := p.pool.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = current_database()`)
	if err != nil {
		return nil
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil
	}
	out := map[int]float64{}
	for _, pid := range pids {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return nil
		}
		// After the command's closing parenthesis, utime and stime are the
		// 12th and 13th fields (the 14th and 15th of the line), in ticks of 1/100 s.
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(f) < 13 {
			return nil
		}
		ut, err1 := strconv.ParseFloat(f[11], 64)
		st, err2 := strconv.ParseFloat(f[12], 64)
		if err1 != nil || err2 != nil {
			return nil
		}
		out[int(pid)] = (ut + st) / 100
	}
	return out
}
