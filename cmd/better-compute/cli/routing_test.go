package cli_test

import (
	"context"
	"errors"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/cmd/better-compute/cli"
	"github.com/bettercompute/bettercompute/cmd/better-compute/cli/clitest"
	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

type shipArgs struct {
	OrderID string `json:"order_id"`
}

func (shipArgs) Kind() string { return "ship_order" }

type shipWorker struct{ river.WorkerDefaults[shipArgs] }

func (w *shipWorker) Work(ctx context.Context, job *river.Job[shipArgs]) error {
	return workers.InTx(ctx, job, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE orders SET state = 'shipped' WHERE id = $1`, job.Args.OrderID)
		return err
	})
}

type orphanArgs struct{}

func (orphanArgs) Kind() string { return "orphan" }

func shippingApp() cli.App {
	return cli.App{Name: "shop", Modules: []cli.Module{{
		Name: "shop",
		Migrations: fstest.MapFS{"0001_orders.sql": {Data: []byte(
			`CREATE TABLE orders (id text PRIMARY KEY, state text NOT NULL DEFAULT 'paid');`)}},
		Register: func(r *workers.Registry) error { return workers.AddWorker(r, &shipWorker{}) },
	}}}
}

// TestAFencedJobCannotBeStranded is the newcomer's silent failure, now loud: a
// fenced job (its worker registered with workers.AddWorker) inserted without a
// shard queue is refused (INVALID_ARGUMENT) from the first migrate on; routed by
// its key it runs; and doctor FAILs, naming each queue and its count, when jobs
// wait where no worker works (River's default queue, a shard beyond the count).
func TestAFencedJobCannotBeStranded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{Empty: true})
	app := shippingApp()
	r := clitest.Run(t, ctx, app, dbEnv(db), "migrate")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM compute_fenced_kinds WHERE kind = 'ship_order'`), "migrate records the app's fenced kinds")
	db.MustExec(t, `INSERT INTO orders (id) VALUES ('o-1'), ('o-2')`)

	err := pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		_, err := jobs.InsertTx(ctx, tx, shipArgs{OrderID: "o-1"}, nil)
		return err
	})
	require.True(t, fault.Has(err, fault.InvalidArgument), "%v", err)
	require.Contains(t, err.Error(), "workers.InsertForKeyTx")
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'ship_order'`))

	// Routed by key, a worker of the app's registry runs it.
	reg, err := app.Registry()
	require.NoError(t, err)
	rt := workertest.Start(t, db.Pool, reg, nil)
	defer func() { _ = rt.Stop(context.Background()) }()
	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		return errors.Join(
			func() error {
				_, err := workers.InsertForKeyTx(ctx, tx, "o-1", shipArgs{OrderID: "o-1"}, nil)
				return err
			}(),
			func() error {
				_, err := workers.InsertForKeyTx(ctx, tx, "o-2", shipArgs{OrderID: "o-2"}, nil)
				return err
			}(),
		)
	}))
	workertest.WaitFor(t, 20*time.Second, "both orders shipped", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM orders WHERE state = 'shipped'`) == 2
	})
	requireAllOK(t, clitest.Run(t, ctx, app, dbEnv(db), "doctor"))

	// Jobs no worker will ever take: doctor names the queues and the counts.
	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		for _, q := range []string{river.QueueDefault, river.QueueDefault, jobs.ShardQueue(pgtest.DefaultShardCount)} {
			if _, err := jobs.InsertTx(ctx, tx, orphanArgs{}, &river.InsertOpts{Queue: q}); err != nil {
				return err
			}
		}
		_, err := jobs.InsertTx(ctx, tx, orphanArgs{}, &river.InsertOpts{Queue: "later", ScheduledAt: time.Now().Add(time.Hour)})
		return err
	}))
	r = clitest.Run(t, ctx, app, dbEnv(db), "doctor")
	require.Equal(t, 1, r.Code, r.Stdout)
	require.Regexp(t, `(?m)^FAIL\s+queues\s+jobs wait in queues no worker works.*default: 2 jobs; later: 1 job; shard_16: 1 job \(`, r.Stdout)
}
