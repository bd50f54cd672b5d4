package workers_test

import (
	"context"
	"fmt"
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

	"github.com/bettercompute/bettercompute/domain/tenancy"
	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

// insertTenantTasks enqueues the example tasks ids of tenant ("" for none),
// each in its shard's queue, in one transaction: the tenant is the job's, by
// its metadata (jobs.InsertTx records the tenant its context names).
func insertTenantTasks(t *testing.T, db *pgtest.DB, tenant string, ids []string) {
	t.Helper()
	ctx := workers.WithTenant(context.Background(), tenant)
	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		for _, id := range ids {
			queue, err := jobs.ShardQueueOfTx(ctx, tx, id)
			if err != nil {
				return err
			}
			if _, err := jobs.InsertTx(ctx, tx, exampleTask{ID: id}, &river.InsertOpts{Queue: queue}); err != nil {
				return err
			}
		}
		return nil
	}))
}

// taskIDs are n task ids starting with prefix.
func taskIDs(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%03d", prefix, i)
	}
	return out
}

// maxOverlap is the largest number of committed task runs whose ids start
// with prefix that were in their fenced transactions at once, by the
// intervals [started_at, finished_at] they recorded (the database's wall
// clock): a sweep over their starts (+1) and ends (-1), an end before a start
// at the same instant (intervals that only touch do not overlap).
func maxOverlap(t *testing.T, db *pgtest.DB, prefix string) int {
	t.Helper()
	return db.MustCount(t, `WITH ev AS (
		SELECT started_at AS at, 1 AS d FROM example_task_runs WHERE starts_with(task_id, $1)
		UNION ALL
		SELECT finished_at, -1 FROM example_task_runs WHERE starts_with(task_id, $1))
		SELECT coalesce(max(n), 0)::int FROM (SELECT sum(d) OVER (ORDER BY at, d ROWS UNBOUNDED PRECEDING) AS n FROM ev) x`, prefix)
}

// tenantRunningOf counts the running jobs of tenant that process p attempted last.
func tenantRunningOf(t *testing.T, db *pgtest.DB, p *proc, tenant string) int {
	t.Helper()
	return db.MustCount(t, `SELECT count(*) FROM river_job WHERE state = 'running' AND metadata ->> 'tenant' = $1
		AND attempted_by[array_length(attempted_by, 1)] = $2`, tenant, ownerOf(t, db, p))
}

// committedBy counts the committed runs of process p of the tasks whose ids
// start with prefix.
func committedBy(t *testing.T, db *pgtest.DB, p *proc, prefix string) int {
	t.Helper()
	return db.MustCount(t, `SELECT count(*) FROM example_task_runs WHERE worker = $1 AND starts_with(task_id, $2)`,
		strconv.Itoa(p.pid), prefix)
}

// TestProcessTenantLimitAcrossProcesses: a tenant's concurrency limit holds
// across three worker processes while one is killed -9 mid-task (and replaced)
// and another is paused past its lease and woken. Tenant t1 (limit 3) has 150
// tasks of 100 ms spread over every shard, beside 30 of t2 (the default limit)
// and 30 of no tenant. Sampled every 5 ms, t1's running units
// (compute_tenant_running) never exceed 3 and reach 3; by the intervals its
// committed runs recorded, no more than 3 of t1's task transactions that
// committed were open at once; and every task, of every tenant, ran and
// committed exactly once.
func TestProcessTenantLimitAcrossProcesses(t *testing.T) {
	t.Parallel()
	began := time.Now()
	ctx := context.Background()
	db := appDB(t)
	const limit = 3
	sleep := "EXAMPLE_TASK_SLEEP=100ms"

	// Three processes working at once, each holding about a third of the
	// shards: A serves 0-5, B 6-10, C 11-15 and B's too, so it takes the rest
	// and stands by for B's. A's replacement serves A's shards.
	a := startWorkerOn(t, db, "0-5", sleep, "BETTER_COMPUTE_WORKER_ID=tenant-a")
	b := startWorkerOn(t, db, "6-10", sleep, "BETTER_COMPUTE_WORKER_ID=tenant-b")
	workertest.WaitFor(t, 20*time.Second, "A and B hold their shards", func() bool {
		return leasesOf(t, db, a) == 6 && leasesOf(t, db, b) == 5
	})
	c := startWorkerOn(t, db, "6-15", sleep, "BETTER_COMPUTE_WORKER_ID=tenant-c")
	workertest.WaitFor(t, 20*time.Second, "C holds the rest", func() bool { return leasesOf(t, db, c) == 5 })

	// t1's limit, set before any of its work is enqueued.
	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		if err := jobs.UseTenantTx(ctx, tx, "t1"); err != nil {
			return err
		}
		return tenancy.SetLimitTx(ctx, tx, "t1", limit)
	}))

	// The sampler: t1's running units, every 5 ms, until stopped.
	var (
		stop              atomic.Bool
		wg                sync.WaitGroup
		samples, atLimit  int
		sampledMax        int64
		over              []string // samples above the limit, when
		samplerFailedOnce sync.Once
	)
	wg.Go(func() {
		for !stop.Load() {
			var n int64
			var at time.Time
			err := db.Pool.QueryRow(ctx, `SELECT compute_tenant_running('t1'), clock_timestamp()`).Scan(&n, &at)
			if err != nil {
				samplerFailedOnce.Do(func() { t.Errorf("sample compute_tenant_running: %v", err) })
			} else {
				samples++
				sampledMax = max(sampledMax, n)
				if n == limit {
					atLimit++
				}
				if n > limit {
					over = append(over, fmt.Sprintf("%d at %s", n, at.Format("15:04:05.000")))
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
	stopSampler := func() {
		if !stop.Swap(true) {
			wg.Wait()
		}
	}
	t.Cleanup(stopSampler)

	t1, t2, none := taskIDs("t1-", 150), taskIDs("t2-", 30), taskIDs("none-", 30)
	inserted := len(t1) + len(t2) + len(none)
	insertTenantTasks(t, db, "t1", t1)
	insertTenantTasks(t, db, "t2", t2)
	insertTenantTasks(t, db, "", none)
	require.Equal(t, 16, db.MustCount(t, `SELECT count(DISTINCT queue) FROM river_job WHERE metadata ->> 'tenant' = 't1'`),
		"t1's tasks are spread over every shard")

	// kill -9 A in the middle of a t1 task, with t1's work to come; its
	// replacement (A's identity and shards) starts as soon as A is gone and
	// takes A's shards back at once.
	workertest.WaitFor(t, 20*time.Second, "A ran t1 tasks and runs one", func() bool {
		return committedBy(t, db, a, "t1-") >= 3 && tenantRunningOf(t, db, a, "t1") > 0
	})
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGKILL))
	killedAt := time.Now()
	select {
	case <-a.done:
	case <-time.After(10 * time.Second):
		t.Fatal("A did not exit after kill -9")
	}
	a2 := startWorkerOn(t, db, "0-5", sleep, "BETTER_COMPUTE_WORKER_ID=tenant-a")
	workertest.WaitFor(t, 20*time.Second, "A's replacement takes A's shards back", func() bool { return leasesOf(t, db, a2) == 6 })
	replacedAfter := time.Since(killedAt)

	// SIGSTOP B in the middle of a t1 task, until its leases expired (their
	// TTL is 1.5 s) and C holds them, and for 2 s at least; then SIGCONT.
	workertest.WaitFor(t, 20*time.Second, "B ran t1 tasks and runs one", func() bool {
		return committedBy(t, db, b, "t1-") >= 3 && tenantRunningOf(t, db, b, "t1") > 0
	})
	require.NoError(t, b.cmd.Process.Signal(syscall.SIGSTOP))
	stoppedAt := time.Now()
	workertest.WaitFor(t, 20*time.Second, "C holds B's shards", func() bool {
		return leasesOf(t, db, c) == 10 && time.Since(stoppedAt) >= 2*time.Second
	})
	paused := time.Since(stoppedAt)
	require.NoError(t, b.cmd.Process.Signal(syscall.SIGCONT))
	require.Positive(t, db.MustCount(t, `SELECT count(*) FROM example_task_runs WHERE starts_with(task_id, 't1-')`),
		"t1's tasks ran before the end")

	workertest.WaitFor(t, 40*time.Second, "every task ran", func() bool {
		return db.MustCount(t, `SELECT count(DISTINCT task_id) FROM example_task_runs`) == inserted
	})
	stopSampler()
	ran := time.Since(began)

	// Exactly once: one committed run per task, of every tenant and of none.
	for _, g := range []struct {
		prefix string
		n      int
	}{{"t1-", len(t1)}, {"t2-", len(t2)}, {"none-", len(none)}} {
		var runs, distinct int
		require.NoError(t, db.QueryRow(ctx, `SELECT count(*), count(DISTINCT task_id) FROM example_task_runs
			WHERE starts_with(task_id, $1)`, g.prefix).Scan(&runs, &distinct))
		require.Equal(t, g.n, distinct, "%s tasks that ran", g.prefix)
		require.Equal(t, g.n, runs, "%s task runs committed: a task committed twice", g.prefix)
	}
	workertest.WaitFor(t, 10*time.Second, "every job completed", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM river_job WHERE state <> 'completed'`) == 0
	})
	require.Equal(t, inserted, db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'example_task' AND state = 'completed'`))

	overlap := maxOverlap(t, db, "t1-")
	var byWorker string
	require.NoError(t, db.QueryRow(ctx, `SELECT string_agg(format('%s: %s', w, n), ', ' ORDER BY w) FROM (
		SELECT CASE worker WHEN $1 THEN 'A (killed)' WHEN $2 THEN 'B (paused)' WHEN $3 THEN 'C' WHEN $4 THEN 'A2 (replacement)' END AS w,
		       count(*) AS n FROM example_task_runs WHERE starts_with(task_id, 't1-') GROUP BY 1) x`,
		strconv.Itoa(a.pid), strconv.Itoa(b.pid), strconv.Itoa(c.pid), strconv.Itoa(a2.pid)).Scan(&byWorker))
	t.Logf("tenant t1 (limit %d): sampled compute_tenant_running max %d over %d samples (%d at the limit); committed runs' overlap max %d (t2, limit 10: %d; no tenant: %d); t1 runs by process: %s; A killed %s after start and replaced %s later, B paused %s; every one of %d tasks ran once; test took %s",
		limit, sampledMax, samples, atLimit, overlap, maxOverlap(t, db, "t2-"), maxOverlap(t, db, "none-"), byWorker,
		killedAt.Sub(began).Round(time.Millisecond), replacedAfter.Round(time.Millisecond), paused.Round(time.Millisecond), inserted, ran.Round(time.Millisecond))

	if len(over) > 0 {
		t.Errorf("t1's running units exceeded its limit %d in %d of %d samples; the first: %s",
			limit, len(over), samples, strings.Join(over[:min(10, len(over))], ", "))
	}
	require.LessOrEqual(t, sampledMax, int64(limit), "sampled running units of t1")
	require.LessOrEqual(t, overlap, limit, "t1's committed task transactions open at once")
	require.Equal(t, int64(limit), sampledMax, "t1 never reached its limit: the test did not press it")
}
