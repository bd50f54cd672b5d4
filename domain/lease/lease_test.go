package lease_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/lease"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// withLockTimeout runs fn in a transaction that gives up on any lock after d:
// SQLSTATE 55P03 means fn would have waited.
func withLockTimeout(ctx context.Context, db *pg.Pool, d time.Duration, fn func(tx pgx.Tx) error) error {
	return pg.InTx(ctx, db, nil, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = "+strconv.FormatInt(d.Milliseconds(), 10)); err != nil {
			return err
		}
		return fn(tx)
	})
}

// TestFenceHoldsTakeoverNotRenewal: while a fenced transaction is open, the
// holder's renewal goes through at once, and a takeover (after expiry) waits for
// the transaction to end.
func TestFenceHoldsTakeoverNotRenewal(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)

	a, err := lease.Acquire(ctx, db.Pool, "shard/0", "a", 300*time.Millisecond)
	require.NoError(t, err)
	fenced, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer fenced.Rollback(ctx)
	require.NoError(t, lease.Fence(ctx, fenced, a))

	// The renewal does not wait for the holder's own fenced transaction.
	require.NoError(t, withLockTimeout(ctx, db.Pool, time.Second, func(tx pgx.Tx) error {
		ls, err := lease.Renew(ctx, tx, 300*time.Millisecond, a)
		require.Len(t, ls, 1)
		return err
	}))

	time.Sleep(350 * time.Millisecond) // the lease expires, unrenewed
	// The takeover waits for the fenced transaction: with a lock timeout it fails.
	err = withLockTimeout(ctx, db.Pool, 300*time.Millisecond, func(tx pgx.Tx) error {
		_, err := lease.AcquireMany(ctx, tx, []string{"shard/0"}, "b", time.Minute)
		return err
	})
	require.Equal(t, "55P03", pg.SQLState(err), "the takeover must wait for the fenced transaction, got %v", err)

	require.NoError(t, fenced.Commit(ctx))
	b, err := lease.Acquire(ctx, db.Pool, "shard/0", "b", time.Minute)
	require.NoError(t, err)
	require.Equal(t, a.Epoch+1, b.Epoch)

	// The old holding is fenced now, and cannot renew.
	err = pg.InTx(ctx, db.Pool, nil, func(tx pgx.Tx) error { return lease.Fence(ctx, tx, a) })
	require.True(t, fault.Has(err, fault.Fenced), "got %v", err)
	ls, err := lease.Renew(ctx, db.Pool, time.Minute, a)
	require.NoError(t, err)
	require.Empty(t, ls)
}

// TestAcquireMany: one statement takes free names, renews the caller's, and
// reports the holder of the rest; List shows them all.
func TestAcquireMany(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := lease.Acquire(ctx, db.Pool, "shard/2", "other", time.Minute)
	require.NoError(t, err)

	got, err := lease.AcquireMany(ctx, db.Pool, []string{"shard/1", "shard/2", "shard/3"}, "me", time.Minute)
	require.NoError(t, err)
	owners := map[string]string{}
	for _, l := range got {
		owners[l.Name] = l.Owner
	}
	require.Equal(t, map[string]string{"shard/1": "me", "shard/2": "other", "shard/3": "me"}, owners)

	all, err := lease.List(ctx, db.Pool, "shard/")
	require.NoError(t, err)
	require.Len(t, all, 3)

	_, err = lease.AcquireMany(ctx, db.Pool, []string{"x"}, "", time.Minute)
	require.True(t, fault.Has(err, fault.InvalidArgument))
}
