package workers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/embedded"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/logging"
	"github.com/bettercompute/bettercompute/platform/migrate"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

// The offered load and the settings both sides share.
const (
	pickupRate     = 120 // jobs/s, one producer
	pickupWorkers  = 8
	pickupPoll     = 50 * time.Millisecond
	pickupWarmup   = time.Second
	pickupRiverQ   = "pickup_river"
	pickupDoneDDL  = `CREATE TABLE IF NOT EXISTS pickup_done (job_id bigint NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())`
	pickupDoneStmt = `INSERT INTO pickup_done (job_id) VALUES ($1)`
)

// pickupArgs carries the producer's clock at insert time; both kinds share it.
type pickupArgs struct {
	InsertedNs int64 `json:"t"`
}

type riverPickupArgs pickupArgs

func (riverPickupArgs) Kind() string { return "pickup_river" }

type oursPickupArgs pickupArgs

func (oursPickupArgs) Kind() string { return "pickup_ours" }

// BenchmarkPickup measures steady-state pickup latency (insert → the worker's
// Work starts) of raw River and of our Runtime, in one run on one database
// behind a real PgBouncer in transaction mode, both poll-only every 50 ms
// (FetchCooldown 50 ms on both, as the Runtime sets it), 8 workers each, under
// 120 jobs/s from one producer (pg.InTx + jobs.InsertTx on the PgBouncer pool,
// the same path for both sides). River's job sleeps 1 ms; ours sleeps 1 ms and
// inserts its id into a table in the fenced transaction (workers.InTx). The
// first second of each side is warm-up. River runs first, then ours, each with
// its own queue, each stopped before the next starts; it reports p50/p99 in ms
// and ours/river ratios, and checks that every job of ours ran and wrote exactly
// once. Ours is workers.Start with the production lease timings. It also logs
// each side's breakdown: the insert call, insert → fetched (the job's
// attempted_at) and fetched → Work. BETTER_COMPUTE_PICKUP_SECONDS sets each
// side's load duration (default 15).
//
//	go test -run '^$' -bench 'Pickup$' -benchtime 1x -timeout 20m ./workers/
//
// (-bench Pickup runs BenchmarkPickupPostgresRestart too.)
func BenchmarkPickup(b *testing.B) {
	d := envDuration(b, "BETTER_COMPUTE_PICKUP_SECONDS", 15*time.Second)
	var riverS, oursS []pickupSample
	for i := 0; i < b.N; i++ {
		db := pgtest.New(b, pgtest.Options{MaxConns: 10})
		bouncer := pgtest.StartPgBouncer(b, db)
		via, err := pg.Open(context.Background(), pg.Options{URL: bouncer.URL, MaxConns: 20})
		require.NoError(b, err)
		db.MustExec(b, pickupDoneDDL)

		r := runRiverPickup(b, via, d)
		o := runOursPickup(b, via, d)
		riverS, oursS = append(riverS, r...), append(oursS, o...)
		via.Close()
		require.False(b, bouncer.Exited(), "PgBouncer died: %s", bouncer.Log())
	}
	rl, ol := latencies(riverS), latencies(oursS)
	rp50, rp99 := ms(percentile(rl, 0.50)), ms(percentile(rl, 0.99))
	op50, op99 := ms(percentile(ol, 0.50)), ms(percentile(ol, 0.99))
	b.ReportMetric(rp50, "river_p50_ms")
	b.ReportMetric(rp99, "river_p99_ms")
	b.ReportMetric(op50, "ours_p50_ms")
	b.ReportMetric(op99, "ours_p99_ms")
	b.ReportMetric(op50/rp50, "ours/river_p50")
	b.ReportMetric(op99/rp99, "ours/river_p99")
	b.Logf("pickup at %d jobs/s behind PgBouncer, poll %s, %d workers: river p50 %.1f ms p99 %.1f ms (n=%d); ours p50 %.1f ms p99 %.1f ms (n=%d); ours/river p50 %.2f p99 %.2f",
		pickupRate, pickupPoll, pickupWorkers, rp50, rp99, len(rl), op50, op99, len(ol), op50/rp50, op99/rp99)
	for _, side := range []struct {
		name string
		s    []pickupSample
	}{{"river", riverS}, {"ours", oursS}} {
		ins, fetch, start := breakdown(side.s)
		b.Logf("  %-5s breakdown p50/p99 ms: insert call %.1f/%.1f, insert→fetched (attempted_at) %.1f/%.1f, fetched→Work %.1f/%.1f",
			side.name, ms(percentile(ins, .5)), ms(percentile(ins, .99)), ms(percentile(fetch, .5)), ms(percentile(fetch, .99)),
			ms(percentile(start, .5)), ms(percentile(start, .99)))
	}
}

// pickupSample is one job's pickup: when it was inserted (args), when the
// insert call returned, when River fetched it (attempted_at), and when Work
// started (of the attempt that completed it).
type pickupSample struct {
	id       int64
	inserted time.Time
	returned time.Time
	fetched  time.Time
	start    time.Time
	firstAt  time.Time // Work start of the job's first attempt
	attempts int
}

func (s pickupSample) latency() time.Duration { return s.start.Sub(s.inserted) }

// pickupRecorder collects the workers' observations.
type pickupRecorder struct {
	mu       sync.Mutex
	first    map[int64]time.Time
	attempts map[int64]int
	done     map[int64]pickupSample
	outcomes []attemptOutcome
}

type attemptOutcome struct {
	at      time.Time
	outcome string
}

func newPickupRecorder() *pickupRecorder {
	return &pickupRecorder{first: map[int64]time.Time{}, attempts: map[int64]int{}, done: map[int64]pickupSample{}}
}

func (r *pickupRecorder) started(id int64, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.first[id]; !ok {
		r.first[id] = at
	}
	r.attempts[id]++
}

func (r *pickupRecorder) finished(id int64, insertedNs int64, fetched, start time.Time, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := "completed"
	switch {
	case err == nil:
	case fault.Has(err, fault.Fenced):
		out = "fenced: " + truncate(err.Error(), 120)
	default:
		out = "error: " + truncate(err.Error(), 120)
	}
	r.outcomes = append(r.outcomes, attemptOutcome{at: start, outcome: out})
	if err == nil {
		r.done[id] = pickupSample{id: id, inserted: time.Unix(0, insertedNs), fetched: fetched, start: start}
	}
}

func (r *pickupRecorder) doneCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.done)
}

// samples joins the recorder's completions with the producer's inserts.
func (r *pickupRecorder) samples(p *producerResult) []pickupSample {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []pickupSample
	for _, in := range p.ok {
		s, ok := r.done[in.id]
		if !ok {
			continue
		}
		s.returned = in.returned
		s.firstAt = r.first[in.id]
		s.attempts = r.attempts[in.id]
		out = append(out, s)
	}
	return out
}

type riverPickupWorker struct {
	river.WorkerDefaults[riverPickupArgs]
	rec *pickupRecorder
}

func (w *riverPickupWorker) Work(ctx context.Context, job *river.Job[riverPickupArgs]) error {
	start := time.Now()
	w.rec.started(job.ID, start)
	time.Sleep(time.Millisecond)
	w.rec.finished(job.ID, job.Args.InsertedNs, attemptedAt(job.AttemptedAt), start, nil)
	return nil
}

type oursPickupWorker struct {
	river.WorkerDefaults[oursPickupArgs]
	rec *pickupRecorder
}

func (w *oursPickupWorker) Work(ctx context.Context, job *river.Job[oursPickupArgs]) error {
	start := time.Now()
	w.rec.started(job.ID, start)
	time.Sleep(time.Millisecond)
	err := workers.InTx(ctx, job, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, pickupDoneStmt, job.ID)
		return err
	})
	w.rec.finished(job.ID, job.Args.InsertedNs, attemptedAt(job.AttemptedAt), start, err)
	return err
}

func attemptedAt(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}

// runRiverPickup runs raw River on the PgBouncer pool for d under the load and
// returns the samples after the warm-up.
func runRiverPickup(b *testing.B, via *pg.Pool, d time.Duration) []pickupSample {
	ctx := context.Background()
	rec := newPickupRecorder()
	ws := river.NewWorkers()
	river.AddWorker(ws, &riverPickupWorker{rec: rec})
	logs := &logCollector{}
	client, err := river.NewClient(riverpgxv5.New(via.Pool), &river.Config{
		Queues:            map[string]river.QueueConfig{pickupRiverQ: {MaxWorkers: pickupWorkers}},
		Workers:           ws,
		PollOnly:          true,
		FetchPollInterval: pickupPoll,
		FetchCooldown:     min(pickupPoll, 100*time.Millisecond), // as workers.Start sets it
		Logger:            logging.Slog(logs.logger(zerolog.WarnLevel)),
	})
	require.NoError(b, err)
	require.NoError(b, client.Start(ctx))
	p := produce(ctx, via, pickupRiverQ, func(ns int64) river.JobArgs { return riverPickupArgs{InsertedNs: ns} }, d, 5*time.Second)
	require.Zero(b, len(p.failed), "river side: inserts failed")
	workertest.WaitFor(b, time.Minute, "river side: every job ran", func() bool { return rec.doneCount() >= len(p.ok) })
	require.NoError(b, client.Stop(ctx))
	logs.report(b, "river side", time.Time{})
	return afterWarmup(rec.samples(p), p.started)
}

// startOursPickup starts our Runtime on shard 0 with the pickup worker, logging
// at level into a collector, and waits until it holds the shard; the caller stops it.
func startOursPickup(b *testing.B, pool *pg.Pool, level zerolog.Level) (*workers.Runtime, *pickupRecorder, *logCollector) {
	rec := newPickupRecorder()
	reg := workers.NewRegistry()
	workers.AddWorker(reg, &oursPickupWorker{rec: rec})
	logs := &logCollector{}
	rt, err := workers.Start(context.Background(), workers.Options{Pool: pool, Registry: reg, Shards: []int{0}, WorkersPerShard: pickupWorkers,
		PollInterval: pickupPoll, Work: true, Log: logs.logger(level)})
	require.NoError(b, err)
	workertest.WaitFor(b, 30*time.Second, "shard 0 held", func() bool { return slices.Equal(rt.HeldShards(), []int{0}) })
	return rt, rec, logs
}

// runOursPickup runs our Runtime (shard 0, production lease timings) on the
// PgBouncer pool for d under the load, checks every job wrote exactly once, and
// returns the samples after the warm-up.
func runOursPickup(b *testing.B, via *pg.Pool, d time.Duration) []pickupSample {
	ctx := context.Background()
	rt, rec, logs := startOursPickup(b, via, zerolog.WarnLevel)
	stopped := false
	defer func() {
		if !stopped {
			_ = rt.Stop(ctx)
		}
	}()
	queue := jobs.ShardQueue(0)
	p := produce(ctx, via, queue, func(ns int64) river.JobArgs { return oursPickupArgs{InsertedNs: ns} }, d, 5*time.Second)
	require.Zero(b, len(p.failed), "ours: inserts failed")
	workertest.WaitFor(b, time.Minute, "ours: every job ran", func() bool { return rec.doneCount() >= len(p.ok) })
	require.NoError(b, rt.Stop(ctx))
	stopped = true
	requireWrittenOnce(b, via, p)
	logs.report(b, "ours", time.Time{})
	return afterWarmup(rec.samples(p), p.started)
}

// requireWrittenOnce checks that every job the producer inserted completed and
// recorded its write exactly once, and that no job wrote twice.
func requireWrittenOnce(b *testing.B, db *pg.Pool, p *producerResult) {
	b.Helper()
	ctx := context.Background()
	ids := make([]int64, len(p.ok))
	for i, in := range p.ok {
		ids[i] = in.id
	}
	var notOnce, notCompleted, dup int
	require.NoError(b, db.QueryRow(ctx, `SELECT count(*) FROM unnest($1::bigint[]) AS i(id)
WHERE (SELECT count(*) FROM pickup_done d WHERE d.job_id = i.id) <> 1`, ids).Scan(&notOnce))
	require.NoError(b, db.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE id = ANY($1) AND state <> 'completed'`, ids).Scan(&notCompleted))
	require.NoError(b, db.QueryRow(ctx, `SELECT count(*) FROM (SELECT job_id FROM pickup_done GROUP BY job_id HAVING count(*) > 1) x`).Scan(&dup))
	require.Zero(b, notOnce, "jobs whose fenced write is missing or repeated (of %d inserted)", len(ids))
	require.Zero(b, notCompleted, "jobs not completed (of %d inserted)", len(ids))
	require.Zero(b, dup, "jobs that wrote more than once")
}

// producerResult is what one producer run inserted.
type producerResult struct {
	mu      sync.Mutex
	started time.Time
	ok      []inserted
	failed  []time.Time // ticks whose insert failed
	ticks   int
}

type inserted struct {
	id       int64
	at       time.Time // the time in the args
	returned time.Time
}

// produce inserts one job per tick at pickupRate for d (or until ctx is done),
// with a timeout of perInsert for each insert, and returns what it inserted.
func produce(ctx context.Context, db *pg.Pool, queue string, mk func(ns int64) river.JobArgs, d, perInsert time.Duration) *producerResult {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return produceUntil(ctx, db, queue, mk, perInsert)
}

func produceUntil(ctx context.Context, db *pg.Pool, queue string, mk func(ns int64) river.JobArgs, perInsert time.Duration) *producerResult {
	p := &producerResult{started: time.Now()}
	tick := time.NewTicker(time.Second / pickupRate)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return p
		case <-tick.C:
		}
		at := time.Now()
		ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), perInsert)
		var id int64
		err := pg.InTx(ictx, db, func(ctx context.Context, tx pgx.Tx) error {
			res, err := jobs.InsertTx(ictx, tx, mk(at.UnixNano()), &river.InsertOpts{Queue: queue})
			if err == nil {
				id = res.Job.ID
			}
			return err
		})
		cancel()
		p.mu.Lock()
		p.ticks++
		if err != nil {
			p.failed = append(p.failed, at)
		} else {
			p.ok = append(p.ok, inserted{id: id, at: at, returned: time.Now()})
		}
		p.mu.Unlock()
	}
}

func afterWarmup(s []pickupSample, started time.Time) []pickupSample {
	out := s[:0:0]
	for _, x := range s {
		if x.inserted.Sub(started) >= pickupWarmup {
			out = append(out, x)
		}
	}
	return out
}

func latencies(s []pickupSample) []time.Duration {
	out := make([]time.Duration, len(s))
	for i, x := range s {
		out[i] = x.latency()
	}
	return out
}

// breakdown splits the pickup latency: the insert call, insert → fetched
// (River's attempted_at, the database clock of the same host), and fetched →
// Work.
func breakdown(s []pickupSample) (ins, fetch, start []time.Duration) {
	for _, x := range s {
		ins = append(ins, x.returned.Sub(x.inserted))
		if !x.fetched.IsZero() {
			fetch = append(fetch, x.fetched.Sub(x.inserted))
			start = append(start, x.start.Sub(x.fetched))
		}
	}
	return ins, fetch, start
}

// percentile is the nearest-rank q-quantile of d (0 for none).
func percentile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// envDuration reads a duration from name: seconds ("25", "2.5") or a Go
// duration ("25s", "500ms").
func envDuration(b *testing.B, name string, def time.Duration) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	if f, err := strconv.ParseFloat(v, 64); err == nil {
		return time.Duration(f * float64(time.Second))
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		b.Fatalf("%s=%q: want seconds or a duration", name, v)
	}
	return d
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// restartScenario is one way the server goes away.
type restartScenario struct {
	name      string
	immediate bool
	down      time.Duration
}

// BenchmarkPickupPostgresRestart measures our Runtime's pickup latency before,
// during and after a PostgreSQL restart under 120 jobs/s, on a private embedded
// cluster (not the shared test cluster; Fast, but with synchronous_commit on so
// that an immediate shutdown loses no acknowledged commit) with a direct pool
// (no PgBouncer). Sub-benchmarks: fast (fast shutdown, start again at once),
// immediate (immediate shutdown, start again at once) and down25s (fast
// shutdown, down 25 s; BETTER_COMPUTE_PG_DOWN, seconds or a duration, changes
// the down time). The Runtime uses the production lease timings (TTL 15 s,
// renewal 5 s). The producer keeps inserting through the outage (each insert
// with a 250 ms timeout; failures are counted). Latency is the Work start of
// the attempt that completed the job minus its insert time (the first
// attempt's is shown too).
//
// The testing package cuts a benchmark's log to 10 lines, so the tables go to
// stdout: per second of insert time relative to the moment the server accepted
// connections again (t=0), p50/p99 for the 10 s before the stop and 30 s after,
// with the pool's connection attempts and the queue's backlog per wall-clock
// second; the attempts that failed; a grouped log of the Runtime and River; and
// the jobs' attempt and error history. It reports before_p99_ms,
// after5s_p99_ms (jobs inserted from t=5 s on), peak_p99_ms,
// recovered_after_s (the first second from which every bucket's p99 is within
// 1.5× the before p99, -1 if none) and failed_inserts, and checks that every
// inserted job ran and recorded its fenced write exactly once.
//
//	go test -run '^$' -bench 'PickupPostgresRestart' -benchtime 1x -timeout 20m ./workers/
//	BETTER_COMPUTE_PG_DOWN=5 go test -run '^$' -bench 'PickupPostgresRestart/down' -benchtime 1x ./workers/
func BenchmarkPickupPostgresRestart(b *testing.B) {
	down := envDuration(b, "BETTER_COMPUTE_PG_DOWN", 25*time.Second)
	for _, sc := range []restartScenario{
		{name: "fast"},
		{name: "immediate", immediate: true},
		{name: "down25s", down: down},
	} {
		b.Run(sc.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				runRestart(b, sc)
			}
		})
	}
}

const (
	restartBefore    = 10 * time.Second
	restartAfter     = 30 * time.Second
	restartWarmup    = 5 * time.Second
	restartInsertTO  = 250 * time.Millisecond
	restartDrain     = 60 * time.Second
	restartRecovered = 1.5
)

// wallSample is what the monitor saw in one wall-clock second.
type wallSample struct {
	at                 time.Time
	newConns           int64
	totalConns         int32
	available, running int
	monitorErr         bool
}

func runRestart(b *testing.B, sc restartScenario) {
	ctx := context.Background()
	// Fast, but with synchronous commit: Fast turns it off, and an immediate
	// shutdown then loses commits the server had acknowledged (up to the WAL
	// writer's delay), which the exactly-once check would count as lost jobs.
	// fsync stays off: the server process dies, not the machine.
	opts := embedded.Options{Fast: true, Settings: map[string]string{"synchronous_commit": "on"}}
	cluster, err := embedded.Start(ctx, opts)
	require.NoError(b, err)
	defer func() { _ = cluster.Stop() }()
	pool, err := pg.Open(ctx, pg.Options{URL: cluster.URL(), MaxConns: 20})
	require.NoError(b, err)
	defer pool.Close()
	set, err := migrate.Builtin()
	require.NoError(b, err)
	require.NoError(b, migrate.EnsureExtensions(ctx, pool))
	_, err = set.Apply(ctx, pool, nil)
	require.NoError(b, err)
	_, err = migrate.InitSettings(ctx, pool, pgtest.DefaultShardCount)
	require.NoError(b, err)
	_, err = pool.Exec(ctx, pickupDoneDDL)
	require.NoError(b, err)

	rt, rec, logs := startOursPickup(b, pool, zerolog.InfoLevel)
	stopped := false
	defer func() {
		if !stopped {
			_ = rt.Stop(ctx)
		}
	}()

	// The monitor samples the pool and the queue's backlog every second, on a
	// connection of its own.
	monCtx, monStop := context.WithCancel(ctx)
	var monWG sync.WaitGroup
	var wall []wallSample
	monWG.Add(1)
	go func() {
		defer monWG.Done()
		wall = monitor(monCtx, cluster.URL(), pool)
	}()

	queue := jobs.ShardQueue(0)
	prodCtx, prodStop := context.WithCancel(ctx)
	resCh := make(chan *producerResult, 1)
	go func() {
		resCh <- produceUntil(prodCtx, pool, queue, func(ns int64) river.JobArgs { return oursPickupArgs{InsertedNs: ns} }, restartInsertTO)
	}()

	time.Sleep(restartWarmup + restartBefore)
	stopAt := time.Now()
	require.NoError(b, cluster.Halt(sc.immediate))
	haltedAt := time.Now()
	time.Sleep(sc.down)
	require.NoError(b, cluster.Resume(ctx, opts))
	upAt := time.Now()
	time.Sleep(restartAfter)
	prodStop()
	p := <-resCh
	endAt := time.Now()

	// Drain: every job in the queue completes (also any whose insert timed out
	// on our side but committed).
	drainErr := waitFor(restartDrain, func() bool {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE kind = 'pickup_ours' AND state <> 'completed'`).Scan(&n)
		return err == nil && n == 0 && rec.doneCount() >= len(p.ok)
	})
	drainedAt := time.Now()
	monStop()
	monWG.Wait()

	b.Logf("%s: stop at %s (t=%+.3fs), halt took %s, accepting connections again at t=0 (%s after the stop, %s after the halt); load stopped at t=%+.3fs; drained %.1fs after the load stopped%s",
		sc.name, stopAt.Format("15:04:05.000"), stopAt.Sub(upAt).Seconds(), haltedAt.Sub(stopAt).Round(time.Millisecond),
		upAt.Sub(stopAt).Round(time.Millisecond), upAt.Sub(haltedAt).Round(time.Millisecond), endAt.Sub(upAt).Seconds(),
		drainedAt.Sub(endAt).Seconds(), map[bool]string{true: "", false: " (NOT DRAINED)"}[drainErr == nil])
	reportRestart(b, sc, rec, p, wall, stopAt, upAt, endAt)
	logs.report(b, sc.name, upAt)
	reportJobHistory(b, pool)

	if drainErr != nil {
		ids := make([]int64, len(p.ok))
		for i, in := range p.ok {
			ids[i] = in.id
		}
		var missing, pending int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM unnest($1::bigint[]) i(id) WHERE NOT EXISTS (SELECT 1 FROM river_job j WHERE j.id = i.id)`, ids).Scan(&missing)
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE kind = 'pickup_ours' AND state <> 'completed'`).Scan(&pending)
		b.Fatalf("%s: the backlog did not drain within %s: %d jobs not completed, %d acknowledged inserts missing from river_job, %d of %d done",
			sc.name, restartDrain, pending, missing, rec.doneCount(), len(p.ok))
	}
	require.NoError(b, rt.Stop(ctx))
	stopped = true
	requireWrittenOnce(b, pool, p)
}

func waitFor(timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s", timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

// monitor samples, every second until ctx is done, the pool's connection
// attempts (pgxpool's NewConnsCount counts every dial, failed ones too)
// and the queue's available and running jobs (on its own connection, with a
// short timeout, so the outage shows as errors).
func monitor(ctx context.Context, url string, pool *pg.Pool) []wallSample {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil
	}
	cfg.MaxConns = 1
	cfg.ConnConfig.ConnectTimeout = 300 * time.Millisecond
	mon, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil
	}
	defer mon.Close()
	var out []wallSample
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		st := pool.Stat()
		s := wallSample{at: time.Now(), newConns: st.NewConnsCount(), totalConns: st.TotalConns()}
		qctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		err := mon.QueryRow(qctx, `SELECT count(*) FILTER (WHERE state = 'available'), count(*) FILTER (WHERE state = 'running')
FROM river_job WHERE queue = 'shard_0' AND state IN ('available', 'running')`).Scan(&s.available, &s.running)
		cancel()
		s.monitorErr = err != nil
		out = append(out, s)
		select {
		case <-ctx.Done():
			return out
		case <-tick.C:
		}
	}
}

// reportRestart logs the per-second table and reports the metrics.
func reportRestart(b *testing.B, sc restartScenario, rec *pickupRecorder, p *producerResult, wall []wallSample, stopAt, upAt, endAt time.Time) {
	samples := rec.samples(p)
	bucket := func(t time.Time) int { return int(math.Floor(t.Sub(upAt).Seconds())) }
	type row struct {
		lat, first []time.Duration
		retried    int
		failed     int
	}
	rows := map[int]*row{}
	get := func(k int) *row {
		if rows[k] == nil {
			rows[k] = &row{}
		}
		return rows[k]
	}
	var before, after5, afterAll []time.Duration
	for _, s := range samples {
		r := get(bucket(s.inserted))
		r.lat = append(r.lat, s.latency())
		r.first = append(r.first, s.firstAt.Sub(s.inserted))
		if s.attempts > 1 {
			r.retried++
		}
		switch {
		case s.inserted.Before(stopAt) && !s.inserted.Before(stopAt.Add(-restartBefore)):
			before = append(before, s.latency())
		case !s.inserted.Before(upAt.Add(5 * time.Second)):
			after5 = append(after5, s.latency())
		}
		if !s.inserted.Before(stopAt) {
			afterAll = append(afterAll, s.latency())
		}
	}
	for _, f := range p.failed {
		get(bucket(f)).failed++
	}
	// Wall-clock monitor rows, by the same seconds.
	type wrow struct {
		newConns        int64
		avail, run      int
		monErr, sampled bool
	}
	wrows := map[int]wrow{}
	for i, w := range wall {
		k := bucket(w.at)
		var d int64
		if i > 0 {
			d = w.newConns - wall[i-1].newConns
		}
		prev := wrows[k]
		wrows[k] = wrow{newConns: prev.newConns + d, avail: w.available, run: w.running, monErr: w.monitorErr, sampled: true}
	}

	beforeP99 := percentile(before, 0.99)
	firstK, lastK := bucket(stopAt.Add(-restartBefore)), bucket(endAt)
	stopK := bucket(stopAt)
	var tb strings.Builder
	fmt.Fprintf(&tb, "%s: pickup latency by second of insert, relative to the server accepting connections again (t=0); failed = inserts that failed; dials = the pool's connection attempts, avail/run = shard_0 jobs, in that wall-clock second\n", sc.name)
	fmt.Fprintf(&tb, "%6s %5s %6s %8s %8s %8s %10s %8s | %6s %6s %5s\n", "t(s)", "ok", "failed", "p50ms", "p99ms", "maxms", "1st_p99ms", "retried", "dials", "avail", "run")
	peak := time.Duration(0)
	line := func(label string, r *row, w wrow) {
		if r == nil {
			r = &row{}
		}
		mon := fmt.Sprintf("%6d %6d %5d", w.newConns, w.avail, w.run)
		if !w.sampled {
			mon = fmt.Sprintf("%6s %6s %5s", "", "", "")
		} else if w.monErr {
			mon = fmt.Sprintf("%6d %6s %5s", w.newConns, "down", "")
		}
		fmt.Fprintf(&tb, "%6s %5d %6d %8.1f %8.1f %8.1f %10.1f %8d | %s\n", label, len(r.lat), r.failed,
			ms(percentile(r.lat, .5)), ms(percentile(r.lat, .99)), ms(percentile(r.lat, 1)), ms(percentile(r.first, .99)), r.retried, mon)
	}
	for k := firstK; k <= lastK; k++ {
		if k >= stopK+2 && k <= -2 {
			// The middle of a long outage, in one line.
			if k > stopK+2 {
				continue
			}
			agg := &row{}
			var w wrow
			for j := stopK + 2; j <= -2; j++ {
				if r := rows[j]; r != nil {
					agg.lat = append(agg.lat, r.lat...)
					agg.first = append(agg.first, r.first...)
					agg.retried += r.retried
					agg.failed += r.failed
				}
				if x, ok := wrows[j]; ok {
					w.newConns += x.newConns
					w.sampled, w.monErr = true, w.monErr || x.monErr
				}
			}
			peak = max(peak, percentile(agg.lat, .99))
			line(fmt.Sprintf("%d..%d", stopK+2, -2), agg, w)
			continue
		}
		if r := rows[k]; r != nil && k >= stopK {
			peak = max(peak, percentile(r.lat, .99))
		}
		line(strconv.Itoa(k), rows[k], wrows[k])
	}
	recovered := -1
	for s := 0; s < int(restartAfter/time.Second); s++ {
		ok := true
		for k := s; k < int(restartAfter/time.Second); k++ {
			if r := rows[k]; r != nil && len(r.lat) > 0 && float64(percentile(r.lat, .99)) > restartRecovered*float64(beforeP99) {
				ok = false
				break
			}
		}
		if ok {
			recovered = s
			break
		}
	}
	fmt.Fprintf(&tb, "inserted ok %d, failed %d; jobs retried (more than one Work) %d; p99 before %.1f ms, from stop on %.1f ms, after +5s %.1f ms; recovered after %d s",
		len(p.ok), len(p.failed), countRetried(samples), ms(beforeP99), ms(percentile(afterAll, .99)), ms(percentile(after5, .99)), recovered)
	logLong(b, tb.String())
	b.Logf("%s: inserted ok %d, failed %d; p99 before %.1f ms, after +5s %.1f ms, peak %.1f ms; recovered after %d s (table on stdout)",
		sc.name, len(p.ok), len(p.failed), ms(beforeP99), ms(percentile(after5, .99)), ms(peak), recovered)
	outcomes := map[string][2]time.Time{}
	counts := map[string]int{}
	rec.mu.Lock()
	for _, o := range rec.outcomes {
		if o.outcome == "completed" {
			continue
		}
		key := normalizeErr(o.outcome)
		v, ok := outcomes[key]
		if !ok {
			v[0] = o.at
		}
		v[1] = o.at
		outcomes[key] = v
		counts[key]++
	}
	rec.mu.Unlock()
	if len(outcomes) > 0 {
		var ob strings.Builder
		fmt.Fprintf(&ob, "%s: attempts that did not complete (Work start, relative to t=0):\n", sc.name)
		keys := make([]string, 0, len(outcomes))
		for k := range outcomes {
			keys = append(keys, k)
		}
		sort.Slice(keys, func(i, j int) bool { return outcomes[keys[i]][0].Before(outcomes[keys[j]][0]) })
		for _, k := range keys {
			fmt.Fprintf(&ob, "  %+7.3fs .. %+7.3fs  x%-4d %s\n", outcomes[k][0].Sub(upAt).Seconds(), outcomes[k][1].Sub(upAt).Seconds(), counts[k], k)
		}
		logLong(b, ob.String())
	}
	b.ReportMetric(ms(beforeP99), "before_p99_ms")
	b.ReportMetric(ms(percentile(after5, .99)), "after5s_p99_ms")
	b.ReportMetric(ms(peak), "peak_p99_ms")
	b.ReportMetric(float64(recovered), "recovered_after_s")
	b.ReportMetric(float64(len(p.failed)), "failed_inserts")
}

func countRetried(s []pickupSample) int {
	n := 0
	for _, x := range s {
		if x.attempts > 1 {
			n++
		}
	}
	return n
}

// reportJobHistory logs how the completed jobs got there: attempts, snoozes and
// the errors River recorded.
func reportJobHistory(b *testing.B, pool *pg.Pool) {
	ctx := context.Background()
	rows, err := pool.Query(ctx, `SELECT attempt, coalesce((metadata->>'snoozes')::int, 0), coalesce(array_length(errors, 1), 0), count(*)
FROM river_job WHERE kind = 'pickup_ours' GROUP BY 1, 2, 3 ORDER BY 1, 2, 3`)
	if err != nil {
		logLong(b, "job history: "+err.Error())
		return
	}
	var sb strings.Builder
	sb.WriteString("jobs by (attempt, snoozes, errors recorded): ")
	for rows.Next() {
		var a, s, e, n int
		if err := rows.Scan(&a, &s, &e, &n); err == nil {
			fmt.Fprintf(&sb, "(%d,%d,%d)=%d ", a, s, e, n)
		}
	}
	rows.Close()
	erows, err := pool.Query(ctx, `SELECT left(e->>'error', 140), count(*) FROM river_job, unnest(errors) e
WHERE kind = 'pickup_ours' GROUP BY 1 ORDER BY 2 DESC LIMIT 8`)
	if err == nil {
		for erows.Next() {
			var msg string
			var n int
			if err := erows.Scan(&msg, &n); err == nil {
				fmt.Fprintf(&sb, "\n  error x%d: %s", n, msg)
			}
		}
		erows.Close()
	}
	logLong(b, sb.String())
}

// logLong prints a multi-line report to stdout: the testing package cuts a
// benchmark's b.Log output to 10 lines.
func logLong(b *testing.B, s string) {
	fmt.Fprintf(os.Stdout, "=== %s\n%s\n", b.Name(), strings.TrimRight(s, "\n"))
}

// logCollector keeps a logger's JSON lines to report them condensed.
type logCollector struct {
	mu      sync.Mutex
	entries []logEntry
}

type logEntry struct {
	at     time.Time
	fields map[string]any
}

func (c *logCollector) logger(level zerolog.Level) zerolog.Logger {
	return zerolog.New(c).Level(level).With().Timestamp().Logger()
}

func (c *logCollector) Write(p []byte) (int, error) {
	var m map[string]any
	if err := json.Unmarshal(p, &m); err != nil {
		m = map[string]any{"message": string(p)}
	}
	c.mu.Lock()
	c.entries = append(c.entries, logEntry{at: time.Now(), fields: m})
	c.mu.Unlock()
	return len(p), nil
}

// report logs the collected lines grouped by level, component, message, lease
// and queue, with the first and last time relative to zero (absolute when zero
// is zero) and one example error.
func (c *logCollector) report(b *testing.B, name string, zero time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) == 0 {
		logLong(b, name+": no log lines at the collected level")
		return
	}
	type group struct {
		first, last time.Time
		n           int
		example     string
	}
	groups := map[string]*group{}
	var order []string
	str := func(m map[string]any, k string) string {
		if v, ok := m[k]; ok {
			return fmt.Sprint(v)
		}
		return ""
	}
	for _, e := range c.entries {
		m := e.fields
		key := fmt.Sprintf("%-5s %-9s %s", str(m, "level"), str(m, "component"), str(m, "message"))
		for _, k := range []string{"lease", "queue", "when"} {
			if v := str(m, k); v != "" {
				key += " " + k + "=" + v
			}
		}
		g := groups[key]
		if g == nil {
			g = &group{first: e.at}
			groups[key] = g
			order = append(order, key)
		}
		g.last = e.at
		g.n++
		if g.example == "" {
			for _, k := range []string{"error", "err"} {
				if v := str(m, k); v != "" {
					g.example = truncate(v, 160)
				}
			}
		}
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "%s: log (grouped; times relative to t=0):\n", name)
	for _, k := range order {
		g := groups[k]
		when := func(t time.Time) string {
			if zero.IsZero() {
				return t.Format("15:04:05.000")
			}
			return fmt.Sprintf("%+8.3fs", t.Sub(zero).Seconds())
		}
		fmt.Fprintf(&sb, "  %s .. %s x%-4d %s", when(g.first), when(g.last), g.n, k)
		if g.example != "" {
			fmt.Fprintf(&sb, " | %s", g.example)
		}
		sb.WriteString("\n")
	}
	logLong(b, sb.String())
}

// normalizeErr drops the numbers from an error so that errors group.
func normalizeErr(s string) string {
	var sb strings.Builder
	digits := false
	for _, r := range s {
		if r >= '0' && r <= '9' {
			if !digits {
				sb.WriteByte('N')
			}
			digits = true
			continue
		}
		digits = false
		sb.WriteRune(r)
	}
	return sb.String()
}
