package lease_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers/internal/lease"
)

// exited makes the recorded process of identity look like one that has exited
// (same pid, another start time: what a reused pid looks like).
func exited(t *testing.T, db *pgtest.DB, identity string) {
	t.Helper()
	db.MustExec(t, `UPDATE compute_workers SET proc_start = proc_start + 1 WHERE identity = $1`, identity)
}

// TestRestartTakesLeasesOverAtOnce: a new incarnation of an identity whose
// process has exited takes its unexpired leases at once with a new epoch; the
// old incarnation is fenced, renews nothing, takes nothing back, and learns from
// its heartbeat that it was replaced.
func TestRestartTakesLeasesOverAtOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)

	old, err := lease.Claim(ctx, db.Pool, lease.ClaimOptions{Identity: "web-1"})
	require.NoError(t, err)
	require.Equal(t, "web-1#1", old.Owner())
	require.Nil(t, old.Took)
	held, err := lease.Acquire(ctx, db.Pool, "shard/0", old.Owner(), time.Hour)
	require.NoError(t, err)

	exited(t, db, "web-1")
	start := time.Now()
	// A 10 s heartbeat: a watch would last 25 s, a TTL wait an hour.
	inc, err := lease.Claim(ctx, db.Pool, lease.ClaimOptions{Identity: "web-1", Heartbeat: 10 * time.Second})
	require.NoError(t, err)
	require.Equal(t, "web-1#2", inc.Owner())
	require.NotNil(t, inc.Took)
	require.Equal(t, int64(1), inc.Took.Number)
	require.Contains(t, inc.Took.Reason, "has exited")

	// The lease, unexpired for another hour, is taken at once, epoch + 1.
	got, err := lease.Acquire(ctx, db.Pool, "shard/0", inc.Owner(), time.Minute)
	require.NoError(t, err)
	require.Equal(t, held.Epoch+1, got.Epoch)
	require.Less(t, time.Since(start), 10*time.Second, "no watch and no TTL wait for an exited process")

	// The old incarnation is fenced exactly as after any takeover …
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	require.True(t, fault.Has(lease.FenceTx(ctx, tx, held), fault.Fenced))
	require.NoError(t, tx.Rollback(ctx))
	// … renews nothing, and cannot take the lease back, nor any other.
	renewed, err := lease.Renew(ctx, db.Pool, time.Minute, held)
	require.NoError(t, err)
	require.Empty(t, renewed)
	_, err = lease.Acquire(ctx, db.Pool, "shard/0", old.Owner(), time.Minute)
	require.True(t, fault.Has(err, fault.Conflict), "%v", err)
	_, err = lease.Acquire(ctx, db.Pool, "shard/9", old.Owner(), time.Minute)
	require.True(t, fault.Has(err, fault.Conflict), "a superseded incarnation takes nothing: %v", err)
	// Its heartbeat names who replaced it.
	err = old.Beat(ctx)
	require.True(t, fault.Has(err, fault.Conflict), "%v", err)
	require.ErrorContains(t, err, "taken over by incarnation 2")
	require.NoError(t, inc.Beat(ctx))

	// Another identity waits while the new incarnation beats (it has just
	// claimed; its dead_after is 40 s).
	_, err = lease.Acquire(ctx, db.Pool, "shard/0", "web-2#1", time.Minute)
	require.True(t, fault.Has(err, fault.Conflict), "%v", err)
}

// TestClaimRefusesALiveDuplicate: a second process given the identity of a live
// one is refused with CONFLICT and changes nothing; the first keeps its lease.
// Eight claims racing for an identity whose process exited: exactly one wins.
func TestClaimRefusesALiveDuplicate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)

	first, err := lease.Claim(ctx, db.Pool, lease.ClaimOptions{Identity: "dup"})
	require.NoError(t, err)
	held, err := lease.Acquire(ctx, db.Pool, "shard/0", first.Owner(), time.Minute)
	require.NoError(t, err)

	_, err = lease.Claim(ctx, db.Pool, lease.ClaimOptions{Identity: "dup"})
	require.True(t, fault.Has(err, fault.Conflict), "%v", err)
	require.ErrorContains(t, err, "in use by a live process")
	require.Equal(t, 1, db.MustCount(t, `SELECT incarnation FROM compute_workers WHERE identity = 'dup'`))
	require.NoError(t, first.Beat(ctx))
	renewed, err := lease.Renew(ctx, db.Pool, time.Minute, held)
	require.NoError(t, err)
	require.Len(t, renewed, 1)
	require.Equal(t, held.Epoch, renewed[0].Epoch)

	exited(t, db, "dup")
	var wins, conflicts atomic.Int32
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			_, err := lease.Claim(ctx, db.Pool, lease.ClaimOptions{Identity: "dup"})
			switch {
			case err == nil:
				wins.Add(1)
			case fault.Has(err, fault.Conflict):
				conflicts.Add(1)
			default:
				t.Error(err)
			}
		})
	}
	wg.Wait()
	require.Equal(t, int32(1), wins.Load())
	require.Equal(t, int32(7), conflicts.Load())
	require.Equal(t, 2, db.MustCount(t, `SELECT incarnation FROM compute_workers WHERE identity = 'dup'`))
}

// TestClaimSlots: with no identity configured, a process gets HOST/SLOT, the
// lowest slot no running process holds; a restart gets its slot back.
func TestClaimSlots(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	claim := func() *lease.Incarnation {
		inc, err := lease.Claim(ctx, db.Pool, lease.ClaimOptions{Host: "h1"})
		require.NoError(t, err)
		return inc
	}
	a, b := claim(), claim()
	require.Equal(t, "h1/0#1", a.Owner())
	require.Equal(t, "h1/1#1", b.Owner(), "slot 0 is held by a running process")
	require.NoError(t, a.Retire(ctx))
	c := claim()
	require.Equal(t, "h1/0#2", c.Owner(), "a stopped slot is taken back")
	require.Equal(t, "it stopped gracefully", c.Took.Reason)
	exited(t, db, "h1/1")
	d := claim()
	require.Equal(t, "h1/1#2", d.Owner(), "the slot of an exited process is taken back")
}

// TestClaimWatchesAnotherHostsHeartbeat: when the previous incarnation ran on
// another host, Claim watches its heartbeat: a live one is refused, a silent one
// taken over after two and a half heartbeats; one silent for three is taken at
// once, and so is a process on this host that runs but has stopped beating.
func TestClaimWatchesAnotherHostsHeartbeat(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	hb := 500 * time.Millisecond
	plant := func(identity, host, silent string) {
		db.MustExec(t, `INSERT INTO compute_workers (identity, incarnation, host, pid, seen_at)
			VALUES ($1, 4, $2, 1, compute_now() - $3::interval)`, identity, host, silent)
	}

	plant("beating", "elsewhere", "0 s")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(hb / 10): // ten beats a heartbeat, so a slow machine still beats within the watch
				db.MustExec(t, `UPDATE compute_workers SET seen_at = compute_now() WHERE identity = 'beating'`)
			}
		}
	})
	_, err := lease.Claim(ctx, db.Pool, lease.ClaimOptions{Identity: "beating", Heartbeat: hb})
	close(stop)
	wg.Wait()
	require.True(t, fault.Has(err, fault.Conflict), "%v", err)
	require.ErrorContains(t, err, "heartbeat went on")

	plant("quiet", "elsewhere", "0 s")
	start := time.Now()
	inc, err := lease.Claim(ctx, db.Pool, lease.ClaimOptions{Identity: "quiet", Heartbeat: hb})
	require.NoError(t, err)
	require.Equal(t, "quiet#5", inc.Owner())
	require.GreaterOrEqual(t, time.Since(start), 2*hb, "it watched before taking over")
	require.Contains(t, inc.Took.Reason, "no heartbeat")

	plant("gone", "elsewhere", "10 s")
	inc, err = lease.Claim(ctx, db.Pool, lease.ClaimOptions{Identity: "gone", Heartbeat: hb})
	require.NoError(t, err)
	require.Contains(t, inc.Took.Reason, "no heartbeat for 10")

	// A process on this host that runs (this test) but is silent: paused.
	live, err := lease.Claim(ctx, db.Pool, lease.ClaimOptions{Identity: "paused", Heartbeat: hb})
	require.NoError(t, err)
	db.MustExec(t, `UPDATE compute_workers SET seen_at = seen_at - interval '10 s' WHERE identity = 'paused'`)
	inc, err = lease.Claim(ctx, db.Pool, lease.ClaimOptions{Identity: "paused", Heartbeat: hb})
	require.NoError(t, err)
	require.Contains(t, inc.Took.Reason, "it stops when it resumes")
	require.True(t, fault.Has(live.Beat(ctx), fault.Conflict))

	_, err = lease.Claim(ctx, db.Pool, lease.ClaimOptions{Identity: "bad#1"})
	require.True(t, fault.Has(err, fault.InvalidConfig), "%v", err)
}

// TestReleaseEarlier: a new incarnation releases what the earlier ones hold and
// it does not want, and nothing of other identities.
func TestReleaseEarlier(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	old, err := lease.Claim(ctx, db.Pool, lease.ClaimOptions{Identity: "w"})
	require.NoError(t, err)
	for _, n := range []string{"shard/0", "shard/1", "sink/a"} {
		_, err := lease.Acquire(ctx, db.Pool, n, old.Owner(), time.Hour)
		require.NoError(t, err)
	}
	_, err = lease.Acquire(ctx, db.Pool, "shard/2", "w2#1", time.Hour)
	require.NoError(t, err)
	exited(t, db, "w")
	inc, err := lease.Claim(ctx, db.Pool, lease.ClaimOptions{Identity: "w"})
	require.NoError(t, err)
	n, err := inc.ReleaseEarlier(ctx, []string{"shard/0"})
	require.NoError(t, err)
	require.Equal(t, int64(2), n)
	rows, err := db.Pool.Query(ctx, `SELECT name FROM compute_leases WHERE expires_at > compute_now() ORDER BY name`)
	require.NoError(t, err)
	live, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"shard/0", "shard/2"}, live)
}

// TestRunStopsOnTakeover: Run calls superseded once a later incarnation took
// the identity over, and returns.
func TestRunStopsOnTakeover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	hb := 50 * time.Millisecond
	old, err := lease.Claim(ctx, db.Pool, lease.ClaimOptions{Identity: "r", Heartbeat: hb})
	require.NoError(t, err)
	got := make(chan error, 1)
	go old.Run(ctx, lease.Hooks{Superseded: func(err error) { got <- err }})
	exited(t, db, "r")
	_, err = lease.Claim(ctx, db.Pool, lease.ClaimOptions{Identity: "r", Heartbeat: hb})
	require.NoError(t, err)
	select {
	case err := <-got:
		require.True(t, fault.Has(err, fault.Conflict), "%v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the old incarnation did not learn it was replaced")
	}
}
