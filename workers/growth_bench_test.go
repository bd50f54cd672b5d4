package workers_test

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

// The growth benchmarks: what one unit of work costs as the backlog grows,
// each against the same work on a small backlog in the same run.

// BenchmarkGrowthClaim: one claim of 32 due keys (jobs.ClaimDirtySQL: the
// shard's fetch, its batch job inserted) with 1,000 due keys waiting in the
// shard, and with 1,000,000. Between claims (untimed) the claimed keys are
// reconciled away and as many new due keys arrive, so the backlog stays put.
//
//	go test -run '^$' -bench GrowthClaim -benchtime 300x -timeout 30m ./workers/
func BenchmarkGrowthClaim(b *testing.B) {
	growthRatio(b, 1_000, 1_000_000, growthClaim, "µs/claim_%d_due", "claim_1M/1k")
}

// growthRatio times one operation (op, per unit) with a small and a big
// backlog, reports each (unit, formatted with the backlog) and big ÷ small
// (ratio).
func growthRatio(b *testing.B, small, big int, op func(*testing.B, int) time.Duration, unit, ratio string) {
	var per [2]time.Duration
	for i, n := range []int{small, big} {
		per[i] = op(b, n)
		b.ReportMetric(float64(per[i].Microseconds()), fmt.Sprintf(unit, n))
	}
	b.ReportMetric(float64(per[1])/float64(per[0]), ratio)
}

func growthClaim(b *testing.B, due int) time.Duration {
	ctx := context.Background()
	db := pgtest.New(b, pgtest.Options{StatementTimeout: 10 * time.Minute})
	db.MustExec(b, `INSERT INTO compute_dirty (kind, key, shard, not_before)
		SELECT 'item', 'k' || g, 0, compute_now() - make_interval(secs => $1 - g) FROM generate_series(1, $1) g`, due)
	db.MustExec(b, `VACUUM ANALYZE compute_dirty`)
	db.MustExec(b, `INSERT INTO compute_leases (name, owner, epoch, expires_at) VALUES ('shard/0', 'w#1', 1, compute_now() + interval '1 day')`)
	next := due
	var took time.Duration
	n := growthOps(b)
	for i := -growthWarmup; i < n; i++ {
		if i == 0 {
			took = 0 // the warm-up claims (the connection's first plans) are not timed
		}
		start := time.Now()
		rows, err := db.Query(ctx, jobs.ClaimDirtySQL, 0, "shard/0", "w#1", int64(1), []string{"item"}, []int{32}, 32, time.Now(), "shard_0")
		require.NoError(b, err)
		var ids []int64
		var keys []string
		for rows.Next() {
			var id, gen int64
			var kind, key string
			require.NoError(b, rows.Scan(&id, &kind, &key, &gen))
			ids, keys = append(ids, id), append(keys, key)
		}
		require.NoError(b, rows.Err())
		took += time.Since(start)
		require.Len(b, keys, 32)
		// Reconciled: the rows and the batch job go; as many new keys arrive.
		db.MustExec(b, `DELETE FROM compute_dirty WHERE kind = 'item' AND key = ANY($1)`, keys)
		db.MustExec(b, `DELETE FROM river_job WHERE id = ANY($1)`, ids)
		db.MustExec(b, `INSERT INTO compute_dirty (kind, key, shard, not_before)
			SELECT 'item', 'k' || g, 0, compute_now() FROM generate_series($1 + 1, $1 + 32) g`, next)
		next += 32
	}
	return took / time.Duration(n)
}

// growthWarmup untimed operations come before the timed ones of a growth
// benchmark, which times at least growthMinOps (a benchmark whose setup takes
// seconds runs with b.N = 1 under -benchtime 2s, and one operation is noise).
const growthWarmup, growthMinOps = 10, 200

func growthOps(b *testing.B) int { return max(b.N, growthMinOps) }

// BenchmarkGrowthRiverFetch: River's own fetch (the driver's JobGetAvailable,
// as a shard queue's producer runs it, 10 jobs) from a shard queue whose
// river_job holds no finished jobs, and one holding 1,000,000 completed jobs
// (what River's job cleaner keeps: completed jobs for 24 hours by default).
//
//	go test -run '^$' -bench GrowthRiverFetch -benchtime 300x -timeout 30m ./workers/
func BenchmarkGrowthRiverFetch(b *testing.B) {
	growthRatio(b, 0, 1_000_000, growthFetch, "µs/fetch_%d_completed", "fetch_1M/empty")
}

func growthFetch(b *testing.B, completed int) time.Duration {
	ctx := context.Background()
	db := pgtest.New(b, pgtest.Options{StatementTimeout: 10 * time.Minute})
	now := time.Now()
	if completed > 0 {
		db.MustExec(b, `INSERT INTO river_job (args, kind, max_attempts, priority, queue, state, attempt,
				attempted_at, created_at, scheduled_at, finalized_at, tags, metadata)
			SELECT jsonb_build_object('reconciler', 'item', 'keys', jsonb_build_array('k' || g)), 'reconcile_batch', 25, 1, 'shard_0',
			       'completed', 1, $2::timestamptz, $2::timestamptz, $2::timestamptz, $2::timestamptz, '{item}', '{}'
			FROM generate_series(1, $1) g`, completed, now.Add(-time.Hour))
		db.MustExec(b, `VACUUM ANALYZE river_job`)
	}
	exec := riverpgxv5.New(db.Pool.Pool).GetExecutor()
	var took time.Duration
	n := growthOps(b)
	for i := -growthWarmup; i < n; i++ {
		if i == 0 {
			took = 0
		}
		db.MustExec(b, `INSERT INTO river_job (args, kind, max_attempts, priority, queue, state, scheduled_at, tags, metadata)
			SELECT '{"reconciler":"item","key":"x"}', 'reconcile', 25, 1, 'shard_0', 'available', $1::timestamptz, '{}', '{}'
			FROM generate_series(1, 10)`, time.Now().Add(-time.Second))
		at := time.Now()
		start := time.Now()
		got, err := exec.JobGetAvailable(ctx, &riverdriver.JobGetAvailableParams{
			ClientID: "w#1", MaxAttemptedBy: 100, MaxToLock: 10, Now: &at, Queue: "shard_0",
		})
		took += time.Since(start)
		require.NoError(b, err)
		require.Len(b, got.Jobs, 10)
		db.MustExec(b, `UPDATE river_job SET state = 'completed', finalized_at = $1 WHERE state = 'running'`, time.Now())
	}
	return took / time.Duration(n)
}

// BenchmarkGrowthShards: a worker process serving every shard, with 16 shards
// and with 256: its RSS idle (after its leases are all taken) and under the
// end-to-end load (8 writers each committing a change and its DirtyTx, until
// every key is reconciled), and the transactions per second the idle worker
// costs the database (every shard polls once a poll interval).
//
//	go test -run '^$' -bench GrowthShards -benchtime 1x -timeout 30m ./workers/
func BenchmarkGrowthShards(b *testing.B) {
	for _, shards := range []int{16, 256} {
		idle, load, idleTPS, rate := growthShards(b, shards)
		b.ReportMetric(idle/1024, "rss_idle_MB_"+strconv.Itoa(shards))
		b.ReportMetric(load/1024, "rss_load_MB_"+strconv.Itoa(shards))
		b.ReportMetric(idleTPS, "idle_tps_"+strconv.Itoa(shards))
		b.ReportMetric(rate, "e2e/s_"+strconv.Itoa(shards))
	}
}

func growthShards(b *testing.B, shards int) (idleRSS, loadRSS, idleTPS, rate float64) {
	ctx := context.Background()
	db := pgtest.New(b, pgtest.Options{MaxConns: 40})
	db.MustExec(b, `UPDATE compute_settings SET shard_count = $1`, shards)
	db.MustExec(b, `CREATE TABLE bench_items (key text PRIMARY KEY, n bigint NOT NULL DEFAULT 0)`)
	db.MustExec(b, `INSERT INTO bench_items (key) SELECT 'k' || g FROM generate_series(1, $1) g`, benchJobs)
	reg := workers.NewRegistry()
	require.NoError(b, workers.AddReconciler(reg, workers.Reconciler{Kind: "bench_growth",
		Reconcile: func(ctx context.Context, tx pgx.Tx, key string) (workers.Result, error) {
			_, err := tx.Exec(ctx, `UPDATE bench_items SET n = n + 1 WHERE key = $1`, key)
			return workers.Result{}, err
		}}))
	runtime.GC()
	debug.FreeOSMemory()
	rt := workertest.Start(b, db.Pool, reg, &workers.Options{WorkersPerShard: 4, PollInterval: 100 * time.Millisecond})
	workertest.WaitFor(b, time.Minute, "every lease held", func() bool { return len(rt.HeldShards()) == shards })
	time.Sleep(2 * time.Second)
	commits := func() int64 {
		var n int64
		require.NoError(b, db.QueryRow(ctx, `SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()`).Scan(&n))
		return n
	}
	db.MustExec(b, `SELECT pg_stat_clear_snapshot()`)
	c0, t0 := commits(), time.Now()
	samples := []int64{}
	for range 10 {
		time.Sleep(300 * time.Millisecond)
		samples = append(samples, rssKB())
	}
	db.MustExec(b, `SELECT pg_stat_clear_snapshot()`)
	idleTPS = float64(commits()-c0) / time.Since(t0).Seconds()
	sort.Slice(samples, func(i, j int) bool { return samples[i] < samples[j] })
	idleRSS = float64(samples[len(samples)/2])

	start := time.Now()
	write(b, db, func(tx pgx.Tx, _ int, key string) error {
		loadRSS = max(loadRSS, float64(rssKB()))
		return workers.DirtyTx(ctx, tx, "bench_growth", key, nil)
	})
	workertest.WaitFor(b, 5*time.Minute, "reconciles done", func() bool {
		loadRSS = max(loadRSS, float64(rssKB()))
		return db.MustCount(b, `SELECT count(*) FROM compute_dirty`) == 0
	})
	rate = benchJobs / time.Since(start).Seconds()
	require.NoError(b, rt.Stop(ctx))
	return idleRSS, loadRSS, idleTPS, rate
}
