package capacity_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/capacity"
	"github.com/bettercompute/bettercompute/platform/clock"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

func TestReserveConfirmExtendRelease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	require.NoError(t, clock.UseSim(ctx, db.Pool, t0))
	makePool(t, db, poolSpec{ID: "p", Nodes: 2, PerNode: 2, Tenants: map[string]int{"acme": 3}})

	start, end := hours(1, 3)
	r, err := reserve(t, db.Pool, capacity.ReserveParams{PoolID: "p", Tenant: "acme", Devices: 2, Start: start, End: end, TTL: time.Minute})
	require.NoError(t, err)
	require.Equal(t, capacity.Hold, r.State)
	require.Len(t, r.Devices, 2)
	require.Equal(t, r.Devices[0][:4], r.Devices[1][:4], "a reservation's devices share a node when they can: %v", r.Devices)
	require.Equal(t, t0.Add(time.Minute), r.ExpiresAt.UTC(), "the TTL runs from compute_now()")
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'capacity_hold_expiry' AND (args->>'reservation_id')::bigint = $1`, r.ID),
		"the hold's expiry job is enqueued in the same transaction")
	q, err := capacity.GetQuota(ctx, db.Pool, "acme", "p")
	require.NoError(t, err)
	require.Equal(t, 2, q.Used)
	c, err := capacity.Capacity(ctx, db.Pool, "p")
	require.NoError(t, err)
	require.Equal(t, capacity.PoolCapacity{PoolID: "p", Nodes: 2, ActiveNodes: 2, Devices: 4, ActiveDevices: 4, Holds: 2}, *c)
	checkInvariants(t, db, "after reserve")

	// Extend: by the version read; the range may grow.
	ext, err := inTx(t, db.Pool, func(tx pgx.Tx) (*capacity.Reservation, error) {
		return capacity.ExtendTx(ctx, tx, &capacity.ExtendParams{ReservationID: r.ID, Version: r.Version, By: time.Minute, End: end.Add(time.Hour)})
	})
	require.NoError(t, err)
	require.Equal(t, r.Version+1, ext.Version)
	require.Equal(t, t0.Add(2*time.Minute), ext.ExpiresAt.UTC())
	require.Equal(t, end.Add(time.Hour), ext.End.UTC())
	_, err = inTx(t, db.Pool, func(tx pgx.Tx) (*capacity.Reservation, error) {
		return capacity.ExtendTx(ctx, tx, &capacity.ExtendParams{ReservationID: r.ID, Version: r.Version, By: time.Minute})
	})
	require.True(t, fault.Has(err, fault.Conflict), "a second extension of the same version: %v", err)

	conf, err := inTx(t, db.Pool, func(tx pgx.Tx) (*capacity.Reservation, error) {
		return capacity.ConfirmTx(ctx, tx, &capacity.ConfirmParams{ReservationID: r.ID})
	})
	require.NoError(t, err)
	require.Equal(t, capacity.Confirmed, conf.State)
	c, _ = capacity.Capacity(ctx, db.Pool, "p")
	require.Equal(t, 0, c.Holds)
	require.Equal(t, 2, c.Confirmed)
	checkInvariants(t, db, "after confirm")

	// A confirmed booking does not expire, even long after its hold would have.
	_, err = clock.Advance(ctx, db.Pool, time.Hour)
	require.NoError(t, err)
	_, err = inTx(t, db.Pool, func(tx pgx.Tx) (*capacity.ExpireResult, error) {
		return capacity.ExpireHoldsTx(ctx, tx, &capacity.ExpireParams{PoolID: "p"})
	})
	require.NoError(t, err)
	got, err := capacity.Get(ctx, db.Pool, r.ID)
	require.NoError(t, err)
	require.Equal(t, capacity.Confirmed, got.State)

	rel, err := inTx(t, db.Pool, func(tx pgx.Tx) (*capacity.Reservation, error) {
		return capacity.ReleaseTx(ctx, tx, &capacity.ReleaseParams{ReservationID: r.ID})
	})
	require.NoError(t, err)
	require.Equal(t, capacity.Released, rel.State)
	q, _ = capacity.GetQuota(ctx, db.Pool, "acme", "p")
	require.Equal(t, 0, q.Used, "release refunds the quota")
	_, err = inTx(t, db.Pool, func(tx pgx.Tx) (*capacity.Reservation, error) {
		return capacity.ReleaseTx(ctx, tx, &capacity.ReleaseParams{ReservationID: r.ID})
	})
	require.True(t, fault.Has(err, fault.Conflict), "a second release: %v", err)
	q, _ = capacity.GetQuota(ctx, db.Pool, "acme", "p")
	require.Equal(t, 0, q.Used, "a second release refunds nothing")
	checkInvariants(t, db, "after release")
}

// TestOverlappingBookingsRefusedByTheConstraint bypasses the domain functions:
// the exclusion constraint alone refuses a second overlapping live booking of a
// device, and allows one that does not overlap or is not live.
func TestOverlappingBookingsRefusedByTheConstraint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	makePool(t, db, poolSpec{ID: "p", Nodes: 1, PerNode: 1, Tenants: map[string]int{"acme": 5}})
	// Each booking gets a reservation row of its own (the rows need not agree:
	// only the constraint is under test).
	insertIn := func(db pg.DBTX, from, to time.Time, state string) error {
		_, err := db.Exec(ctx, `
WITH r AS (INSERT INTO capacity_reservations (pool_id, tenant, during, device_count, expires_at)
           VALUES ('p', 'acme', tstzrange($1, $2), 1, $2) RETURNING id)
INSERT INTO capacity_bookings (reservation_id, device_id, node_id, pool_id, tenant, during, state)
SELECT r.id, 'p-n0-d00', 'p-n0', 'p', 'acme', tstzrange($1, $2), $3 FROM r`, from, to, state)
		return err
	}
	insert := func(from, to time.Time, state string) error { return insertIn(db.Pool, from, to, state) }
	require.NoError(t, insert(t0, t0.Add(2*time.Hour), "hold"))
	err := insert(t0.Add(time.Hour), t0.Add(3*time.Hour), "confirmed")
	require.Error(t, err)
	require.Equal(t, "23P01", pg.SQLState(err), "the second overlapping live booking: %v", err)
	require.True(t, fault.Has(pg.Translate(err), fault.Conflict))
	require.NoError(t, insert(t0.Add(2*time.Hour), t0.Add(3*time.Hour), "hold"), "adjacent ranges do not overlap")
	require.NoError(t, insert(t0.Add(time.Hour), t0.Add(3*time.Hour), "released"), "an ended booking holds nothing")

	// Two transactions at once: the second waits for the first and fails at its commit.
	tx1, err := db.Begin(ctx)
	require.NoError(t, err)
	defer tx1.Rollback(ctx)
	require.NoError(t, insertIn(tx1, t0.Add(5*time.Hour), t0.Add(6*time.Hour), "hold"))
	errc := make(chan error, 1)
	go func() { errc <- insert(t0.Add(5*time.Hour), t0.Add(7*time.Hour), "hold") }()
	workertest.WaitFor(t, 30*time.Second, "the second insert to wait on the first (the constraint's check)", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'
		                         AND query LIKE '%INSERT INTO capacity_bookings%'`) == 1
	})
	require.NoError(t, tx1.Commit(ctx))
	err = <-errc
	require.Equal(t, "23P01", pg.SQLState(err), "the concurrent overlapping booking: %v", err)
}

// TestReserveRetriesAnotherDeviceOn23P01 makes the first device's booking fail
// with an exclusion violation: a booking inserted directly by another
// transaction (bypassing the device lock) that commits while the reservation
// waits on the constraint. The reservation moves on to the next devices, device
// by device, and succeeds; those bookings are written without a savepoint each,
// so one subtransaction (one xmin) wrote them all.
func TestReserveRetriesAnotherDeviceOn23P01(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	makePool(t, db, poolSpec{ID: "p", Nodes: 1, PerNode: 3, Tenants: map[string]int{"acme": 5, "rogue": 5}})
	rogue := rogueBooking(t, db, "p-n0-d00", "p-n0")

	type result struct {
		r   *capacity.Reservation
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := reserve(t, db.Pool, capacity.ReserveParams{PoolID: "p", Tenant: "acme", Devices: 2, Start: t0, End: t0.Add(time.Hour), TTL: time.Minute})
		done <- result{r, err}
	}()
	// Wait until the reservation waits on the rogue transaction (the constraint
	// check), in capacity_reserve_fast or in the device-by-device insert.
	require.Eventually(t, func() bool {
		return db.MustCount(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'
		                         AND (query LIKE '%INSERT INTO capacity_bookings%' OR query LIKE '%capacity_reserve_fast(%')`) == 1
	}, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, rogue.Commit(ctx))
	res := <-done
	require.NoError(t, res.err, "a 23P01 is a retry on the next device, never an error")
	require.Equal(t, []string{"p-n0-d01", "p-n0-d02"}, res.r.Devices)
	require.Equal(t, 1, res.r.Retries)
	require.Equal(t, 1, db.MustCount(t, `SELECT count(DISTINCT xmin::text) FROM capacity_bookings WHERE reservation_id = $1`, res.r.ID),
		"the bookings of one group were written by several subtransactions")
	checkInvariantsExceptQuota(t, db)
}

// rogueBooking books device (of node, in pool p) over [t0, t0+1h) for tenant
// rogue in a transaction it leaves open, as no code of ours would: without the
// device's lock, the quota or the counters. The test commits it.
func rogueBooking(t *testing.T, db *pgtest.DB, device, node string) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	var id int64
	require.NoError(t, db.QueryRow(ctx, `INSERT INTO capacity_reservations (pool_id, tenant, during, device_count, expires_at)
	                                      VALUES ('p', 'rogue', tstzrange($1, $2), 1, $2) RETURNING id`, t0, t0.Add(time.Hour)).Scan(&id))
	rogue, err := db.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = rogue.Rollback(ctx) })
	_, err = rogue.Exec(ctx, `INSERT INTO capacity_bookings (reservation_id, device_id, node_id, pool_id, tenant, during, state)
	                          VALUES ($1, $2, $3, 'p', 'rogue', tstzrange($4, $5), 'hold')`, id, device, node, t0, t0.Add(time.Hour))
	require.NoError(t, err)
	return rogue
}

// checkInvariantsExceptQuota is checkInvariants for a test whose rogue bookings
// bypass the quota.
func checkInvariantsExceptQuota(t *testing.T, db *pgtest.DB) {
	t.Helper()
	for name, q := range invariantQueries {
		if name == "quota usage that differs from a recount" || name == "reservations whose bookings disagree with them" ||
			name == "node resources that differ from a recount" || name == "pool rollups that differ from a recount" ||
			name == "rollup stripes that differ from a recount of their nodes" {
			continue
		}
		require.Zero(t, db.MustCount(t, q), name)
	}
}

func TestQuota(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	makePool(t, db, poolSpec{ID: "p", Nodes: 1, PerNode: 4, Tenants: map[string]int{"acme": 2}})
	start, end := hours(0, 1)

	_, err := reserve(t, db.Pool, capacity.ReserveParams{PoolID: "p", Tenant: "nobody", Devices: 1, Start: start, End: end, TTL: time.Minute})
	require.True(t, fault.Has(err, fault.NotFound), "no quota: %v", err)

	_, err = reserve(t, db.Pool, capacity.ReserveParams{PoolID: "p", Tenant: "acme", Devices: 2, Start: start, End: end, TTL: time.Minute})
	require.NoError(t, err)

	// Over quota: CONFLICT, and the caller's transaction is untouched and usable.
	err = pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		_, err := capacity.ReserveTx(ctx, tx, &capacity.ReserveParams{PoolID: "p", Tenant: "acme", Devices: 1, Start: start, End: end, TTL: time.Minute})
		require.True(t, fault.Has(err, fault.Conflict), "over quota: %v", err)
		_, err = tx.Exec(ctx, `SELECT 1`)
		return err
	})
	require.NoError(t, err)

	require.True(t, fault.Has(capacity.SetQuota(ctx, db.Pool, &capacity.SetQuotaParams{Tenant: "acme", PoolID: "p", Limit: 1}), fault.Conflict),
		"a limit below the usage")
	require.NoError(t, capacity.SetQuota(ctx, db.Pool, &capacity.SetQuotaParams{Tenant: "acme", PoolID: "p", Limit: 3}))
	_, err = reserve(t, db.Pool, capacity.ReserveParams{PoolID: "p", Tenant: "acme", Devices: 1, Start: start, End: end, TTL: time.Minute})
	require.NoError(t, err)

	// Too few devices: CONFLICT, and the quota charge is rolled back with it,
	// even though the caller's transaction commits.
	require.NoError(t, capacity.SetQuota(ctx, db.Pool, &capacity.SetQuotaParams{Tenant: "acme", PoolID: "p", Limit: 10}))
	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		_, err := capacity.ReserveTx(ctx, tx, &capacity.ReserveParams{PoolID: "p", Tenant: "acme", Devices: 2, Start: start, End: end, TTL: time.Minute})
		require.True(t, fault.Has(err, fault.Conflict), "one device left: %v", err)
		return nil
	}))
	q, _ := capacity.GetQuota(ctx, db.Pool, "acme", "p")
	require.Equal(t, 3, q.Used)
	checkInvariants(t, db, "end")
}

func TestOnlyActiveNodesTakeBookings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	makePool(t, db, poolSpec{ID: "p", Nodes: 2, PerNode: 2, Tenants: map[string]int{"acme": 10}})
	start, end := hours(0, 1)
	setState := func(node string, s capacity.NodeState) {
		require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
			return capacity.SetNodeStateTx(ctx, tx, &capacity.SetNodeStateParams{NodeID: node, State: s})
		}))
	}
	held, err := reserve(t, db.Pool, capacity.ReserveParams{PoolID: "p", Tenant: "acme", Devices: 1, Start: start, End: end, TTL: time.Minute})
	require.NoError(t, err)

	setState("p-n0", capacity.NodeDraining)
	setState("p-n1", capacity.NodeDown)
	c, _ := capacity.Capacity(ctx, db.Pool, "p")
	require.Equal(t, 0, c.ActiveNodes)
	require.Equal(t, 0, c.ActiveDevices)
	free, err := capacity.ListFree(ctx, db.Pool, &capacity.ListFreeParams{PoolID: "p", Start: start, End: end})
	require.NoError(t, err)
	require.Empty(t, free)
	_, err = reserve(t, db.Pool, capacity.ReserveParams{PoolID: "p", Tenant: "acme", Devices: 1, Start: start, End: end, TTL: time.Minute})
	require.True(t, fault.Has(err, fault.Conflict), "draining and down nodes take no bookings: %v", err)
	got, _ := capacity.Get(ctx, db.Pool, held.ID)
	require.Equal(t, capacity.Hold, got.State, "a draining node keeps its bookings")
	checkInvariants(t, db, "drained")

	setState("p-n1", capacity.NodeActive)
	free, err = capacity.ListFree(ctx, db.Pool, &capacity.ListFreeParams{PoolID: "p", Start: start, End: end})
	require.NoError(t, err)
	require.NotEmpty(t, free)
	for _, d := range free {
		require.Equal(t, "p-n1", d.NodeID)
	}
	r, err := reserve(t, db.Pool, capacity.ReserveParams{PoolID: "p", Tenant: "acme", Devices: len(free), Start: start, End: end, TTL: time.Minute})
	require.NoError(t, err)
	for _, d := range r.Devices {
		require.Contains(t, d, "p-n1-", "only the active node takes bookings")
	}
	checkInvariants(t, db, "reactivated")
}

// TestDrainRacesReservations drains a node while reservations book it: every
// booking of the node committed before the drain did, none after. Rounds (the
// node reactivated, new ranges) repeat until both sides of the race occurred:
// bookings committed before the drain, and reservations refused (CONFLICT)
// after it.
func TestDrainRacesReservations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	makePool(t, db, poolSpec{ID: "p", Nodes: 1, PerNode: 16, Tenants: map[string]int{"acme": 10000}})
	const maxRounds = 10
	var before, refused int
	for round := 0; round < maxRounds && (before == 0 || refused == 0); round++ {
		require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
			return capacity.SetNodeStateTx(ctx, tx, &capacity.SetNodeStateParams{NodeID: "p-n0", State: capacity.NodeActive})
		}))
		total := db.MustCount(t, `SELECT count(*) FROM capacity_bookings WHERE node_id = 'p-n0'`)
		var wg sync.WaitGroup
		var conflicts atomic.Int64
		for i := 0; i < 16; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				// Each client its own hour: only the drain refuses a reservation.
				start, end := hours(100*round+i, 100*round+i+1)
				for j := 0; j < 4; j++ {
					_, err := reserve(t, db.Pool, capacity.ReserveParams{PoolID: "p", Tenant: "acme", Devices: 1, Start: start, End: end, TTL: time.Minute})
					switch {
					case fault.Has(err, fault.Conflict):
						conflicts.Add(1)
					case err != nil:
						t.Errorf("reserve: %v", err)
					}
				}
			}(i)
		}
		workertest.WaitFor(t, 30*time.Second, "a booking of the round to commit", func() bool {
			return db.MustCount(t, `SELECT count(*) FROM capacity_bookings WHERE node_id = 'p-n0'`) > total
		})
		// The drain holds the node's devices when it counts: every booking committed
		// before it is counted, and none may commit after it.
		var atDrain int
		require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
			if err := capacity.SetNodeStateTx(ctx, tx, &capacity.SetNodeStateParams{NodeID: "p-n0", State: capacity.NodeDraining}); err != nil {
				return err
			}
			return tx.QueryRow(ctx, `SELECT count(*) FROM capacity_bookings WHERE node_id = 'p-n0'`).Scan(&atDrain)
		}))
		wg.Wait()
		require.Equal(t, atDrain, db.MustCount(t, `SELECT count(*) FROM capacity_bookings WHERE node_id = 'p-n0'`),
			"a booking of the node committed after the drain")
		before += atDrain - total
		refused += int(conflicts.Load())
		t.Logf("round %d: %d booked before the drain, %d refused after it", round, atDrain-total, conflicts.Load())
		checkInvariants(t, db, fmt.Sprintf("round %d", round))
	}
	require.Positive(t, before, "bookings committed before the drain")
	require.Positive(t, refused, "reservations refused after the drain")
}

func TestLinkedReservation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	// Devices 0..7 on two nodes; links: a = {1, 2}, b = {4, 5, 6}.
	makePool(t, db, poolSpec{ID: "p", Nodes: 2, PerNode: 4, Tenants: map[string]int{"acme": 10},
		Links: map[string][]int{"a": {1, 2}, "b": {4, 5, 6}}})
	start, end := hours(0, 2)
	r, err := reserve(t, db.Pool, capacity.ReserveParams{PoolID: "p", Tenant: "acme", Devices: 2, Linked: true, Start: start, End: end, TTL: time.Minute})
	require.NoError(t, err)
	require.Equal(t, "a", r.LinkID)
	require.Equal(t, []string{"p-n0-d01", "p-n0-d02"}, r.Devices)
	r, err = reserve(t, db.Pool, capacity.ReserveParams{PoolID: "p", Tenant: "acme", Devices: 3, Linked: true, Start: start, End: end, TTL: time.Minute})
	require.NoError(t, err)
	require.Equal(t, "b", r.LinkID)
	require.Equal(t, []string{"p-n1-d00", "p-n1-d01", "p-n1-d02"}, r.Devices)
	_, err = reserve(t, db.Pool, capacity.ReserveParams{PoolID: "p", Tenant: "acme", Devices: 2, Linked: true, Start: start, End: end, TTL: time.Minute})
	require.True(t, fault.Has(err, fault.Conflict), "every link is taken: %v", err)
	// Unlinked, three devices are still free.
	free, err := capacity.ListFree(ctx, db.Pool, &capacity.ListFreeParams{PoolID: "p", Start: start, End: end})
	require.NoError(t, err)
	require.Len(t, free, 3)
	r, err = reserve(t, db.Pool, capacity.ReserveParams{PoolID: "p", Tenant: "acme", Devices: 3, Start: start, End: end, TTL: time.Minute})
	require.NoError(t, err)
	require.Equal(t, []string{"p-n0-d00", "p-n0-d03", "p-n1-d03"}, r.Devices)
	checkInvariants(t, db, "end")
}

// TestConcurrentExtensions extends one hold from many goroutines at once, all
// with the version they read: exactly one extension is granted, the others get
// CONFLICT, and the expiry moved by exactly one extension.
func TestConcurrentExtensions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	require.NoError(t, clock.UseSim(ctx, db.Pool, t0))
	makePool(t, db, poolSpec{ID: "p", Nodes: 1, PerNode: 2, Tenants: map[string]int{"acme": 2}})
	start, end := hours(0, 1)
	r, err := reserve(t, db.Pool, capacity.ReserveParams{PoolID: "p", Tenant: "acme", Devices: 2, Start: start, End: end, TTL: time.Minute})
	require.NoError(t, err)

	const n = 16
	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		granted   int
		conflicts int
	)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := inTx(t, db.Pool, func(tx pgx.Tx) (*capacity.Reservation, error) {
				return capacity.ExtendTx(ctx, tx, &capacity.ExtendParams{ReservationID: r.ID, Version: r.Version, By: time.Minute, End: end.Add(time.Hour)})
			})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				granted++
			case fault.Has(err, fault.Conflict):
				conflicts++
			default:
				t.Errorf("extend: %v", err)
			}
		}()
	}
	wg.Wait()
	require.Equal(t, 1, granted)
	require.Equal(t, n-1, conflicts)
	got, err := capacity.Get(ctx, db.Pool, r.ID)
	require.NoError(t, err)
	require.Equal(t, 1, got.Extensions)
	require.Equal(t, r.Version+1, got.Version)
	require.Equal(t, r.ExpiresAt.Add(time.Minute), got.ExpiresAt, "one extension's worth, not a lost update nor two")
	checkInvariants(t, db, "end")
}

// TestExtendIntoAnotherBooking refuses an extension whose longer range overlaps
// another live booking, and leaves the hold as it was.
func TestExtendIntoAnotherBooking(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	makePool(t, db, poolSpec{ID: "p", Nodes: 1, PerNode: 1, Tenants: map[string]int{"acme": 2}})
	a, err := reserve(t, db.Pool, capacity.ReserveParams{PoolID: "p", Tenant: "acme", Devices: 1, Start: t0, End: t0.Add(time.Hour), TTL: time.Minute})
	require.NoError(t, err)
	_, err = reserve(t, db.Pool, capacity.ReserveParams{PoolID: "p", Tenant: "acme", Devices: 1, Start: t0.Add(2 * time.Hour), End: t0.Add(3 * time.Hour), TTL: time.Minute})
	require.NoError(t, err)
	err = pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		_, err := capacity.ExtendTx(ctx, tx, &capacity.ExtendParams{ReservationID: a.ID, Version: a.Version, End: t0.Add(150 * time.Minute)})
		require.True(t, fault.Has(err, fault.Conflict), "overlapping extension: %v", err)
		_, err = tx.Exec(ctx, `SELECT 1`) // the transaction is still usable
		return err
	})
	require.NoError(t, err)
	got, _ := capacity.Get(ctx, db.Pool, a.ID)
	require.Equal(t, a.Version, got.Version)
	require.Equal(t, t0.Add(time.Hour), got.End.UTC())
	_, err = inTx(t, db.Pool, func(tx pgx.Tx) (*capacity.Reservation, error) {
		return capacity.ExtendTx(ctx, tx, &capacity.ExtendParams{ReservationID: a.ID, Version: a.Version, End: t0.Add(2 * time.Hour)})
	})
	require.NoError(t, err, "up to the other booking's start is fine")
	checkInvariants(t, db, "end")
}

func TestLapsedHoldCannotBeConfirmed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	require.NoError(t, clock.UseSim(ctx, db.Pool, t0))
	makePool(t, db, poolSpec{ID: "p", Nodes: 1, PerNode: 1, Tenants: map[string]int{"acme": 1}})
	r, err := reserve(t, db.Pool, capacity.ReserveParams{PoolID: "p", Tenant: "acme", Devices: 1, Start: t0, End: t0.Add(time.Hour), TTL: time.Minute})
	require.NoError(t, err)
	_, err = clock.Advance(ctx, db.Pool, time.Minute)
	require.NoError(t, err)
	_, err = inTx(t, db.Pool, func(tx pgx.Tx) (*capacity.Reservation, error) {
		return capacity.ConfirmTx(ctx, tx, &capacity.ConfirmParams{ReservationID: r.ID})
	})
	require.True(t, fault.Has(err, fault.Conflict), "confirming a lapsed hold: %v", err)
	_, err = inTx(t, db.Pool, func(tx pgx.Tx) (*capacity.Reservation, error) {
		return capacity.ExtendTx(ctx, tx, &capacity.ExtendParams{ReservationID: r.ID, Version: r.Version, By: time.Minute})
	})
	require.True(t, fault.Has(err, fault.Conflict), "extending a lapsed hold: %v", err)
	res, err := inTx(t, db.Pool, func(tx pgx.Tx) (*capacity.ExpireResult, error) {
		return capacity.ExpireHoldsTx(ctx, tx, &capacity.ExpireParams{PoolID: "p", ReservationID: r.ID})
	})
	require.NoError(t, err)
	require.Equal(t, []int64{r.ID}, res.Expired)
	res, err = inTx(t, db.Pool, func(tx pgx.Tx) (*capacity.ExpireResult, error) {
		return capacity.ExpireHoldsTx(ctx, tx, &capacity.ExpireParams{PoolID: "p", ReservationID: r.ID})
	})
	require.NoError(t, err)
	require.Empty(t, res.Expired, "expired once")
	q, _ := capacity.GetQuota(ctx, db.Pool, "acme", "p")
	require.Equal(t, 0, q.Used)
	checkInvariants(t, db, "end")
}

func TestInvalidArguments(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	makePool(t, db, poolSpec{ID: "p", Nodes: 1, PerNode: 1, Tenants: map[string]int{"acme": 1}})
	bad := []capacity.ReserveParams{
		{Tenant: "acme", Devices: 1, Start: t0, End: t0.Add(time.Hour), TTL: time.Minute},
		{PoolID: "p", Tenant: "acme", Devices: 0, Start: t0, End: t0.Add(time.Hour), TTL: time.Minute},
		{PoolID: "p", Tenant: "acme", Devices: capacity.MaxDevices + 1, Start: t0, End: t0.Add(time.Hour), TTL: time.Minute},
		{PoolID: "p", Tenant: "acme", Devices: 1, Start: t0, End: t0, TTL: time.Minute},
		{PoolID: "p", Tenant: "acme", Devices: 1, Start: t0, End: t0.Add(time.Hour)},
	}
	for _, p := range bad {
		_, err := reserve(t, db.Pool, p)
		require.True(t, fault.Has(err, fault.InvalidArgument), "%+v: %v", p, err)
	}
	_, err := inTx(t, db.Pool, func(tx pgx.Tx) (*capacity.Reservation, error) {
		return capacity.ConfirmTx(ctx, tx, &capacity.ConfirmParams{ReservationID: 42})
	})
	require.True(t, fault.Has(err, fault.NotFound), "%v", err)
	require.True(t, fault.Has(capacity.AddNode(ctx, db.Pool, &capacity.AddNodeParams{PoolID: "nope", NodeID: "x"}), fault.NotFound))
	require.True(t, fault.Has(capacity.CreatePool(ctx, db.Pool, &capacity.CreatePoolParams{PoolID: "p"}), fault.Conflict))
}

// TestReserveErrorKeepsTheCallersWrites: the caller writes in its transaction,
// then ReserveTx fails (each way it can: no quota, quota exhausted, too few
// devices after the quota was charged, a linked reservation with no link free);
// the caller goes on in the same transaction and commits. Its writes, before and
// after the failure, are there; nothing of the failed reservation is (no
// reservation, booking, expiry job or quota charge): the savepoint rolled back
// the reservation alone.
func TestReserveErrorKeepsTheCallersWrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	makePool(t, db, poolSpec{ID: "p", Nodes: 1, PerNode: 2, Tenants: map[string]int{"acme": 1, "big": 5},
		Links: map[string][]int{"pair": {0, 1}}})
	db.MustExec(t, `CREATE TABLE caller_writes (id int PRIMARY KEY, note text NOT NULL)`)
	start, end := hours(0, 1)
	// acme uses its whole quota of 1, on one of the two devices.
	_, err := reserve(t, db.Pool, capacity.ReserveParams{PoolID: "p", Tenant: "acme", Devices: 1, Start: start, End: end, TTL: time.Hour})
	require.NoError(t, err)

	counts := func() [4]int {
		return [4]int{
			db.MustCount(t, `SELECT count(*) FROM capacity_reservations`),
			db.MustCount(t, `SELECT count(*) FROM capacity_bookings`),
			db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'capacity_hold_expiry'`),
			db.MustCount(t, `SELECT coalesce(sum(used), 0) FROM capacity_quota_usage`),
		}
	}
	before := counts()
	for i, c := range []struct {
		name string
		p    capacity.ReserveParams
		want fault.Code
	}{
		{"no quota", capacity.ReserveParams{Tenant: "nobody", Devices: 1}, fault.NotFound},
		{"quota exhausted", capacity.ReserveParams{Tenant: "acme", Devices: 1}, fault.Conflict},
		{"too few devices, after charging the quota", capacity.ReserveParams{Tenant: "big", Devices: 2}, fault.Conflict},
		{"no link free, after charging the quota", capacity.ReserveParams{Tenant: "big", Devices: 2, Linked: true}, fault.Conflict},
	} {
		c.p.PoolID, c.p.Start, c.p.End, c.p.TTL = "p", start, end, time.Hour
		var xminBefore, xminAfter uint32
		err := pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
			if err := tx.QueryRow(ctx, `INSERT INTO caller_writes VALUES ($1, 'before') RETURNING xmin::text::bigint`, 2*i).Scan(&xminBefore); err != nil {
				return err
			}
			_, err := capacity.ReserveTx(ctx, tx, &c.p)
			if c.want != fault.CodeOf(err) {
				return fmt.Errorf("%s: want %s, got %w", c.name, c.want, err)
			}
			return tx.QueryRow(ctx, `INSERT INTO caller_writes VALUES ($1, 'after') RETURNING xmin::text::bigint`, 2*i+1).Scan(&xminAfter)
		})
		require.NoError(t, err, "%s: the caller's transaction goes on and commits", c.name)
		require.Equal(t, xminBefore, xminAfter, "%s: the caller's writes before and after, at one level: the failed reservation left no savepoint open", c.name)
		require.Equal(t, 2*(i+1), db.MustCount(t, `SELECT count(*) FROM caller_writes`), "%s: the caller's writes before and after the error committed", c.name)
		require.Equal(t, before, counts(), "%s: reservations, bookings, expiry jobs and quota usage as before", c.name)
	}
	checkInvariants(t, db, "end")
}

// TestQuotaCheckConstraint: the quota's CHECK (0 <= used <= quota_limit) refuses
// a direct write that would break it, whatever the code does (SQLSTATE 23514),
// and SetQuota turns it into CONFLICT.
func TestQuotaCheckConstraint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	makePool(t, db, poolSpec{ID: "p", Nodes: 1, PerNode: 4, Tenants: map[string]int{"acme": 2}})
	start, end := hours(0, 1)
	_, err := reserve(t, db.Pool, capacity.ReserveParams{PoolID: "p", Tenant: "acme", Devices: 2, Start: start, End: end, TTL: time.Hour})
	require.NoError(t, err)

	for _, set := range []string{"used = used + 1", "quota_limit = 1", "used = -1"} {
		_, err := db.Exec(ctx, `UPDATE capacity_quota_usage SET `+set+` WHERE tenant = 'acme' AND pool_id = 'p'`)
		require.Equal(t, "23514", pg.SQLState(err), "SET %s: %v", set, err)
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr))
		require.Equal(t, "capacity_quota_within_limit", pgErr.ConstraintName, "SET %s", set)
	}
	err = capacity.SetQuota(ctx, db.Pool, &capacity.SetQuotaParams{Tenant: "acme", PoolID: "p", Limit: 1})
	require.Equal(t, fault.Conflict, fault.CodeOf(err), "a limit below the usage, through the API: %v", err)
	require.Equal(t, "23514", pg.SQLState(err), "refused by the CHECK: %v", err)
	q, err := capacity.GetQuota(ctx, db.Pool, "acme", "p")
	require.NoError(t, err)
	require.Equal(t, 2, q.Limit)
	require.Equal(t, 2, q.Used)
	checkInvariants(t, db, "end")
}
