package capacity

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
)

// ReserveParams are ReserveTx's parameters.
type ReserveParams struct {
	PoolID  string
	Tenant  string
	Devices int  // how many devices, 1 to MaxDevices
	Linked  bool // all devices from one link (see LinkDevices)
	// Start and End bound the booked range [Start, End).
	Start, End time.Time
	// TTL is how long the hold lasts, from compute_now(), unless confirmed or
	// extended.
	TTL time.Duration
}

func (p *ReserveParams) validate() error {
	switch {
	case p == nil:
		return fault.New(fault.InvalidArgument, "reserve: no parameters")
	case !validID(p.PoolID) || !validID(p.Tenant):
		return fault.New(fault.InvalidArgument, "reserve: a pool id and a tenant of 1 to 200 bytes are required")
	case p.Devices < 1 || p.Devices > MaxDevices:
		return fault.New(fault.InvalidArgument, "reserve: %d devices: want 1 to %d", p.Devices, MaxDevices)
	case p.Start.IsZero() || !p.End.After(p.Start):
		return fault.New(fault.InvalidArgument, "reserve: the range [%s, %s) is empty", p.Start.Format(time.RFC3339), p.End.Format(time.RFC3339))
	case p.TTL <= 0:
		return fault.New(fault.InvalidArgument, "reserve: the hold TTL %s is not positive", p.TTL)
	}
	return checkText("reserve", "pool id", p.PoolID, "tenant", p.Tenant)
}

// ReserveTx books p.Devices devices of a pool over [p.Start, p.End) for a
// tenant, as a hold that lapses p.TTL from compute_now() unless confirmed or
// extended, in the caller's transaction tx. In the same transaction it enqueues
// the hold's expiry job (jobs.CapacityHoldExpiry) for that time: if tx rolls back,
// so does everything.
//
// It charges the tenant's quota first, then books devices of active nodes,
// each under its row lock. It first books, in one statement, the first free
// devices that no other transaction holds, from a random point of the pool's
// node-by-node order (so concurrent reservations spread over the nodes). If one
// of them was taken meanwhile (an exclusion violation, SQLSTATE 23P01) or there
// are too few, that attempt rolls back (to its savepoint) and the reservation is
// made again device by device, a lost device (one the guarded insert or the
// exclusion constraint finds taken: no row, no error, so no savepoint per
// device) being given up for the next (counted in Reservation.Retries); only if that
// finds too few devices does a second pass wait for the devices other
// transactions hold, in device id order. Everything runs in a savepoint: an
// error leaves tx as it was.
//
// It returns INVALID_ARGUMENT for bad parameters, NOT_FOUND when the tenant has
// no quota in the pool, and CONFLICT when the quota would be exceeded or the pool
// has too few free devices (on active nodes, free over the whole range, and, for
// a linked reservation, in one link).
func ReserveTx(ctx context.Context, tx pgx.Tx, p *ReserveParams) (*Reservation, error) {
	if err := p.validate(); err != nil {
		return nil, err
	}
	// The common case first: everything in one savepoint, the quota, the
	// reservation and its devices by one statement (capacity_reserve_fast). If
	// that statement loses a device (23P01) or finds too few that nobody holds,
	// the savepoint rolls back and the reservation is made again, device by
	// device, waiting if it must. A linked reservation goes that way directly.
	retries := 0
	if !p.Linked {
		r, err := reserveFast(ctx, tx, p)
		switch {
		case err == nil:
			return r, nil
		case pg.SQLState(err) == "23P01":
			retries = 1
		case pg.SQLState(err) == "BC001":
		default:
			return nil, err
		}
	}
	var out *Reservation
	err := pg.InTx(ctx, tx, func(ctx context.Context, tx pgx.Tx) error {
		r, err := reserve(ctx, tx, p)
		out = r
		return err
	})
	if err != nil {
		return nil, err
	}
	out.Retries += retries
	return out, nil
}

// tenantReservableSQL refuses a reservation of a suspended or deleted tenant
// (migrations/tenancy/0001_tenant_states.sql): BC010, CONFLICT.
const tenantReservableSQL = `SELECT compute_tenant_reservable($1)`

// reserveSavepoint is the savepoint of reserveFast. Named by the statement that
// opens it (not by pgx), so that it goes in one round trip with the first
// statement; a savepoint of the same name that the caller holds is only hidden
// until this one is released.
const reserveSavepoint = "capacity_reserve_fast"

// reserveFast makes a reservation that is not linked in three round trips, in a
// savepoint: the savepoint and capacity_reserve_fast (quota, reservation, the
// devices nobody holds, in lock order) in one batch; the expiry job; the
// counters (node_resources, then the rollup) with the savepoint's release in
// another batch. Any error rolls the savepoint back, so tx is as it was: an
// error of SQLSTATE 23P01 or BC001 says to book device by device instead.
func reserveFast(ctx context.Context, tx pgx.Tx, p *ReserveParams) (_ *Reservation, err error) {
	open := false
	defer func() {
		if err != nil && open {
			// Back to before the savepoint (a failed rollback, on a broken
			// connection, leaves tx unusable, as the error says).
			_, _ = tx.Exec(context.WithoutCancel(ctx), "ROLLBACK TO SAVEPOINT "+reserveSavepoint+"; RELEASE SAVEPOINT "+reserveSavepoint)
		}
	}()
	r := &Reservation{PoolID: p.PoolID, Tenant: p.Tenant, State: Hold, DeviceCount: p.Devices, Version: 1}
	var (
		outcome             string
		limit, used, shards *int32
		id                  *int64
		start, end, exp, at *time.Time
		devices, nodes      []string
		stripes             []int32
	)
	b := &pgx.Batch{}
	b.Queue("SAVEPOINT " + reserveSavepoint)
	b.Queue(tenantReservableSQL, p.Tenant)
	b.Queue(`SELECT * FROM capacity_reserve_fast($1, $2, $3, $4, $5, $6, $7)`,
		p.PoolID, p.Tenant, p.Start, p.End, p.Devices, p.TTL.Seconds(), rand.Int32())
	res := tx.SendBatch(ctx, b)
	_, err = res.Exec()
	if err == nil {
		open = true
		_, err = res.Exec()
	}
	if err == nil {
		err = res.QueryRow().Scan(&outcome, &limit, &used, &id, &start, &end, &exp, &at, &shards, &devices, &nodes, &stripes)
	}
	if cerr := res.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		if s := pg.SQLState(err); s == "23P01" || s == "BC001" {
			return nil, err // as is: the caller books device by device
		}
		return nil, translate(err, "reservation of %s in pool %s", p.Tenant, p.PoolID)
	}
	switch outcome {
	case "no_quota":
		return nil, fault.New(fault.NotFound, "tenant %s has no quota in pool %s", p.Tenant, p.PoolID)
	case "quota":
		return nil, fault.New(fault.Conflict, "tenant %s's quota in pool %s is exhausted: %d of %d devices in use, %d more asked", p.Tenant, p.PoolID, *used, *limit, p.Devices)
	case "booked":
	default:
		return nil, fault.New(fault.Internal, "reservation of %s in pool %s: unexpected outcome %q", p.Tenant, p.PoolID, outcome)
	}
	r.ID, r.Start, r.End, r.ExpiresAt, r.CreatedAt, r.Devices = *id, *start, *end, *exp, *at, devices

	// The expiry job, scheduled for the hold's expiry in real time; the worker
	// checks compute_now() (and snoozes while the hold is not due). Inserted
	// before the counters, so the rollup row is locked for as short a time as
	// possible.
	_, err = jobs.InsertTx(ctx, tx, jobs.CapacityHoldExpiry{PoolID: p.PoolID, ReservationID: r.ID}, &river.InsertOpts{
		Queue:       jobs.ShardQueue(jobs.ShardOf(p.PoolID, int(*shards))),
		ScheduledAt: time.Now().Add(p.TTL),
	})
	if err != nil {
		return nil, pg.Translate(fmt.Errorf("error enqueueing the expiry of reservation %d: %w", r.ID, err))
	}

	// node_resources, then pool_capacity_rollup; then the savepoint's release.
	d := deltas{}
	for i := range devices {
		d.add(nodes[i], int(stripes[i]), Hold, 1)
	}
	b = &pgx.Batch{}
	b.Queue(applyCountsSQL, d.args(p.PoolID, nil)...)
	b.Queue("RELEASE SAVEPOINT " + reserveSavepoint)
	res = tx.SendBatch(ctx, b)
	for i := 0; i < b.Len() && err == nil; i++ {
		_, err = res.Exec()
	}
	if cerr := res.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, pg.Translate(fmt.Errorf("error updating the counters of pool %s: %w", p.PoolID, err))
	}
	open = false
	return r, nil
}

// booked is one device booked (or a candidate) by a reservation.
type booked struct {
	device, node string
	spread       int32 // the device's place in the first pass's order
	stripe       int   // its node's rollup stripe
}

// errTooFew rolls back a group's savepoint when it could not supply every device.
var errTooFew = errors.New("too few free devices")

// reserve makes the reservation in tx device by device: the slow path of
// ReserveTx, after capacity_reserve_fast, and the only one of a linked
// reservation. It tries the groups device by device, then waiting.
func reserve(ctx context.Context, tx pgx.Tx, p *ReserveParams) (*Reservation, error) {
	// 1. quota_usage: charge first; the reservation row is inserted by the same
	// statement (a new row: nobody else can lock it; its foreign key takes the
	// pool's key-share lock after the quota row, in lock order).
	r := &Reservation{PoolID: p.PoolID, Tenant: p.Tenant, State: Hold, DeviceCount: p.Devices, Version: 1}
	if _, err := tx.Exec(ctx, tenantReservableSQL, p.Tenant); err != nil {
		return nil, translate(err, "reservation of %s in pool %s", p.Tenant, p.PoolID)
	}
	var shards int
	err := tx.QueryRow(ctx, `
WITH q AS (
    UPDATE capacity_quota_usage SET used = used + $5, updated_at = compute_now()
     WHERE tenant = $2 AND pool_id = $1 AND used + $5 <= quota_limit
    RETURNING used
)
INSERT INTO capacity_reservations (pool_id, tenant, during, device_count, expires_at)
SELECT $1, $2, tstzrange($3, $4), $5, compute_now() + make_interval(secs => $6) FROM q
RETURNING id, lower(during), upper(during), expires_at, created_at, (SELECT shard_count FROM compute_settings)`,
		p.PoolID, p.Tenant, p.Start, p.End, p.Devices, p.TTL.Seconds()).Scan(&r.ID, &r.Start, &r.End, &r.ExpiresAt, &r.CreatedAt, &shards)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, quotaRefusal(ctx, tx, p)
	}
	if err != nil {
		return nil, translate(err, "reservation of %s in pool %s", p.Tenant, p.PoolID)
	}

	// The expiry job, scheduled for the hold's expiry in real time; the worker
	// checks compute_now() (and snoozes while the hold is not due). Inserted now,
	// so the rollup row below is locked for as short a time as possible.
	_, err = jobs.InsertTx(ctx, tx, jobs.CapacityHoldExpiry{PoolID: p.PoolID, ReservationID: r.ID}, &river.InsertOpts{
		Queue:       jobs.ShardQueue(jobs.ShardOf(p.PoolID, shards)),
		ScheduledAt: time.Now().Add(p.TTL),
	})
	if err != nil {
		return nil, pg.Translate(fmt.Errorf("error enqueueing the expiry of reservation %d: %w", r.ID, err))
	}

	// 2. devices: the groups to take them from (the pool, or each link that has
	// enough free devices by this statement's snapshot), first without waiting
	// for devices others are booking, then waiting in device order.
	var got []booked
	groups := []string{""}
	if p.Linked {
		if groups, err = linkCandidates(ctx, tx, p); err != nil {
			return nil, err
		}
	}
	for pass := 0; pass < 2 && got == nil; pass++ {
		for _, link := range groups {
			var retries int
			got, retries, err = bookGroup(ctx, tx, p, r.ID, link, pass == 1)
			r.Retries += retries
			if err != nil {
				return nil, err
			}
			if got != nil {
				r.LinkID = link
				break
			}
		}
	}
	if got == nil {
		what := "free devices on active nodes"
		if p.Linked {
			what = "free devices in any one link"
		}
		return nil, fault.New(fault.Conflict, "pool %s has fewer than %d %s over [%s, %s)",
			p.PoolID, p.Devices, what, p.Start.Format(time.RFC3339), p.End.Format(time.RFC3339))
	}
	if r.LinkID != "" {
		if _, err := tx.Exec(ctx, `UPDATE capacity_reservations SET link_id = $2 WHERE id = $1`, r.ID, r.LinkID); err != nil {
			return nil, translate(err, "reservation %d", r.ID)
		}
	}

	// 3. node_resources, then pool_capacity_rollup.
	d := deltas{}
	for _, b := range got {
		d.add(b.node, b.stripe, Hold, 1)
		r.Devices = append(r.Devices, b.device)
	}
	slices.Sort(r.Devices)
	if err := d.apply(ctx, tx, p.PoolID, nil); err != nil {
		return nil, err
	}
	return r, nil
}

// quotaRefusal explains why the quota charge changed nothing.
func quotaRefusal(ctx context.Context, tx pgx.Tx, p *ReserveParams) error {
	var limit, used int
	err := tx.QueryRow(ctx, `SELECT quota_limit, used FROM capacity_quota_usage WHERE tenant = $1 AND pool_id = $2`, p.Tenant, p.PoolID).Scan(&limit, &used)
	if errors.Is(err, pgx.ErrNoRows) {
		return fault.New(fault.NotFound, "tenant %s has no quota in pool %s", p.Tenant, p.PoolID)
	}
	if err != nil {
		return translate(err, "quota of %s in pool %s", p.Tenant, p.PoolID)
	}
	return fault.New(fault.Conflict, "tenant %s's quota in pool %s is exhausted: %d of %d devices in use, %d more asked", p.Tenant, p.PoolID, used, limit, p.Devices)
}

// freeDeviceSQL is the condition for device d being bookable over the range
// tstzrange($s, $e) (with $s, $e the given parameter numbers): its node is
// active and no live booking of it overlaps the range.
func freeDeviceSQL(s, e int) string {
	return fmt.Sprintf(`d.node_active AND NOT EXISTS (
        SELECT 1 FROM capacity_bookings b
         WHERE b.device_id = d.id AND b.state IN ('hold', 'confirmed') AND b.during && tstzrange($%d, $%d))`, s, e)
}

// linkCandidates lists the links of the pool with enough free devices, by id.
func linkCandidates(ctx context.Context, tx pgx.Tx, p *ReserveParams) ([]string, error) {
	rows, err := tx.Query(ctx, `
SELECT l.link_id
  FROM capacity_device_links l
  JOIN capacity_devices d ON d.id = l.device_id
 WHERE l.pool_id = $1 AND `+freeDeviceSQL(2, 3)+`
 GROUP BY l.link_id HAVING count(*) >= $4
 ORDER BY l.link_id`, p.PoolID, p.Start, p.End, p.Devices)
	if err != nil {
		return nil, translate(err, "links of pool %s", p.PoolID)
	}
	links, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, translate(err, "links of pool %s", p.PoolID)
	}
	return links, nil
}

// spreadSQL locks up to $8 free devices of pool $1 (optionally only those of
// link $6) that no other transaction holds, in (spread, id) order after the
// cursor ($4, $5): in round "from" those at or after the start (spread $7, any
// id), in round "before" those before it. The first pass uses it: it never waits, so any order
// is safe, and a random start spreads concurrent reservations over the nodes.
//
// The free check uses the statement's snapshot, but a device whose node was
// drained since then was updated by the drain (node_active), and locking it
// re-checks the WHERE on its new version; a booking committed since is caught by
// the per-device insert (or is a 23P01).
func spreadSQL(round string) string {
	cmp := ">="
	if round == "before" {
		cmp = "<"
	}
	return `
SELECT d.id, d.node_id, d.spread
  FROM capacity_devices d
 WHERE d.pool_id = $1 AND (d.spread, d.id) > ($4::int, $5::text) AND (d.spread, d.id) ` + cmp + ` ($7::int, '')
   AND ` + freeDeviceSQL(2, 3) + `
   AND ($6 = '' OR EXISTS (SELECT 1 FROM capacity_device_links l WHERE l.link_id = $6 AND l.device_id = d.id))
 ORDER BY d.spread, d.id
 LIMIT $8
   FOR NO KEY UPDATE SKIP LOCKED`
}

// waitSQL locks up to $6 free devices of pool $1 (optionally only those of link
// $5) with ids after $4, in id order, waiting for those other transactions hold:
// the second pass. Every waiting lock of a device is taken in id order, holding
// only devices of lower ids, so these waits never form a cycle.
var waitSQL = `
SELECT d.id, d.node_id, d.spread
  FROM capacity_devices d
 WHERE d.pool_id = $1 AND d.id > $4 AND ` + freeDeviceSQL(2, 3) + `
   AND ($5 = '' OR EXISTS (SELECT 1 FROM capacity_device_links l WHERE l.link_id = $5 AND l.device_id = d.id))
 ORDER BY d.id
 LIMIT $6
   FOR NO KEY UPDATE`

// insertBookingSQL books device $2 for reservation $1 if, in this statement's
// snapshot (taken under the device's lock), its node is active and nothing
// overlaps: no row means the device was lost since it was chosen. ON CONFLICT
// turns an overlap the snapshot did not show (a booking committed since) into
// no row as well, instead of a 23P01 that would need a savepoint to survive.
var insertBookingSQL = `
INSERT INTO capacity_bookings (reservation_id, device_id, node_id, pool_id, tenant, during, state)
SELECT $1, d.id, d.node_id, d.pool_id, $5, tstzrange($3, $4), 'hold'
  FROM capacity_devices d
 WHERE d.id = $2 AND ` + freeDeviceSQL(3, 4) + `
ON CONFLICT ON CONSTRAINT capacity_bookings_no_overlap DO NOTHING
RETURNING device_id, node_id`

// bookGroup books p.Devices devices of one group (the whole pool when link is
// "", else the link's devices) in a savepoint, or none: nil when the group cannot
// supply them all.
//
// The first pass (wait false) never waits for a lock: from a random point of
// the pool's (spread, id) order it books device by device, moving past a
// device it lost, around the whole order. The second
// pass (wait true) waits for the devices other transactions hold, in id order,
// holding only lower-ordered devices of the group.
func bookGroup(ctx context.Context, tx pgx.Tx, p *ReserveParams, resID int64, link string, wait bool) (got []booked, retries int, err error) {
	if wait {
		err = pg.InTx(ctx, tx, func(ctx context.Context, tx pgx.Tx) error {
			after := ""
			for len(got) < p.Devices {
				cands, err := lockCandidates(ctx, tx, p, waitSQL, p.PoolID, p.Start, p.End, after, link, p.Devices-len(got))
				if err != nil {
					return err
				}
				if len(cands) == 0 {
					return errTooFew
				}
				for _, c := range cands {
					after = c.device
					if err := bookOne(ctx, tx, p, resID, c, &got, &retries); err != nil {
						return err
					}
				}
			}
			return nil
		})
	} else {
		start := rand.Int32()
		err = pg.InTx(ctx, tx, func(ctx context.Context, tx pgx.Tx) error {
			for _, round := range []string{"from", "before"} {
				q := spreadSQL(round)
				cs, cid := int32(-1), ""
				for len(got) < p.Devices {
					cands, err := lockCandidates(ctx, tx, p, q, p.PoolID, p.Start, p.End, cs, cid, link, start, p.Devices-len(got))
					if err != nil {
						return err
					}
					if len(cands) == 0 {
						break
					}
					for _, c := range cands {
						cs, cid = c.spread, c.device
						if err := bookOne(ctx, tx, p, resID, c, &got, &retries); err != nil {
							return err
						}
					}
				}
			}
			if len(got) < p.Devices {
				return errTooFew
			}
			return nil
		})
	}
	if errors.Is(err, errTooFew) {
		return nil, retries, nil
	}
	if err != nil {
		return nil, retries, err
	}
	return got, retries, nil
}

// lockCandidates runs a locking query and returns its devices.
func lockCandidates(ctx context.Context, tx pgx.Tx, p *ReserveParams, q string, args ...any) ([]booked, error) {
	rows, err := tx.Query(ctx, q, args...)
	if err != nil {
		return nil, translate(err, "devices of pool %s", p.PoolID)
	}
	cands, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (booked, error) {
		var b booked
		err := row.Scan(&b.device, &b.node, &b.spread)
		b.stripe = int(b.spread % 8) // capacity_stripe(node_id)
		return b, err
	})
	if err != nil {
		return nil, translate(err, "devices of pool %s", p.PoolID)
	}
	return cands, nil
}

// bookOne books a locked candidate, appending it to got, or counts a retry.
func bookOne(ctx context.Context, tx pgx.Tx, p *ReserveParams, resID int64, c booked, got *[]booked, retries *int) error {
	ok, err := bookDevice(ctx, tx, p, resID, c.device)
	if err != nil {
		return err
	}
	if ok {
		*got = append(*got, c)
	} else {
		*retries++
	}
	return nil
}

// bookDevice books one locked device. It reports false when the device was
// lost to another reservation (the guarded insert found it taken, or the
// exclusion constraint did): no savepoint, since neither is an error.
func bookDevice(ctx context.Context, tx pgx.Tx, p *ReserveParams, resID int64, device string) (bool, error) {
	var dev, node string
	err := tx.QueryRow(ctx, insertBookingSQL, resID, device, p.Start, p.End, p.Tenant).Scan(&dev, &node)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, pgx.ErrNoRows):
		return false, nil
	}
	return false, translate(err, "booking of device %s", device)
}
