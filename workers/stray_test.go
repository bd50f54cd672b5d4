package workers_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/internal/lease"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

// insertRunning writes a job of kind test_bump into queue as River's fetch would
// have left it: running, attempted by client, attempted at.
func insertRunning(t *testing.T, db *pgtest.DB, queue, client string, attemptedAt time.Time) int64 {
	t.Helper()
	var id int64
	require.NoError(t, db.QueryRow(context.Background(), `INSERT INTO river_job
		(args, kind, max_attempts, priority, queue, state, attempt, attempted_at, attempted_by, scheduled_at)
		VALUES ('{"key":"a"}', 'test_bump', 25, 1, $1, 'running', 1, $3, ARRAY[$2], $3) RETURNING id`,
		queue, client, attemptedAt).Scan(&id))
	return id
}

// TestHolderHandsBackStrayJobs: the holder of a shard lease owns every running
// job of its queue. A job there attempted by another client (a paused process
// that woke, fetched and died: no takeover will ever come, since the holder
// never changed) is handed back by the holder within one renewal interval and
// worked; the holder's own running jobs are left alone, unless none of its
// goroutines works one that it attempted long ago.
func TestHolderHandsBackStrayJobs(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	db.MustExec(t, `CREATE TABLE test_items (key text PRIMARY KEY, n int NOT NULL DEFAULT 0)`)
	db.MustExec(t, `INSERT INTO test_items (key) VALUES ('a')`)
	reg := workers.NewRegistry()
	require.NoError(t, workers.AddWorker(reg, &bumpWorker{}))
	rt := workertest.Start(t, db.Pool, reg, &workers.Options{Shards: []int{3}, LeaseTTL: 6 * time.Second, LeaseRenew: 500 * time.Millisecond})
	workertest.WaitFor(t, 10*time.Second, "the worker holds shard 3", func() bool { return len(rt.HeldShards()) == 1 })
	epoch := db.MustCount(t, `SELECT epoch FROM compute_leases WHERE name = 'shard/3'`)

	// The holder's own running job, attempted moments ago (as if River had just
	// fetched it), a stray attempted by a dead process, and a job of its own
	// attempted a minute ago that none of its goroutines works: its outcome was
	// lost (River's completer could not record it while the database was away).
	own := insertRunning(t, db, "shard_3", rt.Owner(), time.Now().Add(30*time.Second))
	inserted := time.Now()
	stray := insertRunning(t, db, "shard_3", "dead-process", time.Now().Add(-time.Second))
	lost := insertRunning(t, db, "shard_3", rt.Owner(), time.Now().Add(-time.Minute))

	workertest.WaitFor(t, 10*time.Second, "the stray job is handed back and worked", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM river_job WHERE id = $1 AND state = 'completed'`, stray) == 1
	})
	took := time.Since(inserted)
	t.Logf("stray job worked %s after it appeared (renewal interval 500ms)", took.Round(time.Millisecond))
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM river_job, unnest(errors) e
		WHERE id = $1 AND e->>'error' LIKE 'handed back by ' || $2 || '%after a lease round%dead-process%'`, stray, rt.Owner()),
		"the job's errors say who handed it back, and whose attempt it was")
	require.Equal(t, "running", jobState(t, db, own), "the holder's own recent running job is not handed back")
	workertest.WaitFor(t, 10*time.Second, "the job whose outcome was lost is handed back and worked", func() bool {
		return jobState(t, db, lost) == "completed"
	})
	// Room for a wrong thing: two more lease rounds, each of which could hand
	// a job back again; nothing runs twice.
	for range 2 {
		before := leaseExpiry(t, db, workers.ShardLease(3))
		workertest.WaitFor(t, 10*time.Second, "a renewal", func() bool { return leaseExpiry(t, db, workers.ShardLease(3)).After(before) })
	}
	require.Equal(t, 2, db.MustCount(t, `SELECT n FROM test_items WHERE key = 'a'`), "the two handed-back jobs worked exactly once each")
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM river_job, unnest(errors) e
		WHERE id = $1 AND e->>'error' LIKE '%its own attempt ended without a recorded outcome'`, lost))
	require.Equal(t, epoch, db.MustCount(t, `SELECT epoch FROM compute_leases WHERE name = 'shard/3'`), "no takeover was needed")
}

// TestNoHandBackWithoutTheLease: a process that does not hold a shard's lease
// (a standby) never hands back that shard's running jobs, whoever attempted
// them: only the holder owns them.
func TestNoHandBackWithoutTheLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	db.MustExec(t, `CREATE TABLE test_items (key text PRIMARY KEY, n int NOT NULL DEFAULT 0)`)
	reg := workers.NewRegistry()
	require.NoError(t, workers.AddWorker(reg, &bumpWorker{}))
	// Another owner holds shard 4 for a long time; this worker stands by for it
	// and holds shard 5.
	_, err := lease.Acquire(ctx, db.Pool, workers.ShardLease(4), "the-holder", time.Minute)
	require.NoError(t, err)
	rt := workertest.Start(t, db.Pool, reg, &workers.Options{Shards: []int{4, 5}, LeaseTTL: 6 * time.Second, LeaseRenew: 500 * time.Millisecond})
	workertest.WaitFor(t, 10*time.Second, "the worker holds shard 5", func() bool { return len(rt.HeldShards()) == 1 })
	other := insertRunning(t, db, "shard_4", "someone-else", time.Now().Add(-time.Minute))
	mine := insertRunning(t, db, "shard_5", "someone-else", time.Now().Add(-time.Minute))

	workertest.WaitFor(t, 10*time.Second, "the stray of the held shard is handed back", func() bool {
		return jobState(t, db, mine) != "running"
	})
	// Several more renewals: the other shard's job stays as it is.
	for range 4 {
		before := leaseExpiry(t, db, workers.ShardLease(5))
		workertest.WaitFor(t, 10*time.Second, "a renewal", func() bool { return leaseExpiry(t, db, workers.ShardLease(5)).After(before) })
	}
	require.Equal(t, "running", jobState(t, db, other), "a standby handed back a job of a shard it does not hold")
}

func jobState(t *testing.T, db *pgtest.DB, id int64) string {
	t.Helper()
	var s string
	require.NoError(t, db.QueryRow(context.Background(), `SELECT state::text FROM river_job WHERE id = $1`, id).Scan(&s))
	return s
}

func leaseExpiry(t *testing.T, db *pgtest.DB, name string) time.Time {
	t.Helper()
	var at time.Time
	require.NoError(t, db.QueryRow(context.Background(), `SELECT expires_at FROM compute_leases WHERE name = $1`, name).Scan(&at))
	return at
}
