package capacity_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/capacity"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

// TestOverlapConstraintSurvivesRescansAcrossItsIndexSplit is the torture
// anomaly, made deterministic. PostgreSQL 15's GiST index scans remember the
// items they find dead (kill_prior_tuple) and mark them LP_DEAD later; a
// rescan (each outer row of a nested loop) keeps what the previous round
// remembered, and while the root is the only page nothing is applied. When the
// root splits in the middle of such a statement, the next round applies the
// remembered offsets, which belonged to the old root page, to a new leaf: live
// bookings' index items are marked dead, every later scan skips them, and the
// exclusion constraint admits an overlapping booking (see capacity/0008).
//
// The statement here is the kind the capacity code and the invariant checks
// run: for each device of the pool, NOT EXISTS a live booking over a range,
// planned as a nested loop over an index of the bookings; some of the index's
// items point to released (dead) bookings, and halfway through, another
// writer's bookings (capacity_reserve_fast, planned under the same settings)
// split the index's root. Sequential and bitmap scans are off, so every plan
// takes an index scan wherever one is possible: with the exclusion index out of
// the planner's reach (capacity/0008) none is, and afterwards every live
// booking still refuses an overlapping one. Before 0008 this test admits
// overlaps with about a tenth of the 240 bookings.
func TestOverlapConstraintSurvivesRescansAcrossItsIndexSplit(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	makePool(t, db, poolSpec{ID: "g", Nodes: 4, PerNode: 10, Tenants: map[string]int{"t": 1000}})
	from, to := hours(0, 1)
	dead, err := reserve(t, db.Pool, capacity.ReserveParams{PoolID: "g", Tenant: "t", Devices: 20, Start: from, End: to, TTL: time.Hour})
	require.NoError(t, err)
	_, err = inTx(t, db.Pool, func(tx pgx.Tx) (*capacity.Reservation, error) {
		return capacity.ReleaseTx(ctx, tx, &capacity.ReleaseParams{ReservationID: dead.ID})
	})
	require.NoError(t, err)
	from, to = hours(1, 2)
	_, err = reserve(t, db.Pool, capacity.ReserveParams{PoolID: "g", Tenant: "t", Devices: 40, Start: from, End: to, TTL: time.Hour})
	require.NoError(t, err)

	// The other writer: bookings of every device over five later ranges.
	db.MustExec(t, `
CREATE FUNCTION split_overlap_index() RETURNS integer LANGUAGE plpgsql AS $$
BEGIN
    FOR h IN 10 .. 14 LOOP
        PERFORM capacity_reserve_fast('g', 't', timestamptz '2030-01-01' + make_interval(hours => h),
                                      timestamptz '2030-01-01' + make_interval(hours => h + 1), 40, 3600, 0);
    END LOOP;
    RETURN 0;
END $$`)
	err = pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off;
SET LOCAL enable_hashjoin = off; SET LOCAL enable_mergejoin = off; SET LOCAL enable_material = off`)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `
SELECT count(*) FROM (
    SELECT d.id, CASE WHEN d.id = 'g-n2-d00' THEN split_overlap_index() ELSE 0 END AS x
      FROM capacity_devices d WHERE d.pool_id = 'g' ORDER BY d.id OFFSET 0) d
 WHERE NOT EXISTS (SELECT 1 FROM capacity_bookings b
                    WHERE b.device_id = d.id AND b.state IN ('hold', 'confirmed')
                      AND b.during && tstzrange('2030-01-01', '2030-01-01 02:00'))`)
		return err
	})
	require.NoError(t, err)

	// Every live booking refuses an overlapping one.
	var other int64
	require.NoError(t, db.Pool.QueryRow(ctx, `INSERT INTO capacity_reservations (pool_id, tenant, during, device_count, expires_at)
VALUES ('g', 't', tstzrange('2030-02-01', '2030-02-02'), 1, compute_now() + interval '1 hour') RETURNING id`).Scan(&other))
	// Read from the heap alone: the index may have lost them.
	type booking struct {
		id     int64
		device string
	}
	var live []booking
	err = pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `SET LOCAL enable_indexscan = off; SET LOCAL enable_bitmapscan = off; SET LOCAL enable_indexonlyscan = off`)
		if err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT id, device_id FROM capacity_bookings WHERE state IN ('hold', 'confirmed') ORDER BY id`)
		if err != nil {
			return err
		}
		live, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (booking, error) {
			var b booking
			return b, r.Scan(&b.id, &b.device)
		})
		return err
	})
	require.NoError(t, err)
	require.Len(t, live, 240)
	var admitted []int64
	for _, b := range live {
		_, err := db.Pool.Exec(ctx, `INSERT INTO capacity_bookings (reservation_id, device_id, node_id, pool_id, tenant, during, state)
SELECT $1, b.device_id, b.node_id, b.pool_id, b.tenant, b.during, 'hold' FROM capacity_bookings b WHERE b.id = $2`, other, b.id)
		if pg.SQLState(err) != "23P01" {
			require.NoError(t, err)
			admitted = append(admitted, b.id)
			db.MustExec(t, `DELETE FROM capacity_bookings WHERE reservation_id = $1`, other)
		}
	}
	require.Empty(t, admitted, "live bookings whose overlap the exclusion constraint admitted")
}
