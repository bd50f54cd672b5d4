package pg_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

// TestAfterCommitRunsOnlyAfterTheTopLevelCommit: a hook runs once its
// transaction commits (not at a savepoint's release), never after a
// rollback, and not in the connection's next transaction.
func TestAfterCommitRunsOnlyAfterTheTopLevelCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{Empty: true, MaxConns: 2})
	var ran atomic.Int32
	var seenCommitted atomic.Bool
	hook := func() { ran.Add(1) }

	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `CREATE TABLE t (n int)`); err != nil {
			return err
		}
		require.True(t, pg.AfterCommit(tx, func() {
			// Committed: another connection sees the table.
			var n int
			seenCommitted.Store(db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM t`).Scan(&n) == nil)
			hook()
		}))
		return pg.InTx(ctx, tx, func(ctx context.Context, sp pgx.Tx) error {
			require.True(t, pg.AfterCommit(sp, hook))
			return nil
		})
	}))
	require.Equal(t, int32(2), ran.Load(), "both hooks ran after the COMMIT")
	require.True(t, seenCommitted.Load(), "the hook ran once the transaction was visible")

	err := pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		pg.AfterCommit(tx, hook)
		return errors.New("roll back")
	})
	require.Error(t, err)
	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error { return nil }))
	require.Equal(t, int32(2), ran.Load(), "a rolled-back transaction's hook never runs, then or later")

	conn, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	require.False(t, pg.AfterCommit(tx, hook), "a transaction of a connection this package did not open cannot tell its commit")
	require.NoError(t, tx.Rollback(ctx))
}
