package workflowworker_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/workflow"
	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/config"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

// BenchmarkWorkflowVsDBOS: the workflow of BenchmarkWorkflowSteps (three
// transactional steps, each writing one row of bench_wf_steps), on our runtime
// and on DBOS Transact Go (v1.9.0) in the same run, each on a fresh database of
// the same server. The DBOS peer is testdata/peers/dbos, a module of its own
// (so DBOS stays out of our go.mod), built once with go build and run as a
// process of its own; it prints its figures as one JSON line. Its steps are
// dbos.RunAsTransaction on a data source whose pool is also DBOS's system
// database pool, so each step's row and DBOS's checkpoint commit in one
// transaction, as ours do (BENCH_DBOS_STEP=datasource or step picks the peer's
// other forms, see its doc).
//
// Ours: 16 shards with benchWorkersPerShard workers each, River poll-only at
// config.DefaultPollInterval; each start is its own transaction (pg.InTx and
// StartTx), and a workflow is done when its last step's transaction has
// committed (benchListener: in process, as DBOS's clock). DBOS: each start is one RunWorkflow (in process), or one
// enqueue on a DBOS queue polled at the same interval (latency_queue), and a
// workflow is done when its last step returned (committed), the workflow
// function's clock. Both pools have benchStepsConns connections.
//
//   - throughput: benchSessions callers start b.N workflows as fast as they
//     can (after benchWarmup not measured); wf/s is b.N over the span from the
//     first measured start to the last workflow done.
//   - latency, latency_queue: one start every 10 ms (benchRate, as
//     BenchmarkWorkflowLatency), the first benchWarmup not measured; a
//     workflow's latency runs from its start's return (our commit, DBOS's
//     RunWorkflow or enqueue) to its last step's commit.
//
// Each reports, ours and DBOS's: the p50 of the gaps between a workflow's
// consecutive steps (their rows' clock_timestamp()), and the CPU per workflow
// during the measured part, of the process (getrusage: for ours, this test
// process, its callers included) plus the server processes of the peer's
// database (/proc, so only with a server on this machine). The timer covers our
// measured part only.
//
//	go test -run '^$' -bench WorkflowVsDBOS -benchtime 2000x -timeout 30m ./workers/workflowworker/
func BenchmarkWorkflowVsDBOS(b *testing.B) {
	bin := benchBuildDBOSPeer(b)
	b.Run("throughput", func(b *testing.B) { benchVsDBOS(b, bin, "throughput", false) })
	b.Run("latency", func(b *testing.B) { benchVsDBOS(b, bin, "latency", false) })
	b.Run("latency_queue", func(b *testing.B) { benchVsDBOS(b, bin, "latency", true) })
}

// benchDBOSPeer is the JSON line testdata/peers/dbos prints.
type benchDBOSPeer struct {
	Step          string  `json:"step"`
	WorkflowsPerS float64 `json:"workflows_per_s"`
	StepsPerS     float64 `json:"steps_per_s"`
	P50Ms         float64 `json:"p50_ms"`
	P99Ms         float64 `json:"p99_ms"`
	MaxMs         float64 `json:"max_ms"`
	StepGapP50Ms  float64 `json:"step_gap_p50_ms"`
	GoCPUMsPerWf  float64 `json:"go_cpu_ms_per_wf"`
	PgCPUMsPerWf  float64 `json:"pg_cpu_ms_per_wf"`
}

// benchVsOurs are our figures in one sub-benchmark of BenchmarkWorkflowVsDBOS.
type benchVsOurs struct {
	wfPerS float64         // throughput only
	lat    []time.Duration // start's commit → the last step's commit, per workflow
	gaps   []time.Duration // between consecutive steps' rows
	goMs   float64         // CPU ms per workflow of this process
	pgMs   float64         // and of the server (-1: unknown)
	runs   *pgtest.DB      // the database
	ids    []string        // the workflows measured
}

func benchVsDBOS(b *testing.B, bin, mode string, queue bool) {
	b.StopTimer()
	var ours benchVsOurs
	if mode == "throughput" {
		ours = benchVsOursThroughput(b)
	} else {
		ours = benchVsOursLatency(b)
	}

	args := []string{"-mode", mode, "-n", strconv.Itoa(b.N), "-warmup", strconv.Itoa(benchWarmup),
		"-callers", strconv.Itoa(benchSessions), "-rate", strconv.Itoa(benchRate),
		"-conns", strconv.Itoa(benchStepsConns), "-prefix", "d"}
	if queue {
		args = append(args, "-queue", "-poll", config.DefaultPollInterval.String())
	}
	if s := os.Getenv("BENCH_DBOS_STEP"); s != "" {
		args = append(args, "-step", s)
	}
	peer := benchRunDBOSPeer(b, bin, pgtest.New(b, pgtest.Options{Empty: true}).URL, args)

	gap := benchMs(ours.gaps, .5)
	b.ReportMetric(gap, "step_gap_p50_ms")
	b.ReportMetric(peer.StepGapP50Ms, "dbos_step_gap_p50_ms")
	figures := fmt.Sprintf("step gap p50 %.1f ms (DBOS %.1f)", gap, peer.StepGapP50Ms)
	if mode == "throughput" {
		b.ReportMetric(ours.wfPerS, "wf/s")
		b.ReportMetric(peer.WorkflowsPerS, "dbos_wf/s")
		b.ReportMetric(ours.wfPerS/peer.WorkflowsPerS, "wf/dbos")
		figures = fmt.Sprintf("%.0f workflows/s (DBOS %.0f, %.0f steps/s), wf/dbos %.2f; %s",
			ours.wfPerS, peer.WorkflowsPerS, peer.StepsPerS, ours.wfPerS/peer.WorkflowsPerS, figures)
	} else {
		p50, p99 := benchMs(ours.lat, .5), benchMs(ours.lat, .99)
		b.ReportMetric(p50, "p50_ms")
		b.ReportMetric(p99, "p99_ms")
		b.ReportMetric(peer.P50Ms, "dbos_p50_ms")
		b.ReportMetric(peer.P99Ms, "dbos_p99_ms")
		figures = fmt.Sprintf("start to last step committed p50 %.1f p99 %.1f max %.1f ms (DBOS %.1f, %.1f, %.1f); %s",
			p50, p99, benchMs(ours.lat, 1), peer.P50Ms, peer.P99Ms, peer.MaxMs, figures)
	}
	cpu := "CPU per workflow unknown (the server is not on this machine)"
	if ours.pgMs >= 0 && peer.PgCPUMsPerWf >= 0 {
		o, d := ours.goMs+ours.pgMs, peer.GoCPUMsPerWf+peer.PgCPUMsPerWf
		b.ReportMetric(o, "cpu_ms/wf")
		b.ReportMetric(d, "dbos_cpu_ms/wf")
		b.ReportMetric(o/d, "cpu/dbos_cpu")
		cpu = fmt.Sprintf("CPU per workflow (process + server): ours %.2f + %.2f ms, DBOS %.2f + %.2f ms", ours.goMs, ours.pgMs, peer.GoCPUMsPerWf, peer.PgCPUMsPerWf)
	}
	how := "in process"
	if queue {
		how = "through a DBOS queue polled every " + config.DefaultPollInterval.String()
	}
	b.Logf("%s, n=%d (after %d warm-up), ours at poll %s, 16 shards x %d workers, DBOS (steps %s) %s, pools of %d: %s; %s",
		mode, b.N, benchWarmup, config.DefaultPollInterval, benchWorkersPerShard, peer.Step, how, benchStepsConns, figures, cpu)
	if testing.Verbose() {
		benchStepBreakdown(b, ours.runs, jobs.WorkflowStepKind, "workflow_id", ours.ids)
	}
}

// benchVsOursStart starts our side of a sub-benchmark: a fresh database with
// bench_wf_steps, a record of the last steps' commits and a runtime at
// config.DefaultPollInterval; start starts workflow id in its own transaction.
func benchVsOursStart(b *testing.B) (db *pgtest.DB, l *benchListener, start func(id string) error) {
	db = pgtest.New(b, pgtest.Options{MaxConns: int32(benchStepsConns)})
	db.MustExec(b, benchStepDDL)
	l = benchListen()
	wf := benchStepsWorkflow("bench_vs_dbos", l.done)
	reg := workers.NewRegistry()
	require.NoError(b, addWorkflow(reg, wf))
	workertest.Start(b, db.Pool, reg, benchOpts(config.DefaultPollInterval))
	return db, l, func(id string) error {
		return pg.InTx(context.Background(), db.Pool, func(ctx context.Context, tx pgx.Tx) error {
			_, err := wf.StartTx(ctx, tx, struct{}{}, &workflow.StartOpts{ID: id})
			return err
		})
	}
}

func benchVsOursThroughput(b *testing.B) benchVsOurs {
	db, l, start := benchVsOursStart(b)
	require.NoError(b, benchCallers(benchWarmup, func(i int) error { return start(fmt.Sprintf("w%d", i)) }))
	benchWaitCount(b, "warm-up workflows finished", benchWarmup, l.count)

	ids := make([]string, b.N)
	for i := range ids {
		ids[i] = fmt.Sprintf("t%d", i)
	}
	committed := make([]time.Time, b.N)
	go0, pg0 := benchProcessCPU(), benchServerCPU(b, db)
	b.StartTimer()
	begin := time.Now()
	require.NoError(b, benchCallers(b.N, func(i int) error {
		err := start(ids[i])
		committed[i] = time.Now()
		return err
	}))
	benchWaitCount(b, "workflows finished", benchWarmup+b.N, l.count)
	b.StopTimer()
	ours := benchVsOursEnd(b, db, l, ids, committed, go0, pg0)
	var last time.Time
	for _, id := range ids {
		at, _ := l.get(id)
		if at.After(last) {
			last = at
		}
	}
	ours.wfPerS = float64(b.N) / last.Sub(begin).Seconds()
	return ours
}

func benchVsOursLatency(b *testing.B) benchVsOurs {
	db, l, start := benchVsOursStart(b)
	total := benchWarmup + b.N
	ids := make([]string, total)
	for i := range ids {
		ids[i] = fmt.Sprintf("l%d", i)
	}
	committed := make([]time.Time, total)
	paced := func(lo int) func(i int) error {
		return func(i int) error {
			err := start(ids[lo+i])
			committed[lo+i] = time.Now()
			return err
		}
	}
	// The warm-up, then the measured starts at the same pace (two calls, so
	// that the CPU is read between them, on this goroutine).
	_, err := benchPaced(b, benchWarmup, paced(0))
	require.NoError(b, err)
	go0, pg0 := benchProcessCPU(), benchServerCPU(b, db)
	b.StartTimer()
	_, err = benchPaced(b, b.N, paced(benchWarmup))
	require.NoError(b, err)
	benchWaitCount(b, "workflows finished", total, l.count)
	b.StopTimer()
	return benchVsOursEnd(b, db, l, ids[benchWarmup:], committed[benchWarmup:], go0, pg0)
}

// benchVsOursEnd reads our figures at the end of the measured part: the CPU
// since go0 and pg0, and, for the workflows ids started at committed, their
// latencies and step gaps.
func benchVsOursEnd(b *testing.B, db *pgtest.DB, l *benchListener, ids []string, committed []time.Time, go0 float64, pg0 map[int]float64) benchVsOurs {
	n := float64(len(ids))
	ours := benchVsOurs{goMs: 1000 * (benchProcessCPU() - go0) / n, pgMs: -1, runs: db, ids: ids}
	if pg1 := benchServerCPU(b, db); pg0 != nil && pg1 != nil {
		var s float64
		for pid, t := range pg1 {
			s += t - pg0[pid] // a backend that is new counts from zero
		}
		ours.pgMs = 1000 * s / n
	}
	for i, id := range ids {
		at, ok := l.get(id)
		require.True(b, ok, id)
		ours.lat = append(ours.lat, at.Sub(committed[i]))
	}
	require.Equal(b, benchWarmup+len(ids), db.MustCount(b, `SELECT count(*) FROM compute_workflows WHERE status = 'completed'`))
	require.Equal(b, 3*len(ids), db.MustCount(b, `SELECT count(*) FROM bench_wf_steps WHERE id = ANY($1)`, ids), "every step writes exactly one row")
	ours.gaps = benchStepGaps(b, db, ids)
	return ours
}

// benchCallers calls f(i) for i in [0, n) on benchSessions goroutines, each
// taking the next i as soon as its call returned, and returns the first error.
func benchCallers(n int, f func(i int) error) error {
	var (
		next  atomic.Int64
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	for c := 0; c < benchSessions; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				if err := f(i); err != nil {
					once.Do(func() { first = err })
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}

// benchStepGaps returns the gaps between the rows of bench_wf_steps of each
// workflow's consecutive steps (their clock_timestamp()), for the workflows ids
// (all when nil).
func benchStepGaps(b *testing.B, db *pgtest.DB, ids []string) []time.Duration {
	rows, err := db.Query(context.Background(), `SELECT gap FROM (
		SELECT extract(epoch FROM at - lag(at) OVER (PARTITION BY id ORDER BY step))::float8 AS gap
		FROM bench_wf_steps WHERE $1::text[] IS NULL OR id = ANY($1)) g
	WHERE gap IS NOT NULL`, ids)
	require.NoError(b, err)
	secs, err := pgx.CollectRows(rows, pgx.RowTo[float64])
	require.NoError(b, err)
	gaps := make([]time.Duration, len(secs))
	for i, s := range secs {
		gaps[i] = time.Duration(s * float64(time.Second))
	}
	return gaps
}

// benchBuildDBOSPeer builds testdata/peers/dbos (a module of its own: DBOS is
// not in our go.mod) into b's temporary directory, and returns the binary.
func benchBuildDBOSPeer(b *testing.B) string {
	dir, err := filepath.Abs(filepath.Join("..", "..", "testdata", "peers", "dbos"))
	require.NoError(b, err)
	bin := filepath.Join(b.TempDir(), "dbospeer")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("go build of the DBOS peer in %s: %v\n%s", dir, err, out)
	}
	return bin
}

// benchRunDBOSPeer runs the DBOS peer on the database at url and returns its
// figures.
func benchRunDBOSPeer(b *testing.B, bin, url string, args []string) benchDBOSPeer {
	ctx, cancel := context.WithTimeout(context.Background(), benchTimeout+time.Minute)
	defer cancel()
	args = append([]string{"-url", url, "-timeout", benchTimeout.String()}, args...)
	cmd := exec.CommandContext(ctx, bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		b.Fatalf("dbospeer %s: %v\n%s", strings.Join(args[2:], " "), err, stderr.String())
	}
	if stderr.Len() > 0 {
		b.Logf("dbospeer's log:\n%s", stderr.String())
	}
	var peer benchDBOSPeer
	line := strings.TrimSpace(stdout.String())
	require.NoError(b, json.Unmarshal([]byte(line), &peer), "dbospeer's output: %q", line)
	return peer
}
