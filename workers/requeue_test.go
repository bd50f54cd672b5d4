package workers_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/platform/clock"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

// TestRequeueAfterWaitsItsDelay: Result{RequeueAfter: d} runs the key again d
// after the run, on the database's clock: the key waits with its not-before at
// the run's compute_now() plus d, is not run while the sim clock stands short
// of it, and runs once the clock reaches it.
func TestRequeueAfterWaitsItsDelay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	start := time.Date(2030, 6, 1, 12, 0, 0, 0, time.UTC)
	require.NoError(t, clock.UseSim(ctx, db.Pool, start))
	db.MustExec(t, `CREATE TABLE requeue_runs (at timestamptz NOT NULL)`)
	const delay = time.Hour
	var runs atomic.Int64
	reg := workers.NewRegistry()
	require.NoError(t, workers.AddReconciler(reg, workers.Reconciler{Kind: "later",
		Reconcile: func(ctx context.Context, tx pgx.Tx, key string) (workers.Result, error) {
			if _, err := tx.Exec(ctx, `INSERT INTO requeue_runs (at) VALUES (compute_now())`); err != nil {
				return workers.Result{}, err
			}
			if runs.Add(1) == 1 {
				return workers.Result{RequeueAfter: delay}, nil
			}
			return workers.Result{}, nil
		}}))
	workertest.Start(t, db.Pool, reg, nil)

	dirty(t, db, "later", "k", 0)
	workertest.WaitFor(t, 30*time.Second, "the first run committed", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM requeue_runs`) == 1
	})
	var notBefore time.Time
	require.NoError(t, db.QueryRow(ctx, `SELECT not_before FROM compute_dirty WHERE kind = 'later' AND key = 'k' AND job_id IS NULL`).Scan(&notBefore))
	require.True(t, notBefore.Equal(start.Add(delay)), "the key waits until the run's time plus the delay: not_before %s, want %s", notBefore, start.Add(delay))

	_, err := clock.Advance(ctx, db.Pool, delay-time.Second)
	require.NoError(t, err)
	// Room for a wrong early run: dozens of 20 ms polls.
	time.Sleep(time.Second)
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM requeue_runs`), "run again a second before its delay was over")

	_, err = clock.Advance(ctx, db.Pool, time.Second)
	require.NoError(t, err)
	workertest.WaitFor(t, 30*time.Second, "the requeued run, once the delay is over on the database's clock", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM requeue_runs`) == 2
	})
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM requeue_runs WHERE at >= $1`, start.Add(delay)))
	workertest.WaitFor(t, 30*time.Second, "the key done", func() bool { return db.MustCount(t, `SELECT count(*) FROM compute_dirty`) == 0 })
}
