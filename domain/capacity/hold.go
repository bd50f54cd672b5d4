package capacity

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
)

// ConfirmParams are ConfirmTx's parameters.
type ConfirmParams struct {
	ReservationID int64
	// Version, when not zero, must be the reservation's current version.
	Version int64
}

// ConfirmTx turns a hold into a confirmed booking, which no longer expires, in
// the caller's transaction. It locks the reservation's devices, then the
// reservation (guarded: state hold, not lapsed by compute_now(), and Version
// when given), then updates node_resources and pool_capacity_rollup.
//
// It returns NOT_FOUND for an unknown reservation and CONFLICT, having changed
// nothing, when it is not a hold, its hold has lapsed (even if the expiry job has
// not released it yet), or its version moved.
func ConfirmTx(ctx context.Context, tx pgx.Tx, p *ConfirmParams) (*Reservation, error) {
	if p == nil || p.ReservationID <= 0 || p.Version < 0 {
		return nil, fault.New(fault.InvalidArgument, "confirm: a reservation id is required")
	}
	r, err := Get(ctx, tx, p.ReservationID)
	if err != nil {
		return nil, err
	}
	if r.State != Hold {
		return nil, fault.New(fault.Conflict, "reservation %d is %s, not a hold", r.ID, r.State)
	}
	if err := lockDevices(ctx, tx, r.Devices); err != nil {
		return nil, err
	}
	err = tx.QueryRow(ctx, `
UPDATE capacity_reservations
   SET state = 'confirmed', confirmed_at = compute_now(), version = version + 1
 WHERE id = $1 AND state = 'hold' AND expires_at > compute_now() AND ($2 = 0 OR version = $2)
RETURNING version, confirmed_at`, r.ID, p.Version).Scan(&r.Version, &r.ConfirmedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, refusal(ctx, tx, r.ID, "confirm", p.Version)
	}
	if err != nil {
		return nil, translate(err, "reservation %d", r.ID)
	}
	rows, err := tx.Query(ctx, `UPDATE capacity_bookings SET state = 'confirmed' WHERE reservation_id = $1 AND state = 'hold' RETURNING node_id, capacity_stripe(node_id)`, r.ID)
	if err != nil {
		return nil, translate(err, "bookings of reservation %d", r.ID)
	}
	d := deltas{}
	var (
		node   string
		stripe int
	)
	_, err = pgx.ForEachRow(rows, []any{&node, &stripe}, func() error {
		d.add(node, stripe, Hold, -1)
		d.add(node, stripe, Confirmed, 1)
		return nil
	})
	if err != nil {
		return nil, translate(err, "bookings of reservation %d", r.ID)
	}
	if err := d.apply(ctx, tx, r.PoolID, nil); err != nil {
		return nil, err
	}
	r.State = Confirmed
	return r, nil
}

// ExtendParams are ExtendTx's parameters.
type ExtendParams struct {
	ReservationID int64
	// Version is the version the caller read: the extension applies only to it,
	// so one extension is granted at a time.
	Version int64
	// By moves the hold's expiry later (from its current expiry).
	By time.Duration
	// End, when not zero, moves the end of the booked range to End (not earlier
	// than the current end).
	End time.Time
}

// ExtendTx extends a hold, one extension at a time, in a savepoint of the
// caller's transaction: its expiry moves p.By later and, with p.End, its range
// ends later. It locks the reservation's devices, then the reservation, guarded by
// state hold, not lapsed and p.Version; so of two concurrent extensions of one
// version the second finds the version moved and gets CONFLICT, never a lost
// update. A longer range that would overlap another live booking of one of its
// devices is CONFLICT too (the exclusion constraint's 23P01 is translated the
// same way, and the savepoint leaves tx as it was).
//
// It returns INVALID_ARGUMENT for bad parameters, NOT_FOUND for an unknown
// reservation and CONFLICT as above or when it is not a live hold.
func ExtendTx(ctx context.Context, tx pgx.Tx, p *ExtendParams) (*Reservation, error) {
	switch {
	case p == nil || p.ReservationID <= 0:
		return nil, fault.New(fault.InvalidArgument, "extend: a reservation id is required")
	case p.Version <= 0:
		return nil, fault.New(fault.InvalidArgument, "extend: the version read is required (one extension at a time)")
	case p.By < 0 || (p.By == 0 && p.End.IsZero()):
		return nil, fault.New(fault.InvalidArgument, "extend: By must be positive, or End given")
	}
	var out *Reservation
	err := pg.InTx(ctx, tx, func(ctx context.Context, tx pgx.Tx) error {
		r, err := Get(ctx, tx, p.ReservationID)
		if err != nil {
			return err
		}
		switch {
		case r.State != Hold:
			return fault.New(fault.Conflict, "reservation %d is %s, not a hold", r.ID, r.State)
		case r.Version != p.Version:
			return fault.New(fault.Conflict, "reservation %d changed (version %d, extension asked for %d): read it again", r.ID, r.Version, p.Version)
		case !p.End.IsZero() && p.End.Before(r.End):
			return fault.New(fault.InvalidArgument, "extend: End %s is before the range's end %s", p.End.Format(time.RFC3339), r.End.Format(time.RFC3339))
		}
		if err := lockDevices(ctx, tx, r.Devices); err != nil {
			return err
		}
		end := r.End
		if !p.End.IsZero() {
			end = p.End
		}
		if end.After(r.End) {
			// Under the device locks no other booking of these devices is in
			// flight: a committed overlap is found here, not by a 23P01 later.
			var other string
			err := tx.QueryRow(ctx, `
SELECT b.device_id FROM capacity_bookings b
 WHERE b.device_id = ANY($1) AND b.reservation_id <> $2 AND b.state IN ('hold', 'confirmed')
   AND b.during && tstzrange($3, $4)
 ORDER BY b.device_id LIMIT 1`, r.Devices, r.ID, r.End, end).Scan(&other)
			if err == nil {
				return fault.New(fault.Conflict, "extending reservation %d to %s would overlap another booking of device %s", r.ID, end.Format(time.RFC3339), other)
			}
			if !errors.Is(err, pgx.ErrNoRows) {
				return translate(err, "bookings of reservation %d", r.ID)
			}
		}
		err = tx.QueryRow(ctx, `
UPDATE capacity_reservations
   SET expires_at = expires_at + make_interval(secs => $3), during = tstzrange(lower(during), $4),
       version = version + 1, extensions = extensions + 1, last_extended_at = compute_now()
 WHERE id = $1 AND state = 'hold' AND expires_at > compute_now() AND version = $2
RETURNING version, extensions, expires_at`, r.ID, p.Version, p.By.Seconds(), end).Scan(&r.Version, &r.Extensions, &r.ExpiresAt)
		if errors.Is(err, pgx.ErrNoRows) {
			return refusal(ctx, tx, r.ID, "extend", p.Version)
		}
		if err != nil {
			return translate(err, "reservation %d", r.ID)
		}
		if end.After(r.End) {
			_, err := tx.Exec(ctx, `UPDATE capacity_bookings SET during = tstzrange(lower(during), $2) WHERE reservation_id = $1 AND state = 'hold'`, r.ID, end)
			if pg.SQLState(err) == "23P01" {
				return fault.Wrap(fault.Conflict, err, "extending reservation %d to %s overlaps another booking", r.ID, end.Format(time.RFC3339))
			}
			if err != nil {
				return translate(err, "bookings of reservation %d", r.ID)
			}
			r.End = end
		}
		out = r
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ReleaseParams are ReleaseTx's parameters.
type ReleaseParams struct {
	ReservationID int64
}

// ReleaseTx ends a live reservation (a hold, even a lapsed one the expiry job has
// not reached yet, or a confirmed booking), in the caller's transaction: its
// devices are free again and the tenant's quota is refunded. Lock order: the
// tenant's quota_usage row first (refund first), then the reservation (guarded:
// still live), its bookings, node_resources and pool_capacity_rollup. So a
// release racing the expiry job, or another release, ends it once: the loser gets
// CONFLICT having changed nothing.
//
// It returns NOT_FOUND for an unknown reservation and CONFLICT when it is no
// longer live.
func ReleaseTx(ctx context.Context, tx pgx.Tx, p *ReleaseParams) (*Reservation, error) {
	if p == nil || p.ReservationID <= 0 {
		return nil, fault.New(fault.InvalidArgument, "release: a reservation id is required")
	}
	// One statement (capacity_release): read the reservation and lock its
	// tenant's quota row (the quota first, as every transition out of the live
	// states does), then the guarded update, the bookings and the counters.
	var (
		outcome                      string
		r                            Reservation
		id, version                  *int64
		pool, tenant, state, link    *string
		start, end, expires, created *time.Time
		count, extensions            *int32
	)
	// The columns are NULL when the reservation does not exist.
	err := tx.QueryRow(ctx, `SELECT * FROM capacity_release($1)`, p.ReservationID).Scan(&outcome,
		&id, &pool, &tenant, &start, &end, &state, &count, &link, &r.Devices,
		&expires, &version, &extensions, &created, &r.ConfirmedAt, &r.EndedAt)
	if err != nil {
		return nil, translate(err, "reservation %d", p.ReservationID)
	}
	if outcome == "not_found" || id == nil {
		return nil, fault.New(fault.NotFound, "reservation %d does not exist", p.ReservationID)
	}
	r.ID, r.PoolID, r.Tenant, r.Start, r.End, r.State = *id, *pool, *tenant, *start, *end, State(*state)
	r.DeviceCount, r.LinkID, r.ExpiresAt, r.Version = int(*count), *link, *expires, *version
	r.Extensions, r.CreatedAt = int(*extensions), *created
	switch outcome {
	case "released":
		return &r, nil
	case "not_live":
		return nil, fault.New(fault.Conflict, "reservation %d is already %s", r.ID, r.State)
	case "changed":
		// Ended by someone else between the read and the guarded update.
		return nil, refusal(ctx, tx, r.ID, "release", 0)
	}
	return nil, fault.New(fault.Internal, "release of reservation %d: unexpected outcome %q", p.ReservationID, outcome)
}

// ExpireParams are ExpireHoldsTx's parameters.
type ExpireParams struct {
	PoolID string
	// ReservationID, when not zero, expires only that reservation.
	ReservationID int64
	// Limit bounds the holds expired by one call (default 500).
	Limit int
}

// ExpireResult is what ExpireHoldsTx did.
type ExpireResult struct {
	// Expired are the reservations this call expired, by id.
	Expired []int64
	// DueIn, for a ReservationID that is still a hold not yet due, is how long
	// until it is (by compute_now()).
	DueIn time.Duration
	// More says that more holds of the pool were due than Limit.
	More bool
}

// ExpireHoldsTx ends the holds of a pool whose expiry has passed by
// compute_now(), in the caller's transaction: the hold-expiry job's work. Each
// expired hold's quota is refunded and its devices are free again, exactly once:
// the quota rows are locked first, then each reservation is ended by an UPDATE
// guarded by state hold and expires_at <= compute_now(), so a hold that was
// confirmed, extended or released concurrently is left alone.
func ExpireHoldsTx(ctx context.Context, tx pgx.Tx, p *ExpireParams) (*ExpireResult, error) {
	if p == nil || !validID(p.PoolID) || p.ReservationID < 0 {
		return nil, fault.New(fault.InvalidArgument, "expire: a pool id is required")
	}
	if err := checkText("expire", "pool id", p.PoolID); err != nil {
		return nil, err
	}
	limit := p.Limit
	if limit <= 0 {
		limit = 500
	}
	res := &ExpireResult{}
	if p.ReservationID != 0 {
		var (
			state  State
			tenant string
			dueIn  float64
		)
		err := tx.QueryRow(ctx, `SELECT state, tenant, extract(epoch FROM expires_at - compute_now())::float8 FROM capacity_reservations WHERE id = $1 AND pool_id = $2`,
			p.ReservationID, p.PoolID).Scan(&state, &tenant, &dueIn)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, fault.New(fault.NotFound, "reservation %d of pool %s does not exist", p.ReservationID, p.PoolID)
		}
		if err != nil {
			return nil, translate(err, "reservation %d", p.ReservationID)
		}
		if state != Hold {
			return res, nil
		}
		if dueIn > 0 {
			res.DueIn = time.Duration(dueIn * float64(time.Second))
			return res, nil
		}
		ended, err := end(ctx, tx, p.PoolID, []endCandidate{{id: p.ReservationID, tenant: tenant}}, Expired, false)
		if err != nil {
			return nil, err
		}
		for _, e := range ended {
			res.Expired = append(res.Expired, e.id)
		}
		return res, nil
	}
	rows, err := tx.Query(ctx, `
SELECT id, tenant FROM capacity_reservations
 WHERE pool_id = $1 AND state = 'hold' AND expires_at <= compute_now()
 ORDER BY id LIMIT $2`, p.PoolID, limit+1)
	if err != nil {
		return nil, translate(err, "due holds of pool %s", p.PoolID)
	}
	cands, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (endCandidate, error) {
		var c endCandidate
		return c, row.Scan(&c.id, &c.tenant)
	})
	if err != nil {
		return nil, translate(err, "due holds of pool %s", p.PoolID)
	}
	if len(cands) > limit {
		cands, res.More = cands[:limit], true
	}
	if len(cands) == 0 {
		return res, nil
	}
	ended, err := end(ctx, tx, p.PoolID, cands, Expired, false)
	if err != nil {
		return nil, err
	}
	for _, e := range ended {
		res.Expired = append(res.Expired, e.id)
	}
	return res, nil
}

type endCandidate struct {
	id     int64
	tenant string
}

type endedReservation struct {
	id      int64
	tenant  string
	version int64
	endedAt time.Time
}

// end moves the candidate reservations of one pool to state to (Released: any
// live one; Expired: holds due by compute_now()) and refunds their quota, in lock
// order: the tenants' quota_usage rows (unless quotaLocked: the caller holds
// them), the reservations (by id), their bookings, node_resources,
// pool_capacity_rollup. It returns the reservations it ended: a candidate ended
// concurrently is skipped.
func end(ctx context.Context, tx pgx.Tx, pool string, cands []endCandidate, to State, quotaLocked bool) ([]endedReservation, error) {
	guard := `state IN ('hold', 'confirmed')`
	if to == Expired {
		guard = `state = 'hold' AND expires_at <= compute_now()`
	}
	tenants := make([]string, 0, len(cands))
	ids := make([]int64, 0, len(cands))
	for _, c := range cands {
		tenants = append(tenants, c.tenant)
		ids = append(ids, c.id)
	}
	slices.Sort(tenants)
	tenants = slices.Compact(tenants)
	slices.Sort(ids)

	// 1. quota_usage: lock first (the refund is written below, once we know
	// what ended).
	if !quotaLocked {
		if _, err := tx.Exec(ctx, `SELECT 1 FROM capacity_quota_usage WHERE pool_id = $1 AND tenant = ANY($2) ORDER BY tenant FOR NO KEY UPDATE`, pool, tenants); err != nil {
			return nil, translate(err, "quotas of pool %s", pool)
		}
	}
	// 2. the reservations, guarded; several are locked in id order first.
	if len(ids) > 1 {
		rows, err := tx.Query(ctx, `SELECT id FROM capacity_reservations WHERE id = ANY($1) AND `+guard+` ORDER BY id FOR NO KEY UPDATE`, ids)
		if err != nil {
			return nil, translate(err, "reservations of pool %s", pool)
		}
		if ids, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil {
			return nil, translate(err, "reservations of pool %s", pool)
		}
		if len(ids) == 0 {
			return nil, nil
		}
	}
	rows, err := tx.Query(ctx, `
UPDATE capacity_reservations SET state = $2, ended_at = compute_now(), version = version + 1
 WHERE id = ANY($1) AND `+guard+`
RETURNING id, tenant, version, ended_at`, ids, string(to))
	if err != nil {
		return nil, translate(err, "reservations of pool %s", pool)
	}
	ended, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (endedReservation, error) {
		var e endedReservation
		return e, row.Scan(&e.id, &e.tenant, &e.version, &e.endedAt)
	})
	if err != nil {
		return nil, translate(err, "reservations of pool %s", pool)
	}
	if len(ended) == 0 {
		return nil, nil
	}
	endedIDs := make([]int64, len(ended))
	for i, e := range ended {
		endedIDs[i] = e.id
	}
	// 3. their bookings (only the holder of a reservation's lock changes them),
	// with each booking's state before the update, for the counters.
	rows, err = tx.Query(ctx, `
UPDATE capacity_bookings b SET state = $2
  FROM capacity_bookings o
 WHERE o.id = b.id AND b.reservation_id = ANY($1) AND b.state IN ('hold', 'confirmed')
RETURNING b.tenant, b.node_id, o.state, capacity_stripe(b.node_id)`, endedIDs, string(to))
	if err != nil {
		return nil, translate(err, "bookings of pool %s", pool)
	}
	refunds := map[string]int{}
	d := deltas{}
	var (
		tenant, node string
		was          State
		stripe       int
	)
	_, err = pgx.ForEachRow(rows, []any{&tenant, &node, &was, &stripe}, func() error {
		refunds[tenant]++
		d.add(node, stripe, was, -1)
		return nil
	})
	if err != nil {
		return nil, translate(err, "bookings of pool %s", pool)
	}
	// 4. the refunds (their rows are locked), node_resources, the rollup.
	return ended, d.apply(ctx, tx, pool, refunds)
}

// refusal explains why a guarded update of a reservation changed nothing.
func refusal(ctx context.Context, tx pgx.Tx, id int64, op string, version int64) error {
	var (
		state  State
		lapsed bool
		cur    int64
		exp    time.Time
	)
	err := tx.QueryRow(ctx, `SELECT state, expires_at <= compute_now(), version, expires_at FROM capacity_reservations WHERE id = $1`, id).Scan(&state, &lapsed, &cur, &exp)
	if errors.Is(err, pgx.ErrNoRows) {
		return fault.New(fault.NotFound, "reservation %d does not exist", id)
	}
	if err != nil {
		return translate(err, "reservation %d", id)
	}
	switch {
	case op == "release" && !state.Live():
		return fault.New(fault.Conflict, "reservation %d is already %s", id, state)
	case op != "release" && state != Hold:
		return fault.New(fault.Conflict, "cannot %s reservation %d: it is %s, not a hold", op, id, state)
	case op != "release" && lapsed:
		return fault.New(fault.Conflict, "cannot %s reservation %d: its hold lapsed at %s", op, id, exp.Format(time.RFC3339Nano))
	case version != 0 && cur != version:
		return fault.New(fault.Conflict, "cannot %s reservation %d: it changed (version %d, asked for %d)", op, id, cur, version)
	}
	return fault.New(fault.Conflict, "cannot %s reservation %d: it changed concurrently", op, id)
}

// lockDevices locks devices in id order: the devices step of the lock order, and
// what keeps any two writers of one device's bookings from being in flight at
// once.
func lockDevices(ctx context.Context, tx pgx.Tx, devices []string) error {
	if len(devices) == 0 {
		return nil
	}
	_, err := tx.Exec(ctx, `SELECT id FROM capacity_devices WHERE id = ANY($1) ORDER BY id FOR NO KEY UPDATE`, devices)
	return translate(err, "devices %v", devices)
}

// deltas are changes to the live-booking counters, by node.
type deltas map[string]*nodeDelta

type nodeDelta struct {
	stripe           int // capacity_stripe(node)
	holds, confirmed int
}

func (d deltas) add(node string, stripe int, s State, n int) {
	v := d[node]
	if v == nil {
		v = &nodeDelta{stripe: stripe}
		d[node] = v
	}
	switch s {
	case Hold:
		v.holds += n
	case Confirmed:
		v.confirmed += n
	}
}

// apply writes quota refunds (already locked by the caller; tenant -> devices),
// then d to node_resources (in node order) and to the pool's rollup stripes (in
// stripe order): one statement, capacity_apply_counts (a PL/pgSQL function, so
// its plans are kept per connection), in lock order.
func (d deltas) apply(ctx context.Context, tx pgx.Tx, pool string, refunds map[string]int) error {
	args := d.args(pool, refunds)
	if args == nil {
		return nil
	}
	if _, err := tx.Exec(ctx, applyCountsSQL, args...); err != nil {
		return pg.Translate(fmt.Errorf("error updating the counters of pool %s: %w", pool, err))
	}
	return nil
}

// applyCountsSQL writes counter changes, in lock order: see
// capacity_apply_counts (migrations/capacity/0006_reserve_functions.sql) and
// deltas.args.
const applyCountsSQL = `SELECT capacity_apply_counts($1, $2, $3, $4, $5, $6, $7, $8, $9)`

// args are applyCountsSQL's arguments, each list sorted in lock order, or nil
// when there is nothing to write.
func (d deltas) args(pool string, refunds map[string]int) []any {
	tenants := make([]string, 0, len(refunds))
	for t := range refunds {
		tenants = append(tenants, t)
	}
	slices.Sort(tenants)
	amounts := make([]int32, len(tenants))
	for i, t := range tenants {
		amounts[i] = int32(refunds[t])
	}
	all := make([]string, 0, len(d))
	for n := range d {
		all = append(all, n)
	}
	slices.Sort(all)
	var (
		nodes           []string
		holds, confirmd []int32
		stripes         [8][2]int32
	)
	for _, n := range all {
		v := d[n]
		if v.holds == 0 && v.confirmed == 0 {
			continue
		}
		nodes = append(nodes, n)
		holds = append(holds, int32(v.holds))
		confirmd = append(confirmd, int32(v.confirmed))
		stripes[v.stripe][0] += int32(v.holds)
		stripes[v.stripe][1] += int32(v.confirmed)
	}
	var sIDs, sHolds, sConfirmed []int32
	for s, v := range stripes {
		if v[0] != 0 || v[1] != 0 {
			sIDs = append(sIDs, int32(s))
			sHolds = append(sHolds, v[0])
			sConfirmed = append(sConfirmed, v[1])
		}
	}
	if len(tenants) == 0 && len(nodes) == 0 && len(sIDs) == 0 {
		return nil
	}
	return []any{pool, tenants, amounts, nodes, holds, confirmd, sIDs, sHolds, sConfirmed}
}
