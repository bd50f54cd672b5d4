package lease_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/platform/clock"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers/internal/lease"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// withLockTimeout runs fn in a transaction that gives up on any lock after d:
// SQLSTATE 55P03 means fn would have waited.
func withLockTimeout(ctx context.Context, db *pg.Pool, d time.Duration, fn func(tx pgx.Tx) error) error {
	return pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = "+strconv.FormatInt(d.Milliseconds(), 10)); err != nil {
			return err
		}
		return fn(tx)
	})
}

// TestFenceHoldsTakeoverNotRenewal: while a fenced transaction is open, the
// holder's renewal goes through at once, and a takeover (after expiry) waits for
// the transaction to end. The lease expires on the sim clock.
func TestFenceHoldsTakeoverNotRenewal(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	require.NoError(t, clock.UseSim(ctx, db.Pool, time.Now()))

	a, err := lease.Acquire(ctx, db.Pool, "shard/0", "a", 10*time.Second)
	require.NoError(t, err)
	fenced, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer fenced.Rollback(ctx)
	require.NoError(t, lease.FenceTx(ctx, fenced, a))

	// The renewal does not wait for the holder's own fenced transaction. (A
	// lock timeout counts only time spent waiting for a lock, so a slow machine
	// does not trip it.)
	require.NoError(t, withLockTimeout(ctx, db.Pool, time.Second, func(tx pgx.Tx) error {
		ls, err := lease.Renew(ctx, tx, 10*time.Second, a)
		require.Len(t, ls, 1)
		return err
	}))

	_, err = clock.Advance(ctx, db.Pool, 11*time.Second) // the lease expires, unrenewed
	require.NoError(t, err)
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
	err = pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error { return lease.FenceTx(ctx, tx, a) })
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

// TestListShowsAReleasedLease: a released lease (expires_at = -infinity) is
// listed, long expired, beside a held one; doctor and the lease metrics read
// the shard leases this way after a worker's clean stop.
func TestListShowsAReleasedLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	gone, err := lease.Acquire(ctx, db.Pool, "shard/0", "gone", time.Minute)
	require.NoError(t, err)
	_, err = lease.Acquire(ctx, db.Pool, "shard/1", "here", time.Minute)
	require.NoError(t, err)
	require.NoError(t, lease.Release(ctx, db.Pool, gone))

	all, err := lease.List(ctx, db.Pool, "shard/")
	require.NoError(t, err)
	require.Len(t, all, 2)
	require.Equal(t, "gone", all[0].Owner)
	require.True(t, all[0].ExpiresAt.Equal(time.Unix(0, 0)), "released: %s", all[0].ExpiresAt)
	require.True(t, all[1].ExpiresAt.After(time.Now()), "held: %s", all[1].ExpiresAt)
}

// TestHeldTrustsNoExpiredHolding: a keeper whose renewals stop (a paused
// process, before its next round runs) reports a holding as not held once it
// has expired by its own clock, less the safety margin, even though nothing told
// it yet that another owner took it: work fetched meanwhile is not started.
func TestHeldTrustsNoExpiredHolding(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	const ttl = 3 * time.Second // a margin of 300 ms
	k := lease.NewKeeper(lease.KeeperOptions{DB: db.Pool, Owner: "k", TTL: ttl, Renew: ttl / 3})
	k.Want("shard/0")
	// Run until the lease is taken, then no more: renewals have stopped.
	runCtx, stop := context.WithCancel(ctx)
	stopped := make(chan struct{})
	go func() { k.Run(runCtx); close(stopped) }()
	require.Eventually(t, func() bool { _, held := k.Held("shard/0"); return held }, 5*time.Second, 5*time.Millisecond)
	stop()
	<-stopped
	l, held := k.Held("shard/0")
	require.True(t, held)
	require.Equal(t, "k", l.Owner)
	require.Len(t, k.HeldAll(), 1)

	require.Eventually(t, func() bool { _, held := k.Held("shard/0"); return !held }, 5*time.Second, 10*time.Millisecond)
	var left time.Duration
	require.NoError(t, db.QueryRow(ctx, `SELECT extract(epoch FROM expires_at - compute_now()) * interval '1 second' FROM compute_leases WHERE name = 'shard/0'`).Scan(&left))
	require.Positive(t, left, "Held gave the holding up before it expired in the database (by the margin)")
	require.Len(t, k.HeldAll(), 1, "the keeper has not been told of a loss: only Held distrusts the holding")
}

// TestKeeperRetriesQuicklyAfterAnOutage: while the database cannot be reached,
// the keeper's rounds come every FailedRoundRetry (not once a renewal interval
// or a standby poll), so the leases it lost come back as soon as the server
// accepts connections again.
func TestKeeperRetriesQuicklyAfterAnOutage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	proxy := pgtest.StartCancelCounter(t, db.URL)
	pool, err := pg.Open(ctx, pg.Options{URL: proxy.URL(db.URL), MaxConns: 4})
	require.NoError(t, err)
	defer pool.Close()

	const ttl = 3 * time.Second // renewal every second
	k := lease.NewKeeper(lease.KeeperOptions{DB: pool, Owner: "k", TTL: ttl})
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go k.Run(runCtx)
	k.Want("shard/0")
	require.Eventually(t, func() bool { _, ok := k.Held("shard/0"); return ok }, 10*time.Second, 10*time.Millisecond)

	proxy.Down()
	before := proxy.Dials()
	time.Sleep(ttl + time.Second) // the lease is lost by the keeper's own clock
	_, held := k.Held("shard/0")
	require.False(t, held)
	tries := proxy.Dials() - before
	// Once a renewal interval (1 s) or a standby poll (1 s) would be about 4
	// tries in these 4 s; every FailedRoundRetry (100 ms) is about 40.
	require.GreaterOrEqual(t, tries, int64(15), "rounds during the outage")

	proxy.Up()
	up := time.Now()
	require.Eventually(t, func() bool { _, ok := k.Held("shard/0"); return ok }, 10*time.Second, 5*time.Millisecond)
	t.Logf("%d connection attempts in %s down; the lease was back %s after the server returned",
		tries, ttl+time.Second, time.Since(up).Round(time.Millisecond))
}
