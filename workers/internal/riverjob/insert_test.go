package riverjob_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/internal/riverjob"
)

type shipArgs struct {
	OrderID string `json:"order_id"`
}

func (shipArgs) Kind() string { return "ship_order" }

type noteArgs struct{}

func (noteArgs) Kind() string { return "note" }

func TestInsertForKeyTxRoutesByKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	for _, key := range []string{"order-1", "order-2", "order-3", "order-4"} {
		var queue string
		require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
			res, err := workers.InsertForKeyTx(ctx, tx, key, shipArgs{OrderID: key}, &river.InsertOpts{Priority: 2})
			if err == nil {
				queue = res.Job.Queue
				require.Equal(t, 2, res.Job.Priority, "the other options are kept")
			}
			return err
		}))
		require.Equal(t, jobs.ShardQueue(jobs.ShardOf(key, pgtest.DefaultShardCount)), queue, key)
	}
	bad := []struct {
		key  string
		opts *river.InsertOpts
	}{
		{"", nil},
		{string(make([]byte, riverjob.MaxKeyLen+1)), nil},
		{"order-1", &river.InsertOpts{Queue: river.QueueDefault}},
		{"order-1", &river.InsertOpts{Queue: jobs.ShardQueue((jobs.ShardOf("order-1", pgtest.DefaultShardCount) + 1) % pgtest.DefaultShardCount)}},
	}
	for _, b := range bad {
		err := pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
			_, err := workers.InsertForKeyTx(ctx, tx, b.key, shipArgs{}, b.opts)
			return err
		})
		require.True(t, fault.Has(err, fault.InvalidArgument), "key %q opts %+v: %v", b.key, b.opts, err)
	}
	require.Equal(t, 4, db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'ship_order'`))
}

func TestFencedKindOutsideShardQueuesIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	insert := func(args river.JobArgs, opts *river.InsertOpts) error {
		return pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
			_, err := jobs.InsertTx(ctx, tx, args, opts)
			return err
		})
	}
	// Not recorded yet: River's default queue takes it (and doctor would flag it).
	require.NoError(t, insert(shipArgs{OrderID: "early"}, nil))

	require.NoError(t, riverjob.RecordFencedKinds(ctx, db.Pool, []string{"ship_order"}))
	require.NoError(t, riverjob.RecordFencedKinds(ctx, db.Pool, []string{"ship_order"}), "recording again is a no-op")
	for _, opts := range []*river.InsertOpts{nil, {Queue: river.QueueDefault}, {Queue: jobs.MaintenanceQueue}, {Queue: "orders"}} {
		err := insert(shipArgs{OrderID: "o"}, opts)
		require.True(t, fault.Has(err, fault.InvalidArgument), "opts %+v: %v", opts, err)
		require.Contains(t, err.Error(), "InsertForKeyTx")
	}
	// The same through a River client the application made itself.
	client, err := river.NewClient(riverpgxv5.New(db.Pool.Pool), &river.Config{})
	require.NoError(t, err)
	_, err = client.Insert(ctx, shipArgs{OrderID: "raw"}, nil)
	require.True(t, fault.Has(pg.Translate(err), fault.InvalidArgument), "%v", err)
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'ship_order'`), "only the early job")

	// A job moved out of its shard queue is refused too.
	require.NoError(t, insert(shipArgs{OrderID: "ok"}, &river.InsertOpts{Queue: jobs.ShardQueue(0)}))
	_, err = db.Pool.Exec(ctx, `UPDATE river_job SET queue = 'default' WHERE kind = 'ship_order' AND queue = $1`, jobs.ShardQueue(0))
	require.True(t, fault.Has(pg.Translate(err), fault.InvalidArgument), "%v", err)

	// Other kinds are untouched.
	require.NoError(t, insert(noteArgs{}, nil))
	require.NoError(t, insert(noteArgs{}, &river.InsertOpts{Queue: "anything"}))
}
