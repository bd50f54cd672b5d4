package workers_test

import (
	"context"
	"sync/atomic"
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

func TestMain(m *testing.M) { pgtest.Main(m) }

type bumpArgs struct {
	Key string `json:"key"`
}

func (bumpArgs) Kind() string { return "test_bump" }

type bumpWorker struct {
	river.WorkerDefaults[bumpArgs]
}

func (w *bumpWorker) Work(ctx context.Context, job *river.Job[bumpArgs]) error {
	return workers.InTx(ctx, job, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE test_items SET n = n + 1 WHERE key = $1`, job.Args.Key)
		return err
	})
}

func TestSmokeFencedWorkerAndReconcile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	db.MustExec(t, `CREATE TABLE test_items (key text PRIMARY KEY, n int NOT NULL DEFAULT 0, seen int NOT NULL DEFAULT 0)`)
	db.MustExec(t, `INSERT INTO test_items (key) VALUES ('a'), ('b')`)

	var reconciles atomic.Int64
	reg := workers.NewRegistry()
	require.NoError(t, workers.AddWorker(reg, &bumpWorker{}))
	require.NoError(t, workers.AddReconciler(reg, workers.Reconciler{
		Kind: "item",
		Reconcile: func(ctx context.Context, tx pgx.Tx, key string) (workers.Result, error) {
			reconciles.Add(1)
			_, err := tx.Exec(ctx, `UPDATE test_items SET seen = n WHERE key = $1`, key)
			return workers.Result{}, err
		},
	}))
	workertest.Start(t, db.Pool, reg, nil)

	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		q, err := jobs.ShardQueueOfTx(ctx, tx, "a")
		if err != nil {
			return err
		}
		_, err = jobs.InsertTx(ctx, tx, bumpArgs{Key: "a"}, &river.InsertOpts{Queue: q})
		return err
	}))
	workertest.WaitFor(t, 10*time.Second, "bump", func() bool {
		return db.MustCount(t, `SELECT n FROM test_items WHERE key = 'a'`) == 1
	})
	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE test_items SET n = 5 WHERE key = 'b'`); err != nil {
			return err
		}
		return workers.DirtyTx(ctx, tx, "item", "b", nil)
	}))
	workertest.WaitFor(t, 10*time.Second, "reconcile", func() bool {
		return db.MustCount(t, `SELECT seen FROM test_items WHERE key = 'b'`) == 5
	})
	require.Equal(t, 0, db.MustCount(t, `SELECT count(*) FROM compute_dirty`))
}
