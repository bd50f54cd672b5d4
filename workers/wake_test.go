package workers_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

// TestTheScoutWakesAQueueBeforeItsOwnPoll: a shard queue's producer polls on
// its own only every IdleQueuePollFactor poll intervals (at least 30 s); a job
// that another transaction inserts, with no wake in this process, still runs
// within a few poll intervals, because the scout finds it due, in one
// statement for every shard, and wakes the producer. Each of several jobs
// inserted over time waits far less than the producer's own poll.
func TestTheScoutWakesAQueueBeforeItsOwnPoll(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	db.MustExec(t, `CREATE TABLE test_items (key text PRIMARY KEY, n int NOT NULL DEFAULT 0, seen int NOT NULL DEFAULT 0)`)
	db.MustExec(t, `INSERT INTO test_items (key) SELECT 'k' || g FROM generate_series(1, 5) g`)
	reg := workers.NewRegistry()
	require.NoError(t, workers.AddWorker(reg, &bumpWorker{}))
	const poll = 100 * time.Millisecond
	workertest.Start(t, db.Pool, reg, &workers.Options{PollInterval: poll})
	ownPoll := max(workers.IdleQueuePollFactor*poll, workers.MinIdleQueuePoll)

	time.Sleep(time.Second) // every producer past its first fetch, idle
	for i := 1; i <= 5; i++ {
		key := "k" + string(rune('0'+i))
		var at time.Time
		require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
			q, err := jobs.ShardQueueOfTx(ctx, tx, key)
			if err != nil {
				return err
			}
			_, err = jobs.InsertTx(ctx, tx, bumpArgs{Key: key}, &river.InsertOpts{Queue: q})
			at = time.Now()
			return err
		}))
		workertest.WaitFor(t, ownPoll, "the job of "+key, func() bool {
			return db.MustCount(t, `SELECT n FROM test_items WHERE key = $1`, key) == 1
		})
		took := time.Since(at)
		require.Less(t, took, ownPoll/6, "%s ran %s after its insert: the producer's own poll, not the scout's wake", key, took)
		time.Sleep(300 * time.Millisecond)
	}
}

// TestAPausedShardQueueStaysPaused: the producers of the shard queues read
// their queue's settings from one list shared by all of them (an idle
// process's load does not grow with its shards); a pause written in
// river_queue, as River UI's pause button writes it, still stops the queue,
// and a resume starts it again.
func TestAPausedShardQueueStaysPaused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	db.MustExec(t, `CREATE TABLE test_items (key text PRIMARY KEY, n int NOT NULL DEFAULT 0, seen int NOT NULL DEFAULT 0)`)
	db.MustExec(t, `INSERT INTO test_items (key) VALUES ('a')`)
	reg := workers.NewRegistry()
	require.NoError(t, workers.AddWorker(reg, &bumpWorker{}))
	workertest.Start(t, db.Pool, reg, &workers.Options{PollInterval: 100 * time.Millisecond})
	var queue string
	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) (err error) {
		queue, err = jobs.ShardQueueOfTx(ctx, tx, "a")
		return err
	}))
	workertest.WaitFor(t, 10*time.Second, "the queue is worked", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM river_queue WHERE name = $1`, queue) == 1
	})
	db.MustExec(t, `UPDATE river_queue SET paused_at = compute_now() WHERE name = $1`, queue)
	time.Sleep(4 * time.Second) // two settings polls (2 s) and a list's life (1 s)
	insert := func() {
		require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
			_, err := jobs.InsertTx(ctx, tx, bumpArgs{Key: "a"}, &river.InsertOpts{Queue: queue})
			return err
		}))
	}
	insert()
	time.Sleep(2 * time.Second)
	require.Zero(t, db.MustCount(t, `SELECT n FROM test_items WHERE key = 'a'`), "a paused queue runs nothing")
	db.MustExec(t, `UPDATE river_queue SET paused_at = NULL WHERE name = $1`, queue)
	workertest.WaitFor(t, 10*time.Second, "resumed, the queue runs the job", func() bool {
		return db.MustCount(t, `SELECT n FROM test_items WHERE key = 'a'`) == 1
	})
}
