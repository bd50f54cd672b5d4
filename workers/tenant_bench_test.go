package workers_test

import (
	"context"
	"fmt"
	"os"
	"sort"
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

// The tenancy module's benchmarks (issue 32): one tenant's backlog must not
// hold up another tenant's work (BenchmarkTenantFairness), and work that
// names no tenant must not pay for tenancy (BenchmarkTenantOverhead).

const (
	tenantRate    = 40                    // tenant B's units/s, one producer
	tenantPoll    = 50 * time.Millisecond // the runtime's poll interval
	tenantWork    = time.Millisecond      // each unit's work, in its fenced transaction
	tenantWarmup  = time.Second           // of each phase, not measured
	tenantSettle  = 2 * time.Second       // after A's backlog lands, before B's busy phase
	tenantDoneDDL = `CREATE TABLE tenant_done (id text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE INDEX tenant_done_id ON tenant_done (id text_pattern_ops)`
	tenantDoneSQL = `INSERT INTO tenant_done (id) VALUES ($1)`
)

// tenantRec records when each unit of tenant B (ids not starting with "a")
// first started its work, and counts the starts of tenant A's.
type tenantRec struct {
	mu      sync.Mutex
	start   map[string]time.Time
	fetched map[string]time.Time // River jobs: when River fetched them (attempted_at)
	aRuns   atomic.Int64
}

func newTenantRec() *tenantRec {
	return &tenantRec{start: map[string]time.Time{}, fetched: map[string]time.Time{}}
}

func (r *tenantRec) fetchedAt(id string, at *time.Time) {
	if at == nil || strings.HasPrefix(id, "a") {
		return
	}
	r.mu.Lock()
	if _, ok := r.fetched[id]; !ok {
		r.fetched[id] = *at
	}
	r.mu.Unlock()
}

func (r *tenantRec) started(id string) {
	if strings.HasPrefix(id, "a") {
		r.aRuns.Add(1)
		return
	}
	now := time.Now()
	r.mu.Lock()
	if _, ok := r.start[id]; !ok {
		r.start[id] = now
	}
	r.mu.Unlock()
}

func (r *tenantRec) startOf(id string) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.start[id]
	return t, ok
}

// tenantWorkTx is every unit's work in its fenced transaction: tenantWork of
// sleep, then the unit's row of tenant_done (so a unit that ran twice shows).
func tenantWorkTx(ctx context.Context, tx pgx.Tx, id string) error {
	time.Sleep(tenantWork)
	_, err := tx.Exec(ctx, tenantDoneSQL, id)
	return err
}

// tenantKind is one kind of work of BenchmarkTenantFairness.
type tenantKind struct {
	name string
	// register adds the kind's work to reg: it calls rec.started(id), then
	// tenantWorkTx in its fenced transaction.
	register func(b *testing.B, reg *workers.Registry, rec *tenantRec)
	// enqueue enqueues unit id in tx, for the tenant ctx names.
	enqueue func(ctx context.Context, tx pgx.Tx, id string) error
	// backlog enqueues tenant A's units a1 … an in bulk, as enqueue with a
	// context naming A would write them.
	backlog func(b *testing.B, db *pgtest.DB, n int)
	// left counts A's units not yet done.
	left func(b *testing.B, db *pgtest.DB) int
	// fetched, if set, reads when River fetched each unit of B's job (its
	// attempted_at), by unit id.
	fetched func(b *testing.B, db *pgtest.DB) map[string]time.Time
}

// tenantJobArgs is the fenced job kind of BenchmarkTenantFairness and
// BenchmarkTenantOverhead.
type tenantJobArgs struct {
	ID string `json:"id"`
}

func (tenantJobArgs) Kind() string { return "tenant_job" }

type tenantJobWorker struct {
	river.WorkerDefaults[tenantJobArgs]
	rec *tenantRec // nil: none
}

func (w *tenantJobWorker) Work(ctx context.Context, job *river.Job[tenantJobArgs]) error {
	if w.rec == nil {
		return workers.InTx(ctx, job, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, tenantDoneSQL, job.Args.ID)
			return err
		})
	}
	w.rec.started(job.Args.ID)
	w.rec.fetchedAt(job.Args.ID, job.AttemptedAt)
	return workers.InTx(ctx, job, func(ctx context.Context, tx pgx.Tx) error { return tenantWorkTx(ctx, tx, job.Args.ID) })
}

// tenantJobsSQL inserts fenced jobs of kind tenant_job with ids $1 || g for g
// in 1 … $2, each in its key's shard queue, naming tenant $3 (NULL: none) in
// its metadata: the rows jobs.InsertTx (through workers.InsertForKeyTx)
// writes, without its round trips.
const tenantJobsSQL = `INSERT INTO river_job (args, kind, max_attempts, priority, queue, scheduled_at, state, tags, metadata)
SELECT jsonb_build_object('id', $1::text || g), 'tenant_job', 25, 1,
       'shard_' || (compute_key_hash($1::text || g) % (SELECT shard_count FROM compute_settings)),
       compute_now(), 'available', '{}',
       CASE WHEN $3::text IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('tenant', $3::text) END
FROM generate_series(1, $2::int) g`

// tenantDirtySQL marks dirty the keys $1 || g for g in 1 … $2 of reconciler
// $4, naming tenant $3 (NULL: none): the rows compute_mark_dirty writes for
// new keys, without its round trips.
const tenantDirtySQL = `INSERT INTO compute_dirty (kind, key, shard, gen, not_before, tenant)
SELECT $4::text, $1::text || g, (compute_key_hash($1::text || g) % (SELECT shard_count FROM compute_settings))::int, 1,
       compute_now(), $3::text
FROM generate_series(1, $2::int) g`

func tenantKinds() []tenantKind {
	wf := func(rec *tenantRec) *workflow.Workflow[struct{}, struct{}, struct{}] {
		return &workflow.Workflow[struct{}, struct{}, struct{}]{Kind: "tenant_wf", Steps: []workflow.Step[struct{}]{{
			Name: "run",
			Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[struct{}]) (workflow.Next, error) {
				if rec != nil {
					rec.started(c.WorkflowID)
				}
				if err := tenantWorkTx(ctx, tx, c.WorkflowID); err != nil {
					return workflow.Next{}, err
				}
				return workflow.Finish(struct{}{}), nil
			},
		}}}
	}
	useA := func(b *testing.B, tx pgx.Tx) {
		_, err := tx.Exec(context.Background(), `SELECT compute_tenant_use('A')`)
		require.NoError(b, err)
	}
	return []tenantKind{
		{
			name: "jobs",
			register: func(b *testing.B, reg *workers.Registry, rec *tenantRec) {
				require.NoError(b, workers.AddWorker(reg, &tenantJobWorker{rec: rec}))
			},
			enqueue: func(ctx context.Context, tx pgx.Tx, id string) error {
				_, err := workers.InsertForKeyTx(ctx, tx, id, tenantJobArgs{ID: id}, nil)
				return err
			},
			backlog: func(b *testing.B, db *pgtest.DB, n int) {
				require.NoError(b, pg.InTx(context.Background(), db.Pool, func(ctx context.Context, tx pgx.Tx) error {
					useA(b, tx)
					_, err := tx.Exec(ctx, tenantJobsSQL, "a", n, "A")
					return err
				}))
			},
			left: func(b *testing.B, db *pgtest.DB) int {
				return db.MustCount(b, `SELECT count(*) FROM river_job WHERE state = 'available' AND kind = 'tenant_job' AND metadata ->> 'tenant' = 'A'`)
			},
		},
		{
			name: "reconciles",
			register: func(b *testing.B, reg *workers.Registry, rec *tenantRec) {
				require.NoError(b, workers.AddReconciler(reg, workers.Reconciler{Kind: "tenant_rec",
					Reconcile: func(ctx context.Context, tx pgx.Tx, key string) (workers.Result, error) {
						rec.started(key)
						return workers.Result{}, tenantWorkTx(ctx, tx, key)
					}}))
			},
			enqueue: func(ctx context.Context, tx pgx.Tx, id string) error {
				return workers.DirtyTx(ctx, tx, "tenant_rec", id, nil)
			},
			backlog: func(b *testing.B, db *pgtest.DB, n int) {
				require.NoError(b, pg.InTx(context.Background(), db.Pool, func(ctx context.Context, tx pgx.Tx) error {
					useA(b, tx)
					_, err := tx.Exec(ctx, tenantDirtySQL, "a", n, "A", "tenant_rec")
					return err
				}))
			},
			left: func(b *testing.B, db *pgtest.DB) int {
				return db.MustCount(b, `SELECT count(*) FROM compute_dirty WHERE kind = 'tenant_rec' AND tenant = 'A'`)
			},
		},
		{
			name: "workflows",
			register: func(b *testing.B, reg *workers.Registry, rec *tenantRec) {
				require.NoError(b, addWorkflow(reg, wf(rec)))
			},
			enqueue: func(ctx context.Context, tx pgx.Tx, id string) error {
				_, err := wf(nil).StartTx(ctx, tx, struct{}{}, &workflow.StartOpts{ID: id})
				return err
			},
			backlog: func(b *testing.B, db *pgtest.DB, n int) {
				// compute_workflow_start, the statement StartTx runs, with
				// 5,000 workflows a call.
				const per = 5000
				for lo := 1; lo <= n; lo += per {
					var ids, kinds, inputs []string
					var hashes []int64
					for i := lo; i < lo+per && i <= n; i++ {
						id := "a" + strconv.Itoa(i)
						ids, kinds, inputs = append(ids, id), append(kinds, "tenant_wf"), append(inputs, "{}")
						hashes = append(hashes, int64(jobs.KeyHash(id)))
					}
					rows, err := db.Query(context.Background(), jobs.StartWorkflowsSQL, ids, kinds, inputs, hashes, nil, nil, time.Now(), nil, "A")
					require.NoError(b, err)
					started, err := pgx.CollectRows(rows, pgx.RowTo[string])
					require.NoError(b, err)
					require.Len(b, started, len(ids))
				}
			},
			left: func(b *testing.B, db *pgtest.DB) int {
				return db.MustCount(b, `SELECT count(*) FROM compute_workflows WHERE tenant = 'A' AND status <> 'completed'`)
			},
			fetched: func(b *testing.B, db *pgtest.DB) map[string]time.Time {
				rows, err := db.Query(context.Background(), `SELECT args ->> 'workflow_id', attempted_at FROM river_job
					WHERE kind = 'workflow_step' AND args ->> 'workflow_id' LIKE 'b%' AND attempted_at IS NOT NULL`)
				require.NoError(b, err)
				out := map[string]time.Time{}
				var id string
				var at time.Time
				_, err = pgx.ForEachRow(rows, []any{&id, &at}, func() error { out[id] = at; return nil })
				require.NoError(b, err)
				return out
			},
		},
	}
}

// tenantRuntimeOpts are the runtime options of the tenancy benchmarks: the
// production lease timings and workers per shard, polling every tenantPoll,
// every shard.
func tenantRuntimeOpts() *workers.Options {
	return &workers.Options{PollInterval: tenantPoll, WorkersPerShard: config.DefaultWorkersPerShard,
		LeaseTTL: config.DefaultLeaseTTL, LeaseRenew: config.DefaultLeaseRenew}
}

// BenchmarkTenantFairness: tenant B's pickup latency, from its enqueue's
// commit (pg.InTx returned) to the start of its work, alone on an idle system
// and beside tenant A's backlog, for each kind of work (the sub-benchmarks):
// fenced jobs (jobs: InsertForKeyTx; the start of Work), reconciles
// (reconciles: DirtyTx; the reconcile of the key) and workflow steps
// (workflows: a one-step workflow's StartTx; its step's function; a start
// wakes its queue's producer at commit, so its idle pickup is a few ms, not
// a poll). In one run, on one database, one Runtime (workertest.Start: every
// shard of 16, the production lease timings and workers per shard, poll
// 50 ms, pool of 20):
//
//  1. idle: B alone, one unit every 25 ms (40/s, each its own transaction
//     with a context naming B) for BETTER_COMPUTE_TENANT_SECONDS (default
//     10 s);
//  2. A's backlog of BETTER_COMPUTE_TENANT_BACKLOG units (default 100,000,
//     for workflows too: their bulk start takes some 10 s) lands in one
//     transaction (workflows: 5,000 a statement), spread over the shards as
//     its keys fall, written by SQL as the kind's enqueue writes it (jobs:
//     river_job rows naming {"tenant": "A"}, after compute_tenant_use('A');
//     reconciles: compute_dirty rows of tenant A, the same; workflows:
//     compute_workflow_start, StartTx's own statement); then ANALYZE, as
//     autovacuum would within the minute, and the workers chew on it for 2 s;
//  3. busy: B again at the same rate for as long, while A's backlog drains
//     at A's limit (compute_tenants.max_running, the default 10).
//
// Every unit's work sleeps 1 ms and writes its row in its fenced transaction.
// The first second of each phase is not measured. It reports B's p50 and p99
// in ms of each phase and busy ÷ idle (the target: p99 ≤ 2), A's units started
// per second during the busy phase and how many were still waiting at its
// end (none would mean the busy phase was not busy), and checks that every
// unit of B ran and wrote exactly once and that no unit wrote twice. For River
// jobs (fenced jobs, workflow steps) it logs each phase's pickup split at the
// job's attempted_at (commit → fetched, fetched → work);
// BETTER_COMPUTE_TENANT_WAITS=1 logs what the busy phase's backends wait for.
//
//	go test -run '^$' -bench TenantFairness -benchtime 1x -timeout 30m ./workers/
//
// A quick check: BETTER_COMPUTE_TENANT_SECONDS=3 BETTER_COMPUTE_TENANT_BACKLOG=20000.
func BenchmarkTenantFairness(b *testing.B) {
	for _, k := range tenantKinds() {
		b.Run(k.name, func(b *testing.B) { benchTenantFairness(b, k) })
	}
}

// tenantPhase is what one phase's producer enqueued: each unit's id, when its
// enqueue began and when its transaction had committed.
type tenantPhase struct {
	started  time.Time
	ids      []string
	began    []time.Time
	commit   []time.Time
	achieved float64 // units/s
}

// produceTenant enqueues units of B (ids prefix0, prefix1, …) at tenantRate
// for d, one transaction each, sequentially on a ticker.
func produceTenant(b *testing.B, db *pg.Pool, k tenantKind, prefix string, d time.Duration) *tenantPhase {
	ctx := workers.WithTenant(context.Background(), "B")
	p := &tenantPhase{started: time.Now()}
	tick := time.NewTicker(time.Second / tenantRate)
	defer tick.Stop()
	end := time.After(d)
	for i := 0; ; i++ {
		select {
		case <-end:
			p.achieved = float64(len(p.ids)) / time.Since(p.started).Seconds()
			return p
		case <-tick.C:
		}
		id := prefix + strconv.Itoa(i)
		began := time.Now()
		require.NoError(b, pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error { return k.enqueue(ctx, tx, id) }))
		p.ids, p.began, p.commit = append(p.ids, id), append(p.began, began), append(p.commit, time.Now())
	}
}

// waitTenantDone waits until every unit of p has written its row.
func waitTenantDone(b *testing.B, db *pgtest.DB, p *tenantPhase, prefix string) {
	workertest.WaitFor(b, 3*time.Minute, "every unit of B ran ("+prefix+")", func() bool {
		return db.MustCount(b, `SELECT count(DISTINCT id) FROM tenant_done WHERE id LIKE $1 || '%'`, prefix) >= len(p.ids)
	})
}

// pickups are the pickup latencies of p's units enqueued after the warm-up.
func (p *tenantPhase) pickups(b *testing.B, rec *tenantRec) []time.Duration {
	var out []time.Duration
	for i, id := range p.ids {
		if p.began[i].Sub(p.started) < tenantWarmup {
			continue
		}
		s, ok := rec.startOf(id)
		require.True(b, ok, "unit %s never started", id)
		out = append(out, s.Sub(p.commit[i]))
	}
	return out
}

// breakdown logs, for River jobs (fenced jobs, workflow steps), p's pickups
// split at River's fetch (the job's attempted_at): commit → fetched, fetched →
// the work.
func (p *tenantPhase) breakdown(b *testing.B, rec *tenantRec, name string) {
	var fetch, start []time.Duration
	rec.mu.Lock()
	for i, id := range p.ids {
		f, ok := rec.fetched[id]
		if !ok || p.began[i].Sub(p.started) < tenantWarmup {
			continue
		}
		fetch, start = append(fetch, f.Sub(p.commit[i])), append(start, rec.start[id].Sub(f))
	}
	rec.mu.Unlock()
	if len(fetch) > 0 {
		b.Logf("  %s: commit → fetched (attempted_at) p50 %.1f p99 %.1f ms; fetched → work p50 %.1f p99 %.1f ms", name,
			ms(percentile(fetch, .5)), ms(percentile(fetch, .99)), ms(percentile(start, .5)), ms(percentile(start, .99)))
	}
}

func benchTenantFairness(b *testing.B, k tenantKind) {
	d := envDuration(b, "BETTER_COMPUTE_TENANT_SECONDS", 10*time.Second)
	n := envInt(b, "BETTER_COMPUTE_TENANT_BACKLOG", 100_000)
	ctx := context.Background()
	var idle, busy []time.Duration
	var aRate, aLeft, setup, achieved float64
	for i := 0; i < b.N; i++ {
		db := pgtest.New(b, pgtest.Options{StatementTimeout: time.Minute})
		db.MustExec(b, tenantDoneDDL)
		rec := newTenantRec()
		reg := workers.NewRegistry()
		k.register(b, reg, rec)
		rt := workertest.Start(b, db.Pool, reg, tenantRuntimeOpts())
		workertest.WaitFor(b, 30*time.Second, "every shard held", func() bool { return len(rt.HeldShards()) == pgtest.DefaultShardCount })

		pIdle := produceTenant(b, db.Pool, k, "bi", d)
		waitTenantDone(b, db, pIdle, "bi")

		t0 := time.Now()
		k.backlog(b, db, n)
		// The statistics of a backlog that has waited a while (autovacuum
		// analyzes a table within a minute of a change this size).
		db.MustExec(b, `ANALYZE river_job, compute_dirty, compute_workflows`)
		setup = time.Since(t0).Seconds()
		time.Sleep(tenantSettle)

		a0 := rec.aRuns.Load()
		stopWaits := sampleWaits(b, db)
		pBusy := produceTenant(b, db.Pool, k, "bb", d)
		stopWaits()
		aRate = float64(rec.aRuns.Load()-a0) / time.Since(pBusy.started).Seconds()
		aLeft = float64(k.left(b, db))
		achieved = pBusy.achieved
		waitTenantDone(b, db, pBusy, "bb")
		require.NoError(b, rt.Stop(ctx))

		// Every unit of B wrote exactly once; no unit of A or B twice.
		rows, err := db.Query(ctx, `SELECT id, count(*) FROM tenant_done WHERE id LIKE 'b%' GROUP BY id`)
		require.NoError(b, err)
		wrote := map[string]int{}
		var id string
		var c int
		_, err = pgx.ForEachRow(rows, []any{&id, &c}, func() error { wrote[id] = c; return nil })
		require.NoError(b, err)
		for _, p := range []*tenantPhase{pIdle, pBusy} {
			for _, id := range p.ids {
				require.Equal(b, 1, wrote[id], "unit %s of B: rows written", id)
			}
		}
		require.Len(b, wrote, len(pIdle.ids)+len(pBusy.ids), "B's units that wrote")
		require.Zero(b, db.MustCount(b, `SELECT count(*) FROM (SELECT id FROM tenant_done GROUP BY id HAVING count(*) > 1) x`), "units that wrote twice")

		if k.fetched != nil {
			for id, at := range k.fetched(b, db) {
				rec.fetchedAt(id, &at)
			}
		}
		idle, busy = append(idle, pIdle.pickups(b, rec)...), append(busy, pBusy.pickups(b, rec)...)
		pIdle.breakdown(b, rec, "idle")
		pBusy.breakdown(b, rec, "busy")
	}
	ip50, ip99 := ms(percentile(idle, .5)), ms(percentile(idle, .99))
	bp50, bp99 := ms(percentile(busy, .5)), ms(percentile(busy, .99))
	b.ReportMetric(ip50, "idle_p50_ms")
	b.ReportMetric(ip99, "idle_p99_ms")
	b.ReportMetric(bp50, "busy_p50_ms")
	b.ReportMetric(bp99, "busy_p99_ms")
	b.ReportMetric(bp50/ip50, "busy/idle_p50")
	b.ReportMetric(bp99/ip99, "busy/idle_p99")
	b.ReportMetric(aRate, "a_units/s")
	b.ReportMetric(aLeft, "a_left")
	b.ReportMetric(setup, "backlog_setup_s")
	b.Logf("%s: B at %d/s (busy: %.1f/s achieved), A's backlog %d (set up in %.1f s): idle p50 %.1f p99 %.1f ms (n=%d); busy p50 %.1f p99 %.1f ms (n=%d); busy/idle p50 %.2f p99 %.2f; A ran %.0f units/s during the busy phase, %.0f left at its end",
		k.name, tenantRate, achieved, n, setup, ip50, ip99, len(idle), bp50, bp99, len(busy), bp50/ip50, bp99/ip99, aRate, aLeft)
	if aLeft == 0 {
		b.Logf("WARNING: A's backlog was gone before the busy phase ended: the busy figures are not beside a backlog")
	}
}

// BenchmarkTenantOverhead: what the tenancy module costs work that names no
// tenant, against the path it replaced, in one run on one database. The
// module changed two statements of the shard holder: the fetch of a shard
// queue's jobs (compute_fetch_jobs, against River's own statement,
// riverpgxv5's JobGetAvailable) and the take of a reconcile batch's keys
// (compute_take_fair, against compute_take_dirty, the take before it, still
// in the schema); test hooks switch each back (export_test.go).
//
//   - jobs, reconciles: each side drains BETTER_COMPUTE_TENANT_OVERHEAD_N
//     units of no tenant (default 4,000 fenced jobs, or 5 × that many dirty
//     keys), bulk-inserted beforehand, with workertest.Start (every shard of
//     16, the production lease timings and workers per shard, poll 50 ms); a
//     job's work is its row of tenant_done in its fenced transaction
//     (workers.InTx), a key's the same in its batch. A drain of each side
//     runs first, not counted; then the sides alternate ours, old, old, ours,
//     twice, so that a load that drifts weighs on both alike. A side's rate
//     is its units over the spans from its first to its last row's
//     clock_timestamp(); its CPU per unit is this process's and the
//     database's server processes' (from /proc) over its drains, a steadier
//     figure on a shared machine. It checks every unit ran exactly once.
//   - statements: each statement alone, BETTER_COMPUTE_TENANT_OVERHEAD_CALLS
//     calls (default 2,000) of each, in turn, each in a transaction rolled
//     back, on one connection, with 100,000 jobs available in shard_0's queue
//     and 100,000 keys waiting in shard 0: a fetch of up to 8 jobs and a take
//     of up to 32 keys.
//
// It reports ours and the old path's figures and ours ÷ old; the target is a
// cost within 5 % (a rate ÷ old ≥ 0.95; CPU or time ÷ old ≤ 1.05).
//
//	go test -run '^$' -bench TenantOverhead -benchtime 1x -timeout 30m ./workers/
func BenchmarkTenantOverhead(b *testing.B) {
	b.Run("jobs", func(b *testing.B) { benchTenantOverhead(b, false) })
	b.Run("reconciles", func(b *testing.B) { benchTenantOverhead(b, true) })
	b.Run("statements", benchTenantStatements)
}

// tenantOverheadSide is one side's totals.
type tenantOverheadSide struct {
	units  int
	window float64 // s
	cpu    float64 // s, process + server
}

func benchTenantOverhead(b *testing.B, reconciles bool) {
	ctx := context.Background()
	n := envInt(b, "BETTER_COMPUTE_TENANT_OVERHEAD_N", 4000)
	what, old := "jobs", "River's own fetch"
	if reconciles {
		n *= 5
		what, old = "reconciles", "compute_take_dirty"
	}
	db := pgtest.New(b, pgtest.Options{StatementTimeout: time.Minute})
	db.MustExec(b, tenantDoneDDL)
	reg := workers.NewRegistry()
	require.NoError(b, workers.AddWorker(reg, &tenantJobWorker{}))
	require.NoError(b, workers.AddReconciler(reg, workers.Reconciler{Kind: "tenant_rec",
		Reconcile: func(ctx context.Context, tx pgx.Tx, key string) (workers.Result, error) {
			_, err := tx.Exec(ctx, tenantDoneSQL, key)
			return workers.Result{}, err
		}}))
	require.NoError(b, reg.Record(ctx, db.Pool))
	defer workers.SetRiverFetch(false)
	defer workers.SetLegacyTake(false)

	var sides [2]tenantOverheadSide // ours, old
	var drains []string
	round := 0
	drain := func(useOld, counted bool) {
		round++
		prefix := fmt.Sprintf("r%d_", round)
		if reconciles {
			workers.SetLegacyTake(useOld)
			db.MustExec(b, tenantDirtySQL, prefix, n, nil, "tenant_rec")
		} else {
			workers.SetRiverFetch(useOld)
			db.MustExec(b, tenantJobsSQL, prefix, n, nil)
		}
		db.MustExec(b, `VACUUM ANALYZE`)
		go0, pg0 := procCPU(), serverCPU(b, db)
		rt := workertest.Start(b, db.Pool, reg, tenantRuntimeOpts())
		workertest.WaitFor(b, 5*time.Minute, "every unit ran", func() bool {
			return db.MustCount(b, `SELECT count(*) FROM tenant_done WHERE id LIKE $1 || '%'`, prefix) >= n
		})
		pg1 := serverCPU(b, db)
		cpu := procCPU() - go0
		for pid, t := range pg1 {
			cpu += t - pg0[pid] // a backend that is new counts from zero
		}
		require.NoError(b, rt.Stop(ctx))
		var units, distinct int
		var window float64
		require.NoError(b, db.QueryRow(ctx, `SELECT count(*), count(DISTINCT id), extract(epoch FROM max(at) - min(at))::float8
			FROM tenant_done WHERE id LIKE $1 || '%'`, prefix).Scan(&units, &distinct, &window))
		require.Equal(b, n, units, "rows written (each unit once)")
		require.Equal(b, n, distinct, "units that wrote")
		if !counted {
			return
		}
		s, name := &sides[0], "ours"
		if useOld {
			s, name = &sides[1], "old"
		}
		s.units += units
		s.window += window
		s.cpu += cpu
		drains = append(drains, fmt.Sprintf("%s %.0f/s %.3f ms", name, float64(units)/window, 1000*cpu/float64(units)))
	}
	// A drain of each first, not counted: the first drains of a fresh
	// database and runtime are the slowest by far (caches, connections, plans).
	drain(true, false)
	drain(false, false)
	for i := 0; i < b.N; i++ {
		for _, useOld := range []bool{false, true, true, false, false, true, true, false} {
			drain(useOld, true)
		}
	}
	ours, prev := sides[0], sides[1]
	or, pr := float64(ours.units)/ours.window, float64(prev.units)/prev.window
	oc, pc := 1000*ours.cpu/float64(ours.units), 1000*prev.cpu/float64(prev.units)
	b.ReportMetric(or, "units/s")
	b.ReportMetric(pr, "old_units/s")
	b.ReportMetric(or/pr, "ours/old")
	b.ReportMetric(oc, "cpu_ms/unit")
	b.ReportMetric(pc, "old_cpu_ms/unit")
	b.ReportMetric(oc/pc, "cpu/old_cpu")
	b.Logf("%s of no tenant, %d a drain, 8 drains: ours %.0f/s at %.3f ms CPU each; %s %.0f/s at %.3f ms; ours ÷ old: rate %.3f, CPU %.3f",
		what, n, or, oc, old, pr, pc, or/pr, oc/pc)
	b.Logf("  each drain: %s", strings.Join(drains, "; "))
}

// riverFetchSQL is riverpgxv5's JobGetAvailable (River v0.51): $1 now, $2
// max attempted_by, $3 the client, $4 the queue, $5 the kinds, $6 how many.
const riverFetchSQL = `WITH locked_jobs AS (
    SELECT id, args, attempt, attempted_at, attempted_by, created_at, errors, finalized_at, kind, max_attempts, metadata, priority, queue, state, scheduled_at, tags, unique_key, unique_states
    FROM river_job
    WHERE state = 'available' AND queue = $4::text AND ($5::text[] IS NULL OR kind = ANY($5::text[]))
        AND scheduled_at <= coalesce($1::timestamptz, compute_now())
    ORDER BY priority ASC, scheduled_at ASC, id ASC
    LIMIT $6::integer
    FOR UPDATE SKIP LOCKED
)
UPDATE river_job
SET state = 'running', attempt = river_job.attempt + 1, attempted_at = coalesce($1::timestamptz, compute_now()),
    attempted_by = array_append(
        CASE WHEN array_length(river_job.attempted_by, 1) >= $2::int
        THEN river_job.attempted_by[array_length(river_job.attempted_by, 1) + 2 - $2:]
        ELSE river_job.attempted_by END, $3::text)
FROM locked_jobs
WHERE river_job.id = locked_jobs.id
RETURNING river_job.id, river_job.args, river_job.attempt, river_job.attempted_at, river_job.attempted_by, river_job.created_at,
    river_job.errors, river_job.finalized_at, river_job.kind, river_job.max_attempts, river_job.metadata, river_job.priority,
    river_job.queue, river_job.state, river_job.scheduled_at, river_job.tags, river_job.unique_key, river_job.unique_states`

// fairFetchSQL is workers' fetch of a shard queue (fetch.go), with River's
// parameters in River's order.
const fairFetchSQL = `SELECT id, args, attempt, attempted_at, attempted_by, created_at, errors, finalized_at, kind,
       max_attempts, metadata, priority, queue, state, scheduled_at, tags, unique_key, unique_states::int
FROM compute_fetch_jobs($4, $6, $1, $3, $2, $5::text[])`

func benchTenantStatements(b *testing.B) {
	ctx := context.Background()
	calls := envInt(b, "BETTER_COMPUTE_TENANT_OVERHEAD_CALLS", 2000)
	db := pgtest.New(b, pgtest.Options{StatementTimeout: time.Minute})
	db.MustExec(b, tenantJobsSQL, "j", 100_000, nil)
	db.MustExec(b, tenantDirtySQL, "k", 100_000, nil, "tenant_rec")
	// Every job in shard_0's queue, every key in shard 0.
	db.MustExec(b, `UPDATE river_job SET queue = 'shard_0'`)
	db.MustExec(b, `UPDATE compute_dirty SET shard = 0`)
	db.MustExec(b, `INSERT INTO compute_leases (name, owner, epoch, expires_at) VALUES ('shard/0', 'w#1', 1, compute_now() + interval '1 day')`)
	db.MustExec(b, `VACUUM ANALYZE`)
	conn, err := db.Acquire(ctx)
	require.NoError(b, err)
	defer conn.Release()
	kinds := []string{"tenant_job"}
	call := func(want int, q string, args ...any) time.Duration {
		tx, err := conn.Begin(ctx)
		require.NoError(b, err)
		t0 := time.Now()
		rows, err := tx.Query(ctx, q, args...)
		require.NoError(b, err)
		got := 0
		for rows.Next() {
			got++
		}
		require.NoError(b, rows.Err())
		took := time.Since(t0)
		require.NoError(b, tx.Rollback(ctx))
		require.Equal(b, want, got)
		return took
	}
	take := `SELECT kind, key FROM compute_take_fair(0, 'shard/0', 'w#1', 1, ARRAY['tenant_rec'], ARRAY[32], '{}', '{}', '')`
	takeDirty := `SELECT kind, key FROM compute_take_dirty(0, 'shard/0', 'w#1', 1, ARRAY['tenant_rec'], ARRAY[32], '{}', '{}')`
	// Pairs of ours and the old statement. A statement right after the
	// other pair's runs measurably slower (caches), so each pair runs in
	// turn, in either order alternately.
	pairs := [][2]func() time.Duration{
		{
			func() time.Duration { return call(8, fairFetchSQL, time.Now(), 100, "c", "shard_0", kinds, 8) },
			func() time.Duration { return call(8, riverFetchSQL, time.Now(), 100, "c", "shard_0", kinds, 8) },
		},
		{
			func() time.Duration { return call(32, take) },
			func() time.Duration { return call(32, takeDirty) },
		},
	}
	var tot [2][2]time.Duration
	for i := 0; i < b.N; i++ {
		for c := -50; c < calls; c++ { // 50 calls of each first, not counted
			for p, pair := range pairs {
				first := c & 1
				d0 := pair[first]()
				d1 := pair[1-first]()
				if c >= 0 {
					tot[p][first] += d0
					tot[p][1-first] += d1
				}
			}
		}
	}
	var per [2][2]float64
	for p := range tot {
		for o := range tot[p] {
			per[p][o] = float64(tot[p][o].Nanoseconds()) / 1000 / float64(b.N*calls)
		}
	}
	b.ReportMetric(per[0][0], "fetch_µs")
	b.ReportMetric(per[0][1], "river_fetch_µs")
	b.ReportMetric(per[0][0]/per[0][1], "fetch/river_fetch")
	b.ReportMetric(per[1][0], "take_µs")
	b.ReportMetric(per[1][1], "take_dirty_µs")
	b.ReportMetric(per[1][0]/per[1][1], "take/take_dirty")
	b.Logf("per call, %d calls of each: fetch of 8 jobs %.0f µs, River's %.0f µs (÷ %.3f); take of 32 keys %.0f µs, compute_take_dirty %.0f µs (÷ %.3f)",
		calls, per[0][0], per[0][1], per[0][0]/per[0][1], per[1][0], per[1][1], per[1][0]/per[1][1])
}

// procCPU is the CPU time this process used so far, in s.
func procCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// serverCPU returns the CPU time, in s, each server process connected to db
// used so far (from /proc: the server runs on this machine).
func serverCPU(b *testing.B, db *pgtest.DB) map[int]float64 {
	rows, err := db.Query(context.Background(), `SELECT pid FROM pg_stat_activity WHERE datname = current_database()`)
	require.NoError(b, err)
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(b, err)
	out := map[int]float64{}
	for _, pid := range pids {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue // gone since
		}
		// After the command's closing parenthesis: utime and stime are the
		// 12th and 13th fields (clock ticks of 1/100 s).
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(f) < 13 {
			continue
		}
		ut, err1 := strconv.ParseFloat(f[11], 64)
		st, err2 := strconv.ParseFloat(f[12], 64)
		if err1 == nil && err2 == nil {
			out[int(pid)] = (ut + st) / 100
		}
	}
	return out
}

// sampleWaits, with BETTER_COMPUTE_TENANT_WAITS set, samples every 10 ms
// until it is stopped what db's active backends wait for (wait event and
// statement), and whose tenant gate a session waits for, and then logs the
// counts: where the busy phase's time goes.
func sampleWaits(b *testing.B, db *pgtest.DB) (stop func()) {
	if os.Getenv("BETTER_COMPUTE_TENANT_WAITS") == "" {
		return func() {}
	}
	done, stopped := make(chan struct{}), make(chan struct{})
	counts := map[string]int{}
	count := func(q string) {
		rows, err := db.Query(context.Background(), q)
		if err != nil {
			return
		}
		var k string
		_, _ = pgx.ForEachRow(rows, []any{&k}, func() error { counts[k]++; return nil })
	}
	go func() {
		defer close(stopped)
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			count(`SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU') || '  ' || left(regexp_replace(query, '\s+', ' ', 'g'), 70)
				FROM pg_stat_activity WHERE datname = current_database() AND state = 'active' AND pid <> pg_backend_pid()`)
			count(`SELECT 'waits for the gate of tenant ' || CASE l.classid::int WHEN compute_tenant_key('A') THEN 'A'
				WHEN compute_tenant_key('B') THEN 'B' ELSE l.classid::text END
				FROM pg_locks l WHERE l.locktype = 'advisory' AND NOT l.granted AND l.objid = 4294967295`)
		}
	}()
	return func() {
		close(done)
		<-stopped
		keys := make([]string, 0, len(counts))
		for k := range counts {
			keys = append(keys, k)
		}
		sort.Slice(keys, func(i, j int) bool { return counts[keys[i]] > counts[keys[j]] })
		var sb strings.Builder
		sb.WriteString("active backends of the busy phase (samples every 10 ms):\n")
		for _, k := range keys[:min(len(keys), 20)] {
			fmt.Fprintf(&sb, "%7d  %s\n", counts[k], k)
		}
		logLong(b, sb.String())
	}
}
