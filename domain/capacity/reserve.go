package capacity

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
// each under its row lock, one group at a time (the pool, or for a linked
// reservation each link with enough free devices): a group's devices, their
// bookings and the counters they charge are written by one statement
// (capacity_book_group), in a savepoint of the group's. The first pass takes
// only devices no other transaction holds, from a random point of the pool's
// node-by-node order (so concurrent reservations spread over the nodes),
// moving past a device that a concurrent reservation booked meanwhile (counted
// in Reservation.Retries); a group that cannot supply every device rolls back
// to its savepoint, giving up its locks, and only then does a second pass wait
// for the devices other transactions hold, in device id order. Everything runs
// in a savepoint: an error leaves tx as it was.
//
// A reservation that is not linked and meets no contention takes three round
// trips: the savepoint with the quota and the reservation; the expiry job; the
// group with the savepoint's release.
//
// It returns INVALID_ARGUMENT for bad parameters, NOT_FOUND when the tenant has
// no quota in the pool, and CONFLICT when the quota would be exceeded or the pool
// has too few free devices (on active nodes, free over the whole range, and, for
// a linked reservation, in one link).
func ReserveTx(ctx context.Context, tx pgx.Tx, p *ReserveParams) (_ *Reservation, err error) {
	if err := p.validate(); err != nil {
		return nil, err
	}
	open := false // the reservation's savepoint
	defer func() {
		if err != nil && open {
			// Back to before the savepoint (a failed rollback, on a broken
			// connection, leaves tx unusable, as the error says).
			_, _ = tx.Exec(context.WithoutCancel(ctx), "ROLLBACK TO SAVEPOINT "+reserveSavepoint+"; RELEASE SAVEPOINT "+reserveSavepoint)
		}
	}()

	// 1. quota_usage, then the reservation (its foreign key takes the pool's
	// key-share lock), in one batch with the savepoint.
	r := &Reservation{PoolID: p.PoolID, Tenant: p.Tenant, State: Hold, DeviceCount: p.Devices, Version: 1}
	var (
		outcome             string
		limit, used, shards *int32
		id                  *int64
		start, end, exp, at *time.Time
	)
	b := &pgx.Batch{}
	b.Queue("SAVEPOINT " + reserveSavepoint)
	b.Queue(`SELECT * FROM capacity_reserve_begin($1, $2, $3, $4, $5, $6)`,
		p.PoolID, p.Tenant, p.Start, p.End, p.Devices, p.TTL.Seconds())
	res := tx.SendBatch(ctx, b)
	_, err = res.Exec()
	if err == nil {
		open = true
		err = res.QueryRow().Scan(&outcome, &limit, &used, &id, &start, &end, &exp, &at, &shards)
	}
	if cerr := res.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, translate(err, "reservation of %s in pool %s", p.Tenant, p.PoolID)
	}
	switch outcome {
	case "no_quota":
		return nil, fault.New(fault.NotFound, "tenant %s has no quota in pool %s", p.Tenant, p.PoolID)
	case "quota":
		return nil, fault.New(fault.Conflict, "tenant %s's quota in pool %s is exhausted: %d of %d devices in use, %d more asked", p.Tenant, p.PoolID, *used, *limit, p.Devices)
	case "begun":
	default:
		return nil, fault.New(fault.Internal, "reservation of %s in pool %s: unexpected outcome %q", p.Tenant, p.PoolID, outcome)
	}
	r.ID, r.Start, r.End, r.ExpiresAt, r.CreatedAt = *id, *start, *end, *exp, *at

	// 2. The expiry job, scheduled for the hold's expiry in real time; the worker
	// checks compute_now() (and snoozes while the hold is not due). Inserted
	// before the devices, so that the counter rows the group's statement locks
	// last are held for as short a time as possible.
	_, err = jobs.InsertTx(ctx, tx, jobs.CapacityHoldExpiry{PoolID: p.PoolID, ReservationID: r.ID}, &river.InsertOpts{
		Queue:       jobs.ShardQueue(jobs.ShardOf(p.PoolID, int(*shards))),
		ScheduledAt: time.Now().Add(p.TTL),
	})
	if err != nil {
		return nil, pg.Translate(fmt.Errorf("error enqueueing the expiry of reservation %d: %w", r.ID, err))
	}

	// 3. devices (and node_resources, the rollup): the groups to take them from
	// (the pool, or each link that has enough free devices by this statement's
	// snapshot), first without waiting for devices others are booking, then
	// waiting in device order.
	groups := []string{""}
	if p.Linked {
		if groups, err = linkCandidates(ctx, tx, p); err != nil {
			return nil, err
		}
	}
	spread := rand.Int32()
	for pass := 0; pass < 2; pass++ {
		for _, link := range groups {
			devices, retries, err := bookGroup(ctx, tx, p, r.ID, link, pass == 1, spread)
			r.Retries += retries
			if err != nil {
				return nil, err
			}
			if devices != nil { // booked, and the savepoint released
				open = false
				r.Devices, r.LinkID = devices, link
				return r, nil
			}
		}
	}
	what := "free devices on active nodes"
	if p.Linked {
		what = "free devices in any one link"
	}
	return nil, fault.New(fault.Conflict, "pool %s has fewer than %d %s over [%s, %s)",
		p.PoolID, p.Devices, what, p.Start.Format(time.RFC3339), p.End.Format(time.RFC3339))
}

// The savepoints of ReserveTx: the reservation's, and inside it each group's.
// Named by the statements that open them (not by pgx), so that each goes in
// one round trip with the statement after it; a savepoint of the same name
// that the caller holds is only hidden until these are released.
const (
	reserveSavepoint = "capacity_reserve"
	groupSavepoint   = "capacity_reserve_group"
)

// bookGroup books p.Devices devices of one group (the whole pool when link is
// "", else the link's devices) for reservation resID, with their counters, by
// one call of capacity_book_group in a savepoint of its own, sent in one batch
// with the savepoint and the release of ReserveTx's savepoint. It returns the
// devices, or nil when the group cannot supply them all: then its savepoint is
// rolled back, with its bookings and device locks, and ReserveTx's stays open.
func bookGroup(ctx context.Context, tx pgx.Tx, p *ReserveParams, resID int64, link string, wait bool, spread int32) ([]string, int, error) {
	var (
		devices []string
		retries int
	)
	b := &pgx.Batch{}
	b.Queue("SAVEPOINT " + groupSavepoint)
	b.Queue(`SELECT o_devices, o_retries FROM capacity_book_group($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
		resID, p.PoolID, p.Tenant, p.Start, p.End, p.Devices, link, wait, spread)
	b.Queue("RELEASE SAVEPOINT " + reserveSavepoint)
	res := tx.SendBatch(ctx, b)
	_, err := res.Exec()
	if err == nil {
		err = res.QueryRow().Scan(&devices, &retries)
	}
	if err == nil {
		_, err = res.Exec()
	}
	cerr := res.Close()
	if err == nil {
		err = cerr
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "BC001" {
		// Too few: give the group's bookings and locks up.
		_, _ = fmt.Sscanf(pgErr.Detail, "retries=%d", &retries)
		if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT "+groupSavepoint+"; RELEASE SAVEPOINT "+groupSavepoint); err != nil {
			return nil, retries, translate(err, "devices of pool %s", p.PoolID)
		}
		return nil, retries, nil
	}
	if err != nil {
		return nil, retries, translate(err, "devices of pool %s", p.PoolID)
	}
	return devices, retries, nil
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
