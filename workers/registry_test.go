package workers_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/internal/riverjob"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

type sweepArgs struct{}

func (sweepArgs) Kind() string { return "test_sweep" }

type sweepWorker struct {
	river.WorkerDefaults[sweepArgs]
}

func (*sweepWorker) Work(context.Context, *river.Job[sweepArgs]) error { return nil }

// TestRegistrationsReturnErrors: every registration is a function of the
// registry returning an error, never a panic, so a module's Register is one
// errors.Join that reports every mistake at once.
func TestRegistrationsReturnErrors(t *testing.T) {
	t.Parallel()
	reg := workers.NewRegistry()
	rec := workers.Reconciler{Kind: "item", Reconcile: func(context.Context, pgx.Tx, string) (workers.Result, error) { return workers.Result{}, nil }}
	require.NoError(t, errors.Join(
		workers.AddWorker(reg, &bumpWorker{}),
		workers.AddMaintenanceWorker(reg, &sweepWorker{}),
		workers.AddReconciler(reg, rec),
		workers.AddPeriodic(reg, river.NewPeriodicJob(river.PeriodicInterval(60e9), func() (river.JobArgs, *river.InsertOpts) {
			return sweepArgs{}, &river.InsertOpts{Queue: jobs.MaintenanceQueue}
		}, nil)),
	))
	require.Equal(t, []string{riverjob.ReconcileKind, jobs.ReconcileBatchKind, "test_bump"}, reg.FencedKinds(), "AddWorker kinds are fenced; maintenance kinds are not")

	err := errors.Join(
		workers.AddWorker(reg, &bumpWorker{}),
		workers.AddMaintenanceWorker(reg, &sweepWorker{}),
		workers.AddReconciler(reg, rec),
		workers.AddReconciler(reg, workers.Reconciler{Kind: "Bad Kind"}),
		workers.AddPeriodic(reg, nil),
		workers.AddWorker[bumpArgs](reg, nil),
	)
	require.True(t, fault.Has(err, fault.InvalidConfig), "%v", err)
	for _, want := range []string{`"test_bump" is registered twice`, `"test_sweep" is registered twice`, "item is registered twice", "bad reconciler", "nil periodic job"} {
		require.ErrorContains(t, err, want)
	}
	require.Equal(t, []string{riverjob.ReconcileKind, jobs.ReconcileBatchKind, "test_bump"}, reg.FencedKinds(), "a refused registration adds nothing")
}

// TestWorkerStartRecordsFencedKinds: a worker process records its registry's
// fenced kinds before it works anything, so an insert of one outside the shard
// queues is refused even in a database that no migrate of this binary touched.
func TestWorkerStartRecordsFencedKinds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	insertDefault := func() error {
		return pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
			_, err := jobs.InsertTx(ctx, tx, bumpArgs{Key: "k"}, nil)
			return err
		})
	}
	require.NoError(t, insertDefault(), "nothing recorded yet")
	db.MustExec(t, `DELETE FROM river_job`)

	reg := workers.NewRegistry()
	require.NoError(t, workers.AddWorker(reg, &bumpWorker{}))
	rt := workertest.Start(t, db.Pool, reg, nil)
	defer func() { _ = rt.Stop(context.Background()) }()
	err := insertDefault()
	require.True(t, fault.Has(err, fault.InvalidArgument), "%v", err)
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM river_job`))
}
