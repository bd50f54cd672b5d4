package capacity

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
)

const reservationSQL = `
SELECT r.id, r.pool_id, r.tenant, lower(r.during) AS start_at, upper(r.during) AS end_at, r.state,
       r.device_count, coalesce(r.link_id, '') AS link_id,
       ARRAY(SELECT b.device_id FROM capacity_bookings b WHERE b.reservation_id = r.id ORDER BY b.device_id) AS devices,
       r.expires_at, r.version, r.extensions, r.created_at, r.confirmed_at, r.ended_at
  FROM capacity_reservations r`

// Get returns a reservation with its devices, or NOT_FOUND.
func Get(ctx context.Context, db pg.DBTX, id int64) (*Reservation, error) {
	rows, err := db.Query(ctx, reservationSQL+` WHERE r.id = $1`, id)
	if err != nil {
		return nil, translate(err, "reservation %d", id)
	}
	r, err := pgx.CollectExactlyOneRow(rows, pgx.RowToAddrOfStructByName[Reservation])
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fault.New(fault.NotFound, "reservation %d does not exist", id)
	}
	if err != nil {
		return nil, translate(err, "reservation %d", id)
	}
	return r, nil
}

// ListFreeParams are ListFree's parameters.
type ListFreeParams struct {
	PoolID     string
	Start, End time.Time // the range [Start, End)
	LinkID     string    // only the devices of this link, when set
}

// ListFree lists the devices of a pool that a reservation could take over
// [Start, End) now: on active nodes, with no live booking overlapping the range
// (a lapsed hold still counts until the expiry job releases it), by id.
func ListFree(ctx context.Context, db pg.DBTX, p *ListFreeParams) ([]Device, error) {
	if p == nil || !validID(p.PoolID) || p.Start.IsZero() || !p.End.After(p.Start) {
		return nil, fault.New(fault.InvalidArgument, "list free: a pool id and a non-empty range are required")
	}
	if err := checkText("list free", "pool id", p.PoolID, "link id", p.LinkID); err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, `
SELECT d.id, d.node_id, d.pool_id, d.kind,
       ARRAY(SELECT l.link_id FROM capacity_device_links l WHERE l.device_id = d.id ORDER BY l.link_id) AS links
  FROM capacity_devices d
 WHERE d.pool_id = $1 AND `+freeDeviceSQL(2, 3)+`
   AND ($4 = '' OR EXISTS (SELECT 1 FROM capacity_device_links l WHERE l.link_id = $4 AND l.device_id = d.id))
 ORDER BY d.id`, p.PoolID, p.Start, p.End, p.LinkID)
	if err != nil {
		return nil, translate(err, "free devices of pool %s", p.PoolID)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByName[Device])
	if err != nil {
		return nil, translate(err, "free devices of pool %s", p.PoolID)
	}
	return out, nil
}

// Capacity returns a pool's capacity rollup, or NOT_FOUND.
func Capacity(ctx context.Context, db pg.DBTX, poolID string) (*PoolCapacity, error) {
	if err := checkText("capacity", "pool id", poolID); err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, `
SELECT pool_id, sum(nodes)::int AS nodes, sum(active_nodes)::int AS active_nodes, sum(devices)::int AS devices,
       sum(active_devices)::int AS active_devices, sum(holds)::int AS holds, sum(confirmed)::int AS confirmed
  FROM capacity_pool_capacity_rollup WHERE pool_id = $1 GROUP BY pool_id`, poolID)
	if err != nil {
		return nil, translate(err, "pool %s", poolID)
	}
	c, err := pgx.CollectExactlyOneRow(rows, pgx.RowToAddrOfStructByName[PoolCapacity])
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fault.New(fault.NotFound, "pool %s does not exist", poolID)
	}
	if err != nil {
		return nil, translate(err, "pool %s", poolID)
	}
	return c, nil
}

// Resources returns the resource counts of a pool's nodes, by node id.
func Resources(ctx context.Context, db pg.DBTX, poolID string) ([]NodeResources, error) {
	if err := checkText("resources", "pool id", poolID); err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, `SELECT node_id, pool_id, devices, holds, confirmed FROM capacity_node_resources WHERE pool_id = $1 ORDER BY node_id`, poolID)
	if err != nil {
		return nil, translate(err, "nodes of pool %s", poolID)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByName[NodeResources])
	if err != nil {
		return nil, translate(err, "nodes of pool %s", poolID)
	}
	return out, nil
}

// GetQuota returns a tenant's quota in a pool, or NOT_FOUND.
func GetQuota(ctx context.Context, db pg.DBTX, tenant, poolID string) (*Quota, error) {
	if err := checkText("get quota", "tenant", tenant, "pool id", poolID); err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, `SELECT tenant, pool_id, quota_limit, used FROM capacity_quota_usage WHERE tenant = $1 AND pool_id = $2`, tenant, poolID)
	if err != nil {
		return nil, translate(err, "quota of %s in pool %s", tenant, poolID)
	}
	q, err := pgx.CollectExactlyOneRow(rows, pgx.RowToAddrOfStructByName[Quota])
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fault.New(fault.NotFound, "tenant %s has no quota in pool %s", tenant, poolID)
	}
	if err != nil {
		return nil, translate(err, "quota of %s in pool %s", tenant, poolID)
	}
	return q, nil
}
