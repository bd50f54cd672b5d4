package tenancy_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/tenancy"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

// take runs compute_take_fair for shard 0 (batches of 10 keys of kind r),
// after group after, in a transaction it commits, and returns the tenant of
// the keys it took ("" for none) and how many.
func take(t *testing.T, db *pgtest.DB, after string) (string, int) {
	t.Helper()
	ctx := context.Background()
	var tenant string
	n := 0
	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT coalesce(tenant, '') FROM compute_take_fair(0, 'shard/0', 'me', 1, '{r}', '{10}', '{}', '{}', $1)`, after)
		if err != nil {
			return err
		}
		ts, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		for _, x := range ts {
			require.Equal(t, ts[0], x, "a batch serves one group")
		}
		if len(ts) > 0 {
			tenant = ts[0]
		}
		n = len(ts)
		return nil
	}))
	return tenant, n
}

// TestBatchesTakeTenantsKeysRoundRobin: a's 50 older keys do not keep b's
// key or the key of no tenant waiting: the takes serve a, b, then no
// tenant, each after the group before; a suspended tenant's keys are left,
// the others still taken.
func TestBatchesTakeTenantsKeysRoundRobin(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	db.MustExec(t, `INSERT INTO compute_leases (name, owner, epoch, expires_at) VALUES ('shard/0', 'me', 1, compute_now() + interval '1 hour')`)
	db.MustExec(t, `SELECT compute_mark_dirty('r', 'a' || g, 0, NULL, NULL, 'a') FROM generate_series(1, 50) g`)
	db.MustExec(t, `SELECT compute_mark_dirty('r', 'b1', 0, NULL, NULL, 'b')`)
	db.MustExec(t, `SELECT compute_mark_dirty('r', 'plain', 0, NULL, NULL, NULL)`)
	db.MustExec(t, `UPDATE compute_dirty SET shard = 0`)

	g, n := take(t, db, "")
	require.Equal(t, "a", g)
	require.Equal(t, 10, n)
	g, n = take(t, db, "a")
	require.Equal(t, "b", g, "after a, b: not a's backlog")
	require.Equal(t, 1, n)
	g, n = take(t, db, "b")
	require.Equal(t, "", g, "after b, the keys of no tenant")
	require.Equal(t, 1, n)
	g, _ = take(t, db, "")
	require.Equal(t, "a", g, "round again")

	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error { return tenancy.SuspendTx(ctx, tx, "a", "") }))
	// (The takes above committed without finishing their keys: all still wait.)
	for _, after := range []string{"", "a", "b", ""} {
		g, _ = take(t, db, after)
		require.NotEqual(t, "a", g, "a suspended tenant's keys are held (after %q)", after)
	}
	require.Equal(t, 50, db.MustCount(t, `SELECT count(*) FROM compute_dirty WHERE tenant = 'a'`),
		"the takes committed without finishing: held keys are not lost")
	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error { return tenancy.ResumeTx(ctx, tx, "a") }))
	g, n = take(t, db, "")
	require.Equal(t, "a", g)
	require.Equal(t, 10, n)
}
