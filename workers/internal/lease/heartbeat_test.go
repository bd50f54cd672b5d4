package lease_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers/internal/lease"
)

// takeovers reads compute_lease_takeovers: the count of each reason.
func takeovers(t *testing.T, db *pgtest.DB) map[string]int {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `SELECT reason, count FROM compute_lease_takeovers`)
	require.NoError(t, err)
	out := map[string]int{}
	for rows.Next() {
		var r string
		var n int
		require.NoError(t, rows.Scan(&r, &n))
		out[r] = n
	}
	require.NoError(t, rows.Err())
	return out
}

// silence makes identity's last heartbeat d ago, as if its process had stopped
// beating then (killed, paused, cut off).
func silence(t *testing.T, db *pgtest.DB, identity string, d time.Duration) {
	t.Helper()
	db.MustExec(t, `UPDATE compute_workers SET seen_at = compute_now() - make_interval(secs => $2) WHERE identity = $1`,
		identity, d.Seconds())
}

// TestAnotherIdentityTakesTheLeasesOfASilentWorker: while a worker beats,
// another identity cannot take its unexpired lease; once it has been silent for
// its dead_after (heartbeat × missed beats), any owner takes it at once, an hour
// before its expiry, with a new epoch. The silent holder is fenced, its
// renewal finds the lease gone, and the takeover is counted as heartbeat_lost.
func TestAnotherIdentityTakesTheLeasesOfASilentWorker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)

	a, err := lease.Claim(ctx, db.Pool, lease.ClaimOptions{Identity: "host-a/0", Heartbeat: time.Second, MissedBeats: 3})
	require.NoError(t, err)
	require.Equal(t, 3*time.Second, a.DeadAfter())
	held, err := lease.Acquire(ctx, db.Pool, "shard/0", a.Owner(), time.Hour)
	require.NoError(t, err)
	b, err := lease.Claim(ctx, db.Pool, lease.ClaimOptions{Identity: "host-b/0"})
	require.NoError(t, err)

	// Beaten 2.9 s ago: alive, by its own dead_after of 3 s.
	silence(t, db, "host-a/0", 2900*time.Millisecond)
	_, err = lease.Acquire(ctx, db.Pool, "shard/0", b.Owner(), time.Minute)
	require.True(t, fault.Has(err, fault.Conflict), "a live holder keeps its lease: %v", err)

	silence(t, db, "host-a/0", 3100*time.Millisecond)
	got, err := lease.Acquire(ctx, db.Pool, "shard/0", b.Owner(), time.Minute)
	require.NoError(t, err)
	require.Equal(t, held.Epoch+1, got.Epoch)
	require.Equal(t, map[string]int{lease.ReasonHeartbeatLost: 1}, takeovers(t, db))
	var from, to string
	require.NoError(t, db.QueryRow(ctx, `SELECT last_from, last_to FROM compute_lease_takeovers`).Scan(&from, &to))
	require.Equal(t, [2]string{a.Owner(), b.Owner()}, [2]string{from, to})

	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	require.True(t, fault.Has(lease.FenceTx(ctx, tx, held), fault.Fenced), "the silent holder is fenced")
	require.NoError(t, tx.Rollback(ctx))
	renewed, err := lease.Renew(ctx, db.Pool, time.Hour, held)
	require.NoError(t, err)
	require.Empty(t, renewed)

	// The silent worker beats again: it is a live standby now, and b, live,
	// keeps the lease against it.
	require.NoError(t, a.Beat(ctx))
	_, err = lease.Acquire(ctx, db.Pool, "shard/0", a.Owner(), time.Minute)
	require.True(t, fault.Has(err, fault.Conflict), "%v", err)
}

// TestHeartbeatTakeoverNeedsADeclaredDeadline: a worker row from a binary
// before heartbeat takeovers declares no dead_after: its leases are taken at
// expiry only, however long it has been silent. An owner that is not a worker
// incarnation is never judged by a heartbeat.
func TestHeartbeatTakeoverNeedsADeclaredDeadline(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	a, err := lease.Claim(ctx, db.Pool, lease.ClaimOptions{Identity: "old"})
	require.NoError(t, err)
	_, err = lease.Acquire(ctx, db.Pool, "shard/0", a.Owner(), time.Hour)
	require.NoError(t, err)
	_, err = lease.Acquire(ctx, db.Pool, "sink/x", "plain-owner", time.Hour)
	require.NoError(t, err)
	db.MustExec(t, `UPDATE compute_workers SET dead_after = NULL WHERE identity = 'old'`)
	silence(t, db, "old", time.Hour)

	for _, name := range []string{"shard/0", "sink/x"} {
		_, err = lease.Acquire(ctx, db.Pool, name, "new#1", time.Minute)
		require.True(t, fault.Has(err, fault.Conflict), "%s: %v", name, err)
	}
	require.Empty(t, takeovers(t, db))
}

// TestStandbysThatJudgeTogetherTakeOnce: many standbys find the holder silent at
// once; exactly one takes the lease (epoch + 1), and none takes it from that one
// in turn, though each judged the lease takeable.
func TestStandbysThatJudgeTogetherTakeOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{MaxConns: 20})
	a, err := lease.Claim(ctx, db.Pool, lease.ClaimOptions{Identity: "dead", Heartbeat: 100 * time.Millisecond, MissedBeats: 2})
	require.NoError(t, err)
	names := make([]string, 8)
	for i := range names {
		names[i] = "shard/" + string(rune('a'+i))
	}
	held, err := lease.AcquireMany(ctx, db.Pool, names, a.Owner(), time.Hour)
	require.NoError(t, err)
	require.Len(t, held, len(names))
	silence(t, db, "dead", time.Minute)

	const standbys = 12
	owners := make([]string, standbys)
	for i := range owners {
		inc, err := lease.Claim(ctx, db.Pool, lease.ClaimOptions{Identity: "standby-" + string(rune('a'+i))})
		require.NoError(t, err)
		owners[i] = inc.Owner()
	}
	var wg sync.WaitGroup
	var taken atomic.Int64
	start := make(chan struct{})
	for _, o := range owners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			ls, err := lease.AcquireMany(ctx, db.Pool, names, o, time.Minute)
			if err != nil {
				t.Error(err)
				return
			}
			for _, l := range ls {
				if l.Owner == o {
					taken.Add(1)
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	require.Equal(t, int64(len(names)), taken.Load(), "each lease taken exactly once")
	require.Equal(t, len(names), db.MustCount(t, `SELECT count(*) FROM compute_leases WHERE epoch = 2`),
		"no lease changed hands twice")
	require.Equal(t, map[string]int{lease.ReasonHeartbeatLost: len(names)}, takeovers(t, db))
}

// TestKeeperTakesAtTheHolderHeartbeatDeadline: a standby keeper waiting for a
// lease whose holder stops beating takes it once the holder's dead_after has
// passed since its last beat (not at the lease's expiry, a minute later), and
// reports the takeover's reason.
func TestKeeperTakesAtTheHolderHeartbeatDeadline(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	db := pgtest.New(t)
	a, err := lease.Claim(ctx, db.Pool, lease.ClaimOptions{Identity: "a", Heartbeat: 200 * time.Millisecond, MissedBeats: 4})
	require.NoError(t, err)
	_, err = lease.Acquire(ctx, db.Pool, "shard/0", a.Owner(), time.Minute)
	require.NoError(t, err)
	beating, stopBeating := context.WithCancel(ctx)
	go a.Run(beating, lease.Hooks{Superseded: func(error) {}})

	b, err := lease.Claim(ctx, db.Pool, lease.ClaimOptions{Identity: "b"})
	require.NoError(t, err)
	got := make(chan lease.Acquired, 1)
	k := lease.NewKeeper(lease.KeeperOptions{DB: db.Pool, Owner: b.Owner(), TTL: time.Minute,
		OnAcquired: func(x lease.Acquired) { got <- x }})
	k.Want("shard/0")
	go k.Run(ctx)

	// While a beats, b waits: a few of its deadlines pass.
	select {
	case x := <-got:
		t.Fatalf("the standby took a live holder's lease: %+v", x)
	case <-time.After(2 * time.Second):
	}
	stopBeating()
	stopped := time.Now()
	select {
	case x := <-got:
		took := time.Since(stopped)
		require.Equal(t, lease.ReasonHeartbeatLost, x.Reason)
		require.Equal(t, a.Owner(), x.Previous)
		require.Less(t, took, 30*time.Second, "taken before the lease's expiry")
		t.Logf("taken %s after the holder's last beat (dead_after %s)", took.Round(time.Millisecond), a.DeadAfter())
	case <-time.After(45 * time.Second):
		t.Fatal("the standby did not take the silent holder's lease")
	}
}

// TestRunReportsAResumedSilence: a beat that ends a silence longer than
// dead_after (here the worker's row was locked, as a stalled database or a
// partition would hold it up) calls Resumed, so the process checks its leases at
// once; until a lease round confirms them (Confirm), Trusted says no.
func TestRunReportsAResumedSilence(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	db := pgtest.New(t)
	a, err := lease.Claim(ctx, db.Pool, lease.ClaimOptions{Identity: "a", Heartbeat: 50 * time.Millisecond, MissedBeats: 4})
	require.NoError(t, err)
	resumed := make(chan time.Duration, 10)
	var doubted, confirmed atomic.Bool
	go a.Run(ctx, lease.Hooks{Superseded: func(error) {}, Resumed: func(d time.Duration) {
		// Its holdings are in doubt until a lease round confirms them.
		ok, gen := a.Trusted()
		doubted.Store(!ok)
		a.Confirm(gen)
		ok, _ = a.Trusted()
		confirmed.Store(ok)
		resumed <- d
	}})
	ok, _ := a.Trusted()
	require.True(t, ok, "a beating incarnation trusts its holdings")

	select {
	case d := <-resumed:
		t.Fatalf("resumed %s with no silence", d)
	case <-time.After(500 * time.Millisecond):
	}
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT 1 FROM compute_workers WHERE identity = 'a' FOR UPDATE`)
	require.NoError(t, err)
	time.Sleep(600 * time.Millisecond) // three dead_afters
	require.NoError(t, tx.Rollback(ctx))
	select {
	case d := <-resumed:
		require.Greater(t, d, a.DeadAfter())
		require.True(t, doubted.Load(), "after the silence, the holdings are in doubt")
		require.True(t, confirmed.Load(), "Confirm ends the doubt")
	case <-time.After(10 * time.Second):
		t.Fatal("no Resumed after the silence")
	}
}

// liveness is a Liveness whose answer the test sets.
type liveness struct {
	trusted   atomic.Bool
	gen       atomic.Uint64
	confirmed atomic.Uint64
}

func (l *liveness) Trusted() (bool, uint64) { return l.trusted.Load(), l.gen.Load() }
func (l *liveness) Confirm(gen uint64)      { l.confirmed.Store(gen) }

// TestHeldTrustsNothingWhileLivenessDoubts: a keeper whose process doubts its
// own liveness (it was frozen past its dead_after) reports no holding as held,
// though it holds them in the database, and each round confirms the
// generation it began at.
func TestHeldTrustsNothingWhileLivenessDoubts(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	db := pgtest.New(t)
	live := &liveness{}
	live.trusted.Store(true)
	live.gen.Store(7)
	k := lease.NewKeeper(lease.KeeperOptions{DB: db.Pool, Owner: "k", TTL: time.Minute, Renew: 100 * time.Millisecond, Liveness: live})
	k.Want("shard/0")
	go k.Run(ctx)
	require.Eventually(t, func() bool { _, ok := k.Held("shard/0"); return ok }, 10*time.Second, 5*time.Millisecond)
	require.Eventually(t, func() bool { return live.confirmed.Load() == 7 }, 10*time.Second, 5*time.Millisecond,
		"a round confirms the generation it began at")

	live.trusted.Store(false)
	_, ok := k.Held("shard/0")
	require.False(t, ok, "no holding is trusted while the process doubts its liveness")
	require.Len(t, k.HeldAll(), 1, "the keeper still holds it")
	live.trusted.Store(true)
	_, ok = k.Held("shard/0")
	require.True(t, ok)
}

// TestATakeoverDoesNotWaitForOneBlockedLease: a silent holder of two leases
// is paused inside a fenced transaction on one of them (its FOR KEY SHARE
// holds that lease's takeover back until the transaction ends). The standby
// takes the other lease at once, by heartbeat, instead of waiting for the
// blocked one; it takes the blocked one as soon as the transaction ends.
func TestATakeoverDoesNotWaitForOneBlockedLease(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	db := pgtest.New(t)
	a, err := lease.Claim(ctx, db.Pool, lease.ClaimOptions{Identity: "a", Heartbeat: 200 * time.Millisecond, MissedBeats: 4})
	require.NoError(t, err)
	l0, err := lease.Acquire(ctx, db.Pool, "shard/0", a.Owner(), time.Hour)
	require.NoError(t, err)
	_, err = lease.Acquire(ctx, db.Pool, "shard/1", a.Owner(), time.Hour)
	require.NoError(t, err)
	// a's fenced transaction on shard/0, left open as a paused process leaves it.
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	require.NoError(t, lease.FenceTx(ctx, tx, l0))
	silence(t, db, "a", time.Minute)

	b, err := lease.Claim(ctx, db.Pool, lease.ClaimOptions{Identity: "b"})
	require.NoError(t, err)
	got := make(chan lease.Acquired, 2)
	k := lease.NewKeeper(lease.KeeperOptions{DB: db.Pool, Owner: b.Owner(), TTL: time.Hour, Renew: 300 * time.Millisecond,
		OnAcquired: func(x lease.Acquired) { got <- x }})
	k.Want("shard/0", "shard/1")
	go k.Run(ctx)

	select {
	case x := <-got:
		require.Equal(t, "shard/1", x.Lease.Name, "the lease nobody holds back changes hands first")
		require.Equal(t, lease.ReasonHeartbeatLost, x.Reason)
	case <-time.After(10 * time.Second):
		t.Fatal("the standby took nothing while one lease was held back")
	}
	select {
	case x := <-got:
		t.Fatalf("the held-back lease changed hands while the fenced transaction was open: %+v", x)
	case <-time.After(time.Second):
	}
	require.NoError(t, tx.Rollback(ctx))
	select {
	case x := <-got:
		require.Equal(t, "shard/0", x.Lease.Name)
	case <-time.After(10 * time.Second):
		t.Fatal("the standby did not take the lease once the transaction ended")
	}
}
