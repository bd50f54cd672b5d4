package workflowworker_test

import (
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/workflow"
	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/config"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

// The settings the workflow benchmarks share.
const (
	// benchSessions is pgbench's -c: the peers of BenchmarkWorkflowSteps run
	// 16 shards with benchWorkersPerShard workers each on a pool of
	// benchStepsConns connections (their step transactions and River's own
	// queries share it).
	benchSessions = 16
	// benchRate is the offered load of the latency benchmarks: one workflow
	// started (or signalled) every 10 ms.
	benchRate    = 100
	benchWarmup  = 50 // workflows (or signals) of the latency benchmarks not measured
	benchTimeout = 3 * time.Minute
	benchStepDDL = `CREATE TABLE bench_wf_steps (id text NOT NULL, step int NOT NULL,
		at timestamptz NOT NULL DEFAULT clock_timestamp(), PRIMARY KEY (id, step))`
	benchStepSQL = `INSERT INTO bench_wf_steps (id, step) VALUES ($1, $2)`
)

// The runtime's workers per shard (workertest.Fast's 4) and its pool size, in
// every benchmark; BENCH_WORKFLOW_WORKERS_PER_SHARD and BENCH_WORKFLOW_CONNS
// override them (to see how the figures depend on them).
var (
	benchWorkersPerShard = benchEnvInt("BENCH_WORKFLOW_WORKERS_PER_SHARD", workertest.Fast.WorkersPerShard)
	benchStepsConns      = benchEnvInt("BENCH_WORKFLOW_CONNS", 24)
)

func benchEnvInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// benchPolls are the River poll intervals the benchmarks run with: the tests'
// (workertest.Fast) and the production default (config.DefaultPollInterval).
var benchPolls = []time.Duration{workertest.Fast.PollInterval, config.DefaultPollInterval}

// benchOpts are the runtime options of every benchmark (the same for both peers
// of BenchmarkWorkflowSteps): the production lease timings (a busy machine
// must not lose a 1.5 s test lease mid-run), the tests' stop grace, and the
// poll interval given.
func benchOpts(poll time.Duration) *workers.Options {
	return &workers.Options{PollInterval: poll, WorkersPerShard: benchWorkersPerShard,
		LeaseTTL: config.DefaultLeaseTTL, LeaseRenew: config.DefaultLeaseRenew}
}

// benchStepsWorkflow is a workflow of three transactional steps s1, s2, s3: each
// writes one row of bench_wf_steps and goes to the next; s3 finishes. last, if
// set, runs in s3's transaction before it finishes.
func benchStepsWorkflow(kind string, last func(ctx context.Context, tx pgx.Tx, id string) error) *workflow.Workflow[struct{}, int, int] {
	step := func(n int) workflow.Step[int] {
		return workflow.Step[int]{Name: fmt.Sprintf("s%d", n), Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[int]) (workflow.Next, error) {
			if _, err := tx.Exec(ctx, benchStepSQL, c.WorkflowID, n); err != nil {
				return workflow.Next{}, err
			}
			*c.State++
			if n < 3 {
				return workflow.Goto(fmt.Sprintf("s%d", n+1)), nil
			}
			if last != nil {
				if err := last(ctx, tx, c.WorkflowID); err != nil {
					return workflow.Next{}, err
				}
			}
			return workflow.Finish(*c.State), nil
		}}
	}
	return &workflow.Workflow[struct{}, int, int]{Kind: kind, Steps: []workflow.Step[int]{step(1), step(2), step(3)}}
}

// benchChainArgs is one step of the hand-chained peer: plain River jobs of a
// fenced kind, each writing its row and inserting the next in its transaction.
type benchChainArgs struct {
	ID   string `json:"id"`
	Step int    `json:"step"`
}

func (benchChainArgs) Kind() string { return "bench_wf_chain" }

type benchChainWorker struct {
	river.WorkerDefaults[benchChainArgs]
	last *atomic.Int64
}

func (w *benchChainWorker) Work(ctx context.Context, job *river.Job[benchChainArgs]) error {
	return workers.InTx(ctx, job, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, benchStepSQL, job.Args.ID, job.Args.Step); err != nil {
			return err
		}
		if job.Args.Step == 3 {
			w.last.Add(1)
			return nil
		}
		_, err := jobs.InsertTx(ctx, tx, benchChainArgs{ID: job.Args.ID, Step: job.Args.Step + 1}, &river.InsertOpts{Queue: job.Queue})
		return err
	})
}

// benchInsertAll runs insert for n ids (prefix0 … prefix<n-1>), 200 per
// transaction, on 4 goroutines.
func benchInsertAll(b *testing.B, db *pg.Pool, prefix string, n int, insert func(ctx context.Context, tx pgx.Tx, id string) error) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	const per, par = 200, 4
	errs := make(chan error, par)
	for g := 0; g < par; g++ {
		go func() {
			for lo := g * per; lo < n; lo += par * per {
				err := pg.InTx(context.Background(), db, func(ctx context.Context, tx pgx.Tx) error {
					for _, id := range ids[lo:min(lo+per, n)] {
						if err := insert(ctx, tx, id); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for g := 0; g < par; g++ {
		require.NoError(b, <-errs)
	}
	return ids
}

// benchPeer is one side of BenchmarkWorkflowSteps: its database and how it
// starts chains of three steps and tells they are done.
type benchPeer struct {
	name  string
	db    *pgtest.DB
	last  atomic.Int64 // last steps run (a cheap cue to start asking the database)
	chain int          // chains started so far
	// registry is a fresh registry for one runtime start; start starts the
	// chain id in tx; done reports whether every chain started is done.
	registry func() *workers.Registry
	start    func(ctx context.Context, tx pgx.Tx, id string) error
	done     func() bool
	window   float64 // s between the first and the last step's row, summed over the slices
	wall     float64 // s from each runtime start until its slice was seen done, summed
	steps    int
	goCPU    float64 // s of CPU this process used during the slices
	pgCPU    float64 // s of CPU the database's server processes used (-1: unknown)
}

// cpuPerStep returns the CPU ms per step of this process and of the server.
func (p *benchPeer) cpuPerStep() (goMs, pgMs float64) {
	return 1000 * p.goCPU / float64(p.steps), 1000 * p.pgCPU / float64(p.steps)
}

func (p *benchPeer) rate() float64     { return float64(p.steps) / p.window }
func (p *benchPeer) wallRate() float64 { return float64(p.steps) / p.wall }

// slice starts n chains (ids <peer><tag><i>) with no runtime running, then
// starts the runtime and waits until they are done; the timer, when timed,
// runs from the runtime's start until then.
func (p *benchPeer) slice(b *testing.B, tag string, n int, poll time.Duration, timed bool) {
	ctx := context.Background()
	prefix := p.name + tag
	benchInsertAll(b, p.db.Pool, prefix, n, p.start)
	p.chain += n
	reg := p.registry()
	go0, pg0 := benchProcessCPU(), benchServerCPU(b, p.db)
	if timed {
		b.StartTimer()
	}
	begin := time.Now()
	rt := workertest.Start(b, p.db.Pool, reg, benchOpts(poll))
	deadline := begin.Add(benchTimeout)
	for p.last.Load() < int64(p.chain) || !p.done() {
		if time.Now().After(deadline) {
			b.Fatalf("%s: timed out: %d of %d chains ran their last step", p.name, p.last.Load(), p.chain)
		}
		time.Sleep(5 * time.Millisecond)
	}
	p.wall += time.Since(begin).Seconds()
	if timed {
		b.StopTimer()
	}
	p.goCPU += benchProcessCPU() - go0
	if pg1 := benchServerCPU(b, p.db); pg0 != nil && pg1 != nil && p.pgCPU >= 0 {
		for pid, t := range pg1 {
			p.pgCPU += t - pg0[pid] // a backend that is new counts from zero
		}
	} else {
		p.pgCPU = -1
	}
	require.NoError(b, rt.Stop(ctx))
	var steps int
	var window float64
	require.NoError(b, p.db.QueryRow(ctx, `SELECT count(*), coalesce(extract(epoch FROM max(at) - min(at)), 0)::float8
		FROM bench_wf_steps WHERE id LIKE $1 || '%'`, prefix).Scan(&steps, &window))
	require.Equal(b, 3*n, steps, "every step writes exactly one row")
	p.steps += steps
	p.window += window
	// Nothing left for autovacuum to do while the other peer runs.
	p.db.MustExec(b, `VACUUM ANALYZE`)
}

// benchProcessCPU is the CPU time this process used so far, in s.
func benchProcessCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// benchServerCPU returns the CPU time, in s, that each server process
// connected to db used so far (from /proc, so only for a server on this
// machine; nil when it cannot tell).
func benchServerCPU(b *testing.B, db *pgtest.DB) map[int]float64 {
	rows, err := db.Query(context.Background(), `SELECT pid FROM pg_stat_activity WHERE datname = current_database()`)
	require.NoError(b, err)
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(b, err)
	out := map[int]float64{}
	for _, pid := range pids {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return nil
		}
		// Fields after the command's closing parenthesis: state is the 3rd
		// field, utime and stime the 14th and 15th (clock ticks of 1/100 s).
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

// BenchmarkWorkflowSteps: steps/s of b.N workflows of three transactional
// steps (each writes one row and Goto's the next; the last finishes), against
// the same b.N chains of three plain River jobs hand-chained in the same shard
// queue (a fenced kind registered with workers.AddWorker; its Work, in
// workers.InTx, writes the row and jobs.InsertTx's the next step's job into
// the job's own queue, and completes; the last inserts nothing), and against
// pgbench -N with 16 clients on the same server, in the same run.
//
// Each peer has its own fresh database and the same runtime options: 16
// shards with benchWorkersPerShard workers each on a pool of benchStepsConns
// connections, River poll-only at the poll interval the sub-benchmark names.
// The chains are started with no runtime running, so that every step runs
// from a backlog; each peer drains half of its chains, in the order workflow,
// hand-chained, hand-chained, workflow (so that a load that drifts during the
// run weighs on both alike). steps/s is the steps' rows over the spans between
// the first and the last row's clock_timestamp() of each half (the runtime's
// start excluded); the timer covers the workflow peer's drains only. It also
// reports each peer's CPU per step (this process plus the server processes of
// the peer's database, read from /proc, so only with a server on this
// machine): on a machine that other work shares, a steadier figure than
// steps/s; and wf_step_gap_p50_ms, the p50 of the gaps between a workflow's
// consecutive steps' rows.
//
//	go test -run '^$' -bench WorkflowSteps -benchtime 2s -timeout 20m ./workers/workflowworker/
func BenchmarkWorkflowSteps(b *testing.B) {
	for _, poll := range benchPolls {
		b.Run("poll="+poll.String(), func(b *testing.B) { benchSteps(b, poll) })
	}
}

func benchSteps(b *testing.B, poll time.Duration) {
	b.StopTimer()
	tps := pgtest.PgbenchOnce(b, "BenchmarkWorkflowSteps", benchSessions, 10*time.Second)

	w := &benchPeer{name: "w", db: pgtest.New(b, pgtest.Options{MaxConns: int32(benchStepsConns)})}
	wf := benchStepsWorkflow("bench_steps", func(context.Context, pgx.Tx, string) error { w.last.Add(1); return nil })
	w.registry = func() *workers.Registry {
		reg := workers.NewRegistry()
		require.NoError(b, addWorkflow(reg, wf))
		return reg
	}
	w.start = func(ctx context.Context, tx pgx.Tx, id string) error {
		_, err := wf.StartTx(ctx, tx, struct{}{}, &workflow.StartOpts{ID: id})
		return err
	}
	w.done = func() bool {
		return w.db.MustCount(b, `SELECT count(*) FROM compute_workflows WHERE status = 'completed'`) == w.chain
	}

	h := &benchPeer{name: "h", db: pgtest.New(b, pgtest.Options{MaxConns: int32(benchStepsConns)})}
	h.registry = func() *workers.Registry {
		reg := workers.NewRegistry()
		require.NoError(b, workers.AddWorker(reg, &benchChainWorker{last: &h.last}))
		return reg
	}
	h.start = func(ctx context.Context, tx pgx.Tx, id string) error {
		_, err := workers.InsertForKeyTx(ctx, tx, id, benchChainArgs{ID: id, Step: 1}, nil)
		return err
	}
	h.done = func() bool {
		return h.db.MustCount(b, `SELECT count(*) FROM river_job WHERE kind = 'bench_wf_chain' AND state <> 'completed'`) == 0
	}

	for _, p := range []*benchPeer{w, h} {
		p.db.MustExec(b, benchStepDDL)
		// Record the kinds (as migrate or a worker start does) before the starts.
		require.NoError(b, p.registry().Record(context.Background(), p.db.Pool))
	}
	n1 := b.N / 2
	w.slice(b, "a", n1, poll, true)
	h.slice(b, "a", n1, poll, false)
	h.slice(b, "b", b.N-n1, poll, false)
	w.slice(b, "b", b.N-n1, poll, true)

	b.ReportMetric(w.rate(), "wf_steps/s")
	b.ReportMetric(benchMs(benchStepGaps(b, w.db, nil), .5), "wf_step_gap_p50_ms")
	b.ReportMetric(h.rate(), "handchained_steps/s")
	b.ReportMetric(tps, "pgbench_N_tps")
	b.ReportMetric(w.rate()/h.rate(), "wf/handchained")
	b.ReportMetric(w.rate()/tps, "wf/pgbench")
	b.ReportMetric(h.rate()/tps, "handchained/pgbench")
	cpu := "CPU per step unknown (the server is not on this machine)"
	if wGo, wPg := w.cpuPerStep(); w.pgCPU >= 0 && h.pgCPU >= 0 {
		hGo, hPg := h.cpuPerStep()
		b.ReportMetric(wGo+wPg, "wf_cpu_ms/step")
		b.ReportMetric(hGo+hPg, "handchained_cpu_ms/step")
		b.ReportMetric((hGo+hPg)/(wGo+wPg), "handchained_cpu/wf_cpu")
		cpu = fmt.Sprintf("CPU per step (this process + the peer's server processes): workflow %.2f + %.2f ms, hand-chained %.2f + %.2f ms", wGo, wPg, hGo, hPg)
	}
	b.Logf("n=%d chains of 3 steps, poll %s, 16 shards x %d workers, pool %d: workflow %.0f steps/s (wall incl. runtime start %.0f), hand-chained %.0f (wall %.0f), pgbench -N -c %d %.0f tps; wf/handchained %.2f, wf/pgbench %.3f; %s",
		b.N, poll, benchWorkersPerShard, benchStepsConns, w.rate(), w.wallRate(), h.rate(), h.wallRate(), benchSessions, tps, w.rate()/h.rate(), w.rate()/tps, cpu)
	if testing.Verbose() {
		b.Logf(" workflow:")
		benchStepBreakdown(b, w.db, jobs.WorkflowStepKind, "workflow_id", nil)
		b.Logf(" hand-chained:")
		benchStepBreakdown(b, h.db, benchChainArgs{}.Kind(), "id", nil)
	}
}

// benchListener records when each workflow's last step committed, by
// workflow id: its done, called in that step's transaction, records the time
// once the transaction has committed (pg.AfterCommit, in this process, as
// DBOS's side takes its clock in its process). Before, the last step sent a
// NOTIFY, which cost the server a global lock at each COMMIT and a listening
// backend, and so charged the instrument to our side's CPU and throughput.
type benchListener struct {
	mu sync.Mutex
	at map[string]time.Time
}

func benchListen() *benchListener { return &benchListener{at: map[string]time.Time{}} }

// done records workflow id's end once tx commits.
func (l *benchListener) done(_ context.Context, tx pgx.Tx, id string) error {
	if !pg.AfterCommit(tx, func() { l.record(id) }) {
		return fmt.Errorf("the step's transaction of workflow %s does not tell its commit", id)
	}
	return nil
}

func (l *benchListener) record(id string) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.at[id]; !ok {
		l.at[id] = now
	}
}

func (l *benchListener) get(id string) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	t, ok := l.at[id]
	return t, ok
}

func (l *benchListener) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.at)
}

// benchPaced calls f(i) for i in [0, n), each on its own goroutine, one every
// 1/benchRate seconds (a ticker: the offered load does not slow down when a
// call is slow), waits for every call and returns the first error and the
// rate at which the calls were made. It starts b's timer right before the
// call of benchWarmup (the first one measured).
func benchPaced(b *testing.B, n int, f func(i int) error) (float64, error) {
	t := time.NewTicker(time.Second / benchRate)
	defer t.Stop()
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	start := time.Now()
	for i := 0; i < n; i++ {
		if i > 0 {
			<-t.C
		}
		if i == benchWarmup {
			b.StartTimer()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(i); err != nil {
				once.Do(func() { first = err })
			}
		}()
	}
	rate := float64(max(n-1, 1)) / max(time.Since(start).Seconds(), 1e-9)
	wg.Wait()
	return rate, first
}

// benchWaitCount waits until count() reaches n.
func benchWaitCount(b *testing.B, what string, n int, count func() int) {
	deadline := time.Now().Add(benchTimeout)
	for count() < n {
		if time.Now().After(deadline) {
			b.Fatalf("timed out waiting for %s: %d of %d", what, count(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// benchStepBreakdown logs (with -v), for the jobs of workflows ids, the p50/p99 of
// River's pickup wait (attempted_at - scheduled_at: the poll interval, mostly)
// and of a step's run (finalized_at - attempted_at: Work until the completion
// in its transaction), by step.
func benchStepBreakdown(b *testing.B, db *pgtest.DB, kind, idKey string, ids []string) {
	rows, err := db.Query(context.Background(), `SELECT args->>'step',
	       extract(epoch FROM attempted_at - scheduled_at)::float8, extract(epoch FROM finalized_at - attempted_at)::float8
	FROM river_job WHERE kind = $1 AND ($3::text[] IS NULL OR args->>$2 = ANY($3)) AND state = 'completed'
	ORDER BY 1`, kind, idKey, ids)
	require.NoError(b, err)
	wait, run := map[string][]time.Duration{}, map[string][]time.Duration{}
	var steps []string
	for rows.Next() {
		var step string
		var w, r float64
		require.NoError(b, rows.Scan(&step, &w, &r))
		if _, ok := wait[step]; !ok {
			steps = append(steps, step)
		}
		wait[step] = append(wait[step], time.Duration(w*float64(time.Second)))
		run[step] = append(run[step], time.Duration(r*float64(time.Second)))
	}
	require.NoError(b, rows.Err())
	for _, s := range steps {
		b.Logf("  step job %-8s (n=%d): pickup wait (attempted_at-scheduled_at) p50 %.1f p99 %.1f ms; run (finalized_at-attempted_at) p50 %.1f p99 %.1f ms",
			s, len(wait[s]), benchMs(wait[s], .5), benchMs(wait[s], .99), benchMs(run[s], .5), benchMs(run[s], .99))
	}
}

// benchMs is the q-quantile (nearest rank) of ds in ms.
func benchMs(ds []time.Duration, q float64) float64 {
	if len(ds) == 0 {
		return math.NaN()
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	i = min(max(i, 0), len(s)-1)
	return float64(s[i]) / float64(time.Millisecond)
}

// BenchmarkWorkflowLatency: start-to-finish latency of a workflow of three
// transactional steps (as BenchmarkWorkflowSteps'), one started every 10 ms
// (100 workflows/s, each start its own transaction), River poll-only at the
// poll interval the sub-benchmark names. A workflow's latency runs from its
// start's commit (pg.InTx returned) to its last step's commit (benchListener):
// wall clock, both in this process. The first benchWarmup workflows are not measured; b.N is
// the number measured, and the timer runs from the first of them until every
// workflow has finished (so ns/op is about the 10 ms pacing). It reports p50,
// p99 and the largest in ms, and with -v logs where the time goes per step
// job (River's pickup wait and the step's run).
//
//	go test -run '^$' -bench WorkflowLatency -benchtime 2s -timeout 20m ./workers/workflowworker/
func BenchmarkWorkflowLatency(b *testing.B) {
	for _, poll := range benchPolls {
		b.Run("poll="+poll.String(), func(b *testing.B) { benchLatency(b, poll) })
	}
}

func benchLatency(b *testing.B, poll time.Duration) {
	b.StopTimer()
	ctx := context.Background()
	db := pgtest.New(b)
	db.MustExec(b, benchStepDDL)
	l := benchListen()
	wf := benchStepsWorkflow("bench_latency", l.done)
	reg := workers.NewRegistry()
	require.NoError(b, addWorkflow(reg, wf))
	workertest.Start(b, db.Pool, reg, benchOpts(poll))

	total := benchWarmup + b.N
	ids := make([]string, total)
	for i := range ids {
		ids[i] = fmt.Sprintf("l%d", i)
	}
	committed := make([]time.Time, total)
	startCall := make([]time.Duration, total)
	achieved, err := benchPaced(b, total, func(i int) error {
		t := time.Now()
		err := pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
			_, err := wf.StartTx(ctx, tx, struct{}{}, &workflow.StartOpts{ID: ids[i]})
			return err
		})
		committed[i] = time.Now()
		startCall[i] = committed[i].Sub(t)
		return err
	})
	require.NoError(b, err)
	benchWaitCount(b, "workflows finished", total, l.count)
	b.StopTimer()

	lat := make([]time.Duration, 0, b.N)
	for i := benchWarmup; i < total; i++ {
		at, ok := l.get(ids[i])
		require.True(b, ok)
		lat = append(lat, at.Sub(committed[i]))
	}
	require.Equal(b, total, db.MustCount(b, `SELECT count(*) FROM compute_workflows WHERE status = 'completed'`))
	p50, p99 := benchMs(lat, .5), benchMs(lat, .99)
	b.ReportMetric(p50, "p50_ms")
	b.ReportMetric(p99, "p99_ms")
	b.ReportMetric(benchMs(lat, 1), "max_ms")
	b.Logf("start-to-finish of 3 steps at %.0f workflows/s (n=%d after %d warm-up), poll %s, 16 shards x %d workers: p50 %.1f ms p99 %.1f ms max %.1f ms; the start transaction p50 %.1f ms",
		achieved, b.N, benchWarmup, poll, benchWorkersPerShard, p50, p99, benchMs(lat, 1), benchMs(startCall, .5))
	if testing.Verbose() {
		benchStepBreakdown(b, db, jobs.WorkflowStepKind, "workflow_id", ids[benchWarmup:])
	}
}

// BenchmarkWorkflowSignalLatency: signal-to-resume latency. Workflows wait in
// AwaitSignal (timeout 1 h); once all wait, one is signalled every 10 ms
// (SignalTx, each its own transaction), River poll-only at the poll interval
// the sub-benchmark names. resume is from the signal's commit (pg.InTx
// returned) to the entry of the resumed step's function (inside its fenced
// transaction); commit is to that step's commit (benchListener). The first benchWarmup signals are not measured; b.N is the
// number measured, and the timer runs from the first of them until every
// resumed step has committed.
//
//	go test -run '^$' -bench WorkflowSignalLatency -benchtime 2s -timeout 20m ./workers/workflowworker/
func BenchmarkWorkflowSignalLatency(b *testing.B) {
	for _, poll := range benchPolls {
		b.Run("poll="+poll.String(), func(b *testing.B) { benchSignalLatency(b, poll) })
	}
}

func benchSignalLatency(b *testing.B, poll time.Duration) {
	b.StopTimer()
	ctx := context.Background()
	db := pgtest.New(b)
	l := benchListen()
	var entered sync.Map // id -> time.Time of the resumed step's first entry
	wf := &workflow.Workflow[struct{}, int, int]{
		Kind: "bench_signal",
		Steps: []workflow.Step[int]{
			{Name: "wait", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[int]) (workflow.Next, error) {
				return workflow.AwaitSignal("go", time.Hour, "resumed", "timeout"), nil
			}},
			{Name: "resumed", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[int]) (workflow.Next, error) {
				entered.LoadOrStore(c.WorkflowID, time.Now())
				if c.Signal == nil {
					return workflow.Next{}, fmt.Errorf("resumed without a signal")
				}
				return workflow.Finish(1), l.done(ctx, tx, c.WorkflowID)
			}},
			{Name: "timeout", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[int]) (workflow.Next, error) {
				return workflow.Fail("timed out"), nil
			}},
		},
		Signals: []string{"go"},
	}
	reg := workers.NewRegistry()
	require.NoError(b, addWorkflow(reg, wf))
	workertest.Start(b, db.Pool, reg, benchOpts(poll))

	total := benchWarmup + b.N
	ids := benchInsertAll(b, db.Pool, "s", total, func(ctx context.Context, tx pgx.Tx, id string) error {
		_, err := wf.StartTx(ctx, tx, struct{}{}, &workflow.StartOpts{ID: id})
		return err
	})
	benchWaitCount(b, "workflows waiting", total, func() int {
		return db.MustCount(b, `SELECT count(*) FROM compute_workflows WHERE status = 'waiting'`)
	})
	// Let the runtime settle (the last awaits' completions, River's fetches).
	time.Sleep(2 * poll)

	committed := make([]time.Time, total)
	sendCall := make([]time.Duration, total)
	achieved, err := benchPaced(b, total, func(i int) error {
		t := time.Now()
		err := pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
			_, err := workflow.SignalTx(ctx, tx, ids[i], "go", map[string]int{"n": i}, nil)
			return err
		})
		committed[i] = time.Now()
		sendCall[i] = committed[i].Sub(t)
		return err
	})
	require.NoError(b, err)
	benchWaitCount(b, "resumed steps committed", total, l.count)
	b.StopTimer()

	var resume, commit []time.Duration
	for i := benchWarmup; i < total; i++ {
		e, ok := entered.Load(ids[i])
		require.True(b, ok)
		c, ok := l.get(ids[i])
		require.True(b, ok)
		resume = append(resume, e.(time.Time).Sub(committed[i]))
		commit = append(commit, c.Sub(committed[i]))
	}
	require.Equal(b, total, db.MustCount(b, `SELECT count(*) FROM compute_workflows WHERE status = 'completed'`))
	b.ReportMetric(benchMs(resume, .5), "resume_p50_ms")
	b.ReportMetric(benchMs(resume, .99), "resume_p99_ms")
	b.ReportMetric(benchMs(commit, .5), "commit_p50_ms")
	b.ReportMetric(benchMs(commit, .99), "commit_p99_ms")
	b.Logf("signal-to-resume at %.0f signals/s (n=%d after %d warm-up), poll %s, 16 shards x %d workers: resume p50 %.1f p99 %.1f max %.1f ms; resumed step committed p50 %.1f p99 %.1f ms; the SignalTx transaction p50 %.1f ms",
		achieved, b.N, benchWarmup, poll, benchWorkersPerShard, benchMs(resume, .5), benchMs(resume, .99), benchMs(resume, 1),
		benchMs(commit, .5), benchMs(commit, .99), benchMs(sendCall, .5))
	if testing.Verbose() {
		benchStepBreakdown(b, db, jobs.WorkflowStepKind, "workflow_id", ids[benchWarmup:])
	}
}
