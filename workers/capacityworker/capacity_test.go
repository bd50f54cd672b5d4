package capacityworker_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/capacity"
	"github.com/bettercompute/bettercompute/platform/clock"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/capacityworker"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// setup makes pool p with devices devices on one node and tenant acme with a
// quota of all of them, on the sim clock at t0, and starts a worker with the
// capacity workers.
func setup(t *testing.T, devices int, o *capacityworker.Options) *pgtest.DB {
	t.Helper()
	ctx := context.Background()
	db := pgtest.New(t)
	require.NoError(t, clock.UseSim(ctx, db.Pool, t0))
	require.NoError(t, capacity.CreatePool(ctx, db.Pool, &capacity.CreatePoolParams{PoolID: "p"}))
	require.NoError(t, capacity.AddNode(ctx, db.Pool, &capacity.AddNodeParams{PoolID: "p", NodeID: "n"}))
	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		for i := 0; i < devices; i++ {
			if err := capacity.AddDeviceTx(ctx, tx, &capacity.AddDeviceParams{NodeID: "n", DeviceID: fmt.Sprintf("d%02d", i)}); err != nil {
				return err
			}
		}
		return nil
	}))
	require.NoError(t, capacity.SetQuota(ctx, db.Pool, &capacity.SetQuotaParams{Tenant: "acme", PoolID: "p", Limit: devices}))
	if o == nil {
		o = &capacityworker.Options{SweepEvery: -1}
	}
	reg := workers.NewRegistry()
	require.NoError(t, capacityworker.Register(reg, o))
	workertest.Start(t, db.Pool, reg, nil)
	return db
}

func reserve(t *testing.T, db *pgtest.DB, devices int, ttl time.Duration) *capacity.Reservation {
	t.Helper()
	var r *capacity.Reservation
	require.NoError(t, pg.InTx(context.Background(), db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		r, err = capacity.ReserveTx(context.Background(), tx, &capacity.ReserveParams{
			PoolID: "p", Tenant: "acme", Devices: devices, Start: t0, End: t0.Add(time.Hour), TTL: ttl,
		})
		return err
	}))
	return r
}

func state(t *testing.T, db *pgtest.DB, id int64) capacity.State {
	t.Helper()
	r, err := capacity.Get(context.Background(), db.Pool, id)
	require.NoError(t, err)
	return r.State
}

// snoozes is how many times the expiry job of reservation id ran early.
func snoozes(t *testing.T, db *pgtest.DB, id int64) int {
	return db.MustCount(t, `SELECT coalesce(max((metadata->>'snoozes')::int), 0) FROM river_job WHERE kind = 'capacity_hold_expiry' AND (args->>'reservation_id')::bigint = $1`, id)
}

// TestHoldExpiresOnceUnderTheSimClock: the expiry job runs in real time, finds
// the hold not due by compute_now() (the sim clock stands still) and snoozes; once
// the sim clock passes the expiry it expires the hold, refunds the quota, and
// completes, exactly once. An extended hold makes it snooze again.
func TestHoldExpiresOnceUnderTheSimClock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := setup(t, 2, nil)
	r := reserve(t, db, 2, time.Second)

	workertest.WaitFor(t, 60*time.Second, "the expiry job to run early and snooze", func() bool { return snoozes(t, db, r.ID) >= 1 })
	require.Equal(t, capacity.Hold, state(t, db, r.ID), "not due by compute_now()")

	_, err := clock.Advance(ctx, db.Pool, 2*time.Second)
	require.NoError(t, err)
	workertest.WaitFor(t, 60*time.Second, "the hold to expire", func() bool { return state(t, db, r.ID) == capacity.Expired })
	workertest.WaitFor(t, 10*time.Second, "the job to complete", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'capacity_hold_expiry' AND state = 'completed' AND (args->>'reservation_id')::bigint = $1`, r.ID) == 1
	})
	got, err := capacity.Get(ctx, db.Pool, r.ID)
	require.NoError(t, err)
	require.Equal(t, int64(2), got.Version, "one transition: reserved (1), expired (2)")
	q, err := capacity.GetQuota(ctx, db.Pool, "acme", "p")
	require.NoError(t, err)
	require.Equal(t, 0, q.Used, "the quota is refunded")
	c, err := capacity.Capacity(ctx, db.Pool, "p")
	require.NoError(t, err)
	require.Zero(t, c.Holds)

	// An extended hold: the job runs at the original expiry and snoozes.
	r2 := reserve(t, db, 1, time.Second)
	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		_, err := capacity.ExtendTx(ctx, tx, &capacity.ExtendParams{ReservationID: r2.ID, Version: r2.Version, By: time.Hour})
		return err
	}))
	_, err = clock.Advance(ctx, db.Pool, 2*time.Second)
	require.NoError(t, err)
	before := snoozes(t, db, r2.ID)
	workertest.WaitFor(t, 60*time.Second, "the expiry job of the extended hold to snooze", func() bool { return snoozes(t, db, r2.ID) > before })
	require.Equal(t, capacity.Hold, state(t, db, r2.ID), "the extension moved the expiry")
	_, err = clock.Advance(ctx, db.Pool, time.Hour)
	require.NoError(t, err)
	workertest.WaitFor(t, 60*time.Second, "the extended hold to expire", func() bool { return state(t, db, r2.ID) == capacity.Expired })
	q, _ = capacity.GetQuota(ctx, db.Pool, "acme", "p")
	require.Equal(t, 0, q.Used)
}

// TestReleaseRacesExpiry releases lapsed holds while their expiry jobs run: each
// ends exactly once, released or expired, and the quota is refunded once.
// Rounds of holds repeat (at most maxRounds) until both outcomes have occurred:
// a release that won and one that lost to the expiry (CONFLICT).
func TestReleaseRacesExpiry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const n, maxRounds = 24, 10
	db := setup(t, n, nil)
	var byRelease, byExpiry int
	for round := 1; round <= maxRounds && (byRelease == 0 || byExpiry == 0); round++ {
		var ids []int64
		for i := 0; i < n; i++ {
			ids = append(ids, reserve(t, db, 1, 500*time.Millisecond).ID)
		}
		_, err := clock.Advance(ctx, db.Pool, time.Second)
		require.NoError(t, err)

		var wg sync.WaitGroup
		released := make([]bool, n)
		for i, id := range ids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Not a wait: spreads the releases over the expiry jobs' runs,
				// due 0.5 s after each reservation in real time and inserted
				// scheduled, so River promotes them within its scheduler's
				// 5 s: the releases span 0 to 5.75 s.
				time.Sleep(time.Duration(i) * 250 * time.Millisecond)
				err := pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
					_, err := capacity.ReleaseTx(ctx, tx, &capacity.ReleaseParams{ReservationID: id})
					return err
				})
				switch {
				case err == nil:
					released[i] = true
				case !fault.Has(err, fault.Conflict):
					t.Errorf("release %d: %v", id, err)
				}
			}()
		}
		wg.Wait()
		workertest.WaitFor(t, 60*time.Second, "every hold ended", func() bool {
			return db.MustCount(t, `SELECT count(*) FROM capacity_reservations WHERE state = 'hold'`) == 0
		})
		for i, id := range ids {
			r, err := capacity.Get(ctx, db.Pool, id)
			require.NoError(t, err)
			require.Equal(t, int64(2), r.Version, "reservation %d changed state once", id)
			if released[i] {
				require.Equal(t, capacity.Released, r.State)
				byRelease++
			} else {
				require.Equal(t, capacity.Expired, r.State, "a release that got CONFLICT lost to the expiry")
				byExpiry++
			}
		}
		t.Logf("round %d: %d released, %d expired so far", round, byRelease, byExpiry)
		q, _ := capacity.GetQuota(ctx, db.Pool, "acme", "p")
		require.Equal(t, 0, q.Used, "refunded once each")
		c, _ := capacity.Capacity(ctx, db.Pool, "p")
		require.Zero(t, c.Holds)
		require.Zero(t, db.MustCount(t, `SELECT count(*) FROM capacity_node_resources WHERE holds <> 0 OR confirmed <> 0`))
	}
	require.Positive(t, byRelease, "a release won the race")
	require.Positive(t, byExpiry, "an expiry won the race")
}

// TestSweepReenqueuesALostExpiry cancels a hold's expiry job, as an operator
// might: the periodic sweep enqueues a new one once the hold is overdue by the
// grace period, and the hold expires.
func TestSweepReenqueuesALostExpiry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := setup(t, 1, &capacityworker.Options{SweepEvery: 200 * time.Millisecond, Grace: time.Minute})
	r := reserve(t, db, 1, time.Hour)
	db.MustExec(t, `UPDATE river_job SET state = 'cancelled', finalized_at = $1 WHERE kind = 'capacity_hold_expiry'`, time.Now())

	_, err := clock.Advance(ctx, db.Pool, time.Hour+30*time.Second)
	require.NoError(t, err)
	// Due, but not overdue by the grace period: the sweep leaves it alone (two
	// sweeps, so that one started after the advance).
	before := db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'capacity_expiry_sweep' AND state = 'completed'`)
	workertest.WaitFor(t, 60*time.Second, "two sweeps after the advance", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'capacity_expiry_sweep' AND state = 'completed'`) >= before+2
	})
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'capacity_hold_expiry'`))

	_, err = clock.Advance(ctx, db.Pool, time.Minute)
	require.NoError(t, err)
	workertest.WaitFor(t, 60*time.Second, "the hold to expire", func() bool { return state(t, db, r.ID) == capacity.Expired })
	require.Equal(t, 2, db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'capacity_hold_expiry' AND (args->>'reservation_id')::bigint = $1`, r.ID),
		"the cancelled job and the sweep's")
	// Later sweeps find nothing overdue and enqueue nothing more.
	n := db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'capacity_expiry_sweep' AND state = 'completed'`)
	workertest.WaitFor(t, 60*time.Second, "two more sweeps", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'capacity_expiry_sweep' AND state = 'completed'`) >= n+2
	})
	require.Equal(t, 2, db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'capacity_hold_expiry'`))
}

// TestSweepDoesNotWaitOnALiveExpiry: while an expiry job's fenced transaction
// holds the job's row (it locks it first, then writes the hold), a sweep that
// finds the hold overdue leaves it alone instead of waiting on that row while
// holding the hold's: the two used to deadlock, over and over, until the
// expiry's retries backed off past its deadline.
func TestSweepDoesNotWaitOnALiveExpiry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := setup(t, 1, &capacityworker.Options{SweepEvery: 200 * time.Millisecond, Grace: time.Minute})
	r := reserve(t, db, 1, time.Hour)
	// The expiry job stays live but does not run by itself in this test.
	db.MustExec(t, `UPDATE river_job SET scheduled_at = $1 WHERE kind = 'capacity_hold_expiry'`, time.Now().Add(time.Hour))

	// The expiry's fenced transaction: its job's row first.
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SET LOCAL idle_in_transaction_session_timeout = 0`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT 1 FROM river_job WHERE kind = 'capacity_hold_expiry' FOR UPDATE`)
	require.NoError(t, err)

	_, err = clock.Advance(ctx, db.Pool, 2*time.Hour)
	require.NoError(t, err)
	n := db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'capacity_expiry_sweep' AND state = 'completed'`)
	workertest.WaitFor(t, 30*time.Second, "two sweeps to finish while the expiry holds its job's row", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'capacity_expiry_sweep' AND state = 'completed'`) >= n+2
	})
	// Then the expiry writes the hold: nothing of a sweep's is in its way.
	_, err = tx.Exec(ctx, `SET LOCAL lock_timeout = '5s'`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `UPDATE capacity_reservations SET expires_at = expires_at WHERE id = $1`, r.ID)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'capacity_hold_expiry'`),
		"a hold whose expiry job is live gets no second one")
}

// TestLapsedHoldKeepsItsDevicesUntilTheJobRuns: a hold whose TTL has passed by
// compute_now() still holds its device (no other reservation gets it, ListFree
// leaves it out, the quota stays charged) while its expiry job has not run;
// once the job runs, the device is free. The job is scheduled an hour ahead in
// real time (a TTL of an hour), so it does not run until the test makes it due,
// while the sim clock jumps past the hold's expiry.
func TestLapsedHoldKeepsItsDevicesUntilTheJobRuns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := setup(t, 1, nil)
	require.NoError(t, capacity.SetQuota(ctx, db.Pool, &capacity.SetQuotaParams{Tenant: "other", PoolID: "p", Limit: 1}))
	r := reserve(t, db, 1, time.Hour)
	_, err := clock.Advance(ctx, db.Pool, 2*time.Hour)
	require.NoError(t, err)

	otherReserves := func() error {
		return pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
			_, err := capacity.ReserveTx(ctx, tx, &capacity.ReserveParams{
				PoolID: "p", Tenant: "other", Devices: 1, Start: t0, End: t0.Add(time.Hour), TTL: time.Hour,
			})
			return err
		})
	}
	free := func() int {
		devs, err := capacity.ListFree(ctx, db.Pool, &capacity.ListFreeParams{PoolID: "p", Start: t0, End: t0.Add(time.Hour)})
		require.NoError(t, err)
		return len(devs)
	}
	got, err := capacity.Get(ctx, db.Pool, r.ID)
	require.NoError(t, err)
	require.True(t, got.ExpiresAt.Before(t0.Add(2*time.Hour)), "the hold has lapsed by compute_now()")
	err = otherReserves()
	require.Equal(t, fault.Conflict, fault.CodeOf(err), "the lapsed hold's device is not free before its job ran: %v", err)
	require.Zero(t, free(), "ListFree leaves the lapsed hold's device out")
	require.Equal(t, capacity.Hold, got.State)
	q, err := capacity.GetQuota(ctx, db.Pool, "acme", "p")
	require.NoError(t, err)
	require.Equal(t, 1, q.Used, "the lapsed hold's quota is charged until its job ran")
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'capacity_hold_expiry' AND attempt > 0`),
		"the expiry job has not run")

	// The job runs: the hold expires and its device is free.
	db.MustExec(t, `UPDATE river_job SET scheduled_at = $1 WHERE kind = 'capacity_hold_expiry'`, time.Now())
	workertest.WaitFor(t, 60*time.Second, "the expiry job to expire the lapsed hold", func() bool { return state(t, db, r.ID) == capacity.Expired })
	require.Equal(t, 1, free())
	require.NoError(t, otherReserves(), "the device is free once the job ran")
}

// TestSweepDefaultGrace: with the default options, the sweep leaves a hold
// whose expiry job is gone alone while it is overdue by less than 30 s, and
// re-enqueues the job once it is overdue by more.
func TestSweepDefaultGrace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := setup(t, 1, &capacityworker.Options{SweepEvery: 200 * time.Millisecond}) // Grace: the default
	r := reserve(t, db, 1, time.Hour)
	db.MustExec(t, `UPDATE river_job SET state = 'cancelled', finalized_at = $1 WHERE kind = 'capacity_hold_expiry'`, time.Now())
	sweeps := func() int {
		return db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'capacity_expiry_sweep' AND state = 'completed'`)
	}

	_, err := clock.Advance(ctx, db.Pool, time.Hour+29*time.Second)
	require.NoError(t, err)
	n := sweeps()
	// Two sweeps that both started after the advance.
	workertest.WaitFor(t, 30*time.Second, "two sweeps with the hold overdue by 29 s", func() bool { return sweeps() >= n+2 })
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'capacity_hold_expiry'`),
		"overdue by 29 s, within the default grace: no new expiry job")
	require.Equal(t, capacity.Hold, state(t, db, r.ID))

	_, err = clock.Advance(ctx, db.Pool, 2*time.Second)
	require.NoError(t, err)
	workertest.WaitFor(t, 30*time.Second, "the sweep to re-enqueue the expiry of a hold overdue by 31 s, and the hold to expire", func() bool {
		return state(t, db, r.ID) == capacity.Expired
	})
	require.Equal(t, 2, db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'capacity_hold_expiry'`), "the cancelled job and the sweep's")
}
