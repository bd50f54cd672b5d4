package capacity

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
)

// CreatePoolParams are CreatePool's parameters.
type CreatePoolParams struct {
	PoolID string
}

// CreatePool creates a pool and its (empty) capacity rollup, in one statement.
// It returns CONFLICT when the pool exists.
func CreatePool(ctx context.Context, db pg.DBTX, p *CreatePoolParams) error {
	if p == nil || !validID(p.PoolID) {
		return fault.New(fault.InvalidArgument, "a pool needs an id of 1 to 200 bytes")
	}
	if err := checkText("create pool", "pool id", p.PoolID); err != nil {
		return err
	}
	_, err := db.Exec(ctx, `
WITH p AS (INSERT INTO capacity_pools (id) VALUES ($1) RETURNING id)
INSERT INTO capacity_pool_capacity_rollup (pool_id, stripe) SELECT id, s FROM p, generate_series(0, 7) AS s`, p.PoolID)
	return translate(err, "pool %s", p.PoolID)
}

// AddNodeParams are AddNode's parameters.
type AddNodeParams struct {
	PoolID string
	NodeID string
	State  NodeState // default active
}

// AddNode adds a node to a pool, with its resource row, and counts it in the
// pool's rollup, in one statement. It returns NOT_FOUND for an unknown pool and
// CONFLICT when the node exists.
func AddNode(ctx context.Context, db pg.DBTX, p *AddNodeParams) error {
	if p == nil || !validID(p.PoolID) || !validID(p.NodeID) {
		return fault.New(fault.InvalidArgument, "a node needs a pool id and a node id of 1 to 200 bytes")
	}
	if err := checkText("add node", "pool id", p.PoolID, "node id", p.NodeID); err != nil {
		return err
	}
	state := p.State
	if state == "" {
		state = NodeActive
	}
	if !validNodeState(state) {
		return fault.New(fault.InvalidArgument, "node state %q: want active, draining or down", state)
	}
	// Lock order: the node and its resources are new rows; the rollup comes last.
	tag, err := db.Exec(ctx, `
WITH n AS (
    INSERT INTO capacity_nodes (id, pool_id, state) VALUES ($1, $2, $3) RETURNING id, pool_id, state
), r AS (
    INSERT INTO capacity_node_resources (node_id, pool_id) SELECT id, pool_id FROM n
)
UPDATE capacity_pool_capacity_rollup c
   SET nodes = nodes + 1, active_nodes = active_nodes + (n.state = 'active')::int, updated_at = compute_now()
  FROM n WHERE c.pool_id = n.pool_id AND c.stripe = capacity_stripe(n.id)`, p.NodeID, p.PoolID, string(state))
	if err != nil {
		return translate(err, "node %s of pool %s", p.NodeID, p.PoolID)
	}
	if tag.RowsAffected() != 1 {
		return fault.New(fault.Internal, "pool %s has no capacity rollup row", p.PoolID)
	}
	return nil
}

// AddDeviceParams are AddDeviceTx's parameters.
type AddDeviceParams struct {
	NodeID   string
	DeviceID string
	Kind     string // free-form, such as "h100"
}

// AddDeviceTx adds a device to a node and counts it in the node's resources and
// the pool's rollup. It locks the node FOR SHARE first, so the node's state
// cannot change under it (lock order: nodes → devices → node_resources →
// pool_capacity_rollup). It returns NOT_FOUND for an unknown node and CONFLICT
// when the device exists.
func AddDeviceTx(ctx context.Context, tx pgx.Tx, p *AddDeviceParams) error {
	if p == nil || !validID(p.NodeID) || !validID(p.DeviceID) {
		return fault.New(fault.InvalidArgument, "a device needs a node id and a device id of 1 to 200 bytes")
	}
	if err := checkText("add device", "node id", p.NodeID, "device id", p.DeviceID, "kind", p.Kind); err != nil {
		return err
	}
	return pg.InTx(ctx, tx, func(ctx context.Context, tx pgx.Tx) error {
		var pool string
		var state NodeState
		err := tx.QueryRow(ctx, `SELECT pool_id, state FROM capacity_nodes WHERE id = $1 FOR SHARE`, p.NodeID).Scan(&pool, &state)
		if errors.Is(err, pgx.ErrNoRows) {
			return fault.New(fault.NotFound, "node %s does not exist", p.NodeID)
		}
		if err != nil {
			return translate(err, "node %s", p.NodeID)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO capacity_devices (id, node_id, pool_id, kind, node_active) VALUES ($1, $2, $3, $4, $5)`,
			p.DeviceID, p.NodeID, pool, p.Kind, state == NodeActive); err != nil {
			return translate(err, "device %s", p.DeviceID)
		}
		active := 0
		if state == NodeActive {
			active = 1
		}
		b := &pgx.Batch{}
		b.Queue(`UPDATE capacity_node_resources SET devices = devices + 1, updated_at = compute_now() WHERE node_id = $1`, p.NodeID)
		b.Queue(`UPDATE capacity_pool_capacity_rollup SET devices = devices + 1, active_devices = active_devices + $2, updated_at = compute_now()
WHERE pool_id = $1 AND stripe = capacity_stripe($3)`, pool, active, p.NodeID)
		return execBatch(ctx, tx, b, "counting device "+p.DeviceID)
	})
}

// LinkDevicesParams are LinkDevices' parameters.
type LinkDevicesParams struct {
	PoolID    string
	LinkID    string
	DeviceIDs []string // two or more devices of the pool
}

// LinkDevices records that the devices can be booked together (ReserveParams.Linked
// takes all of a reservation's devices from one link), in one statement. It
// returns NOT_FOUND when a device is not in the pool and CONFLICT when the link
// exists.
func LinkDevices(ctx context.Context, db pg.DBTX, p *LinkDevicesParams) error {
	if p == nil || !validID(p.PoolID) || !validID(p.LinkID) {
		return fault.New(fault.InvalidArgument, "a link needs a pool id and a link id of 1 to 200 bytes")
	}
	if err := checkText("link devices", "pool id", p.PoolID, "link id", p.LinkID); err != nil {
		return err
	}
	for _, d := range p.DeviceIDs {
		if err := checkText("link devices", "device id", d); err != nil {
			return err
		}
	}
	devs := slices.Clone(p.DeviceIDs)
	slices.Sort(devs)
	if len(slices.Compact(devs)) < 2 {
		return fault.New(fault.InvalidArgument, "link %s needs two or more distinct devices", p.LinkID)
	}
	_, err := db.Exec(ctx, `
WITH l AS (INSERT INTO capacity_links (id, pool_id) VALUES ($1, $2) RETURNING id, pool_id)
INSERT INTO capacity_device_links (link_id, device_id, pool_id)
SELECT l.id, d, l.pool_id FROM l, unnest($3::text[]) AS d`, p.LinkID, p.PoolID, devs)
	return translate(err, "link %s of pool %s", p.LinkID, p.PoolID)
}

// SetQuotaParams are SetQuota's parameters.
type SetQuotaParams struct {
	Tenant string
	PoolID string
	Limit  int // the most devices the tenant may hold (hold or confirmed) in the pool at once
}

// SetQuota sets a tenant's quota in a pool, creating it at zero usage. It returns
// CONFLICT when the tenant already uses more than Limit (its usage never exceeds
// its limit) and NOT_FOUND for an unknown pool.
func SetQuota(ctx context.Context, db pg.DBTX, p *SetQuotaParams) error {
	if p == nil || !validID(p.Tenant) || !validID(p.PoolID) || p.Limit < 0 {
		return fault.New(fault.InvalidArgument, "a quota needs a tenant, a pool and a limit >= 0")
	}
	if err := checkText("set quota", "tenant", p.Tenant, "pool id", p.PoolID); err != nil {
		return err
	}
	_, err := db.Exec(ctx, `
INSERT INTO capacity_quota_usage AS q (tenant, pool_id, quota_limit) VALUES ($1, $2, $3)
ON CONFLICT (tenant, pool_id) DO UPDATE SET quota_limit = EXCLUDED.quota_limit, updated_at = compute_now()`,
		p.Tenant, p.PoolID, p.Limit)
	if pg.SQLState(err) == "23514" {
		return fault.Wrap(fault.Conflict, err, "tenant %s uses more than %d devices of pool %s", p.Tenant, p.Limit, p.PoolID)
	}
	return translate(err, "quota of %s in pool %s", p.Tenant, p.PoolID)
}

// SetNodeStateParams are SetNodeStateTx's parameters.
type SetNodeStateParams struct {
	NodeID string
	State  NodeState
}

// SetNodeStateTx moves a node to a state. A node that is not active takes no new
// bookings; its existing bookings stay (the application releases them if it
// wants). It locks the node, then its devices (in id order), and marks the
// devices bookable or not: a reservation booking one of them finishes first, and
// a later one, locking the updated device, sees the new state (lock order:
// nodes → devices → node_resources → pool_capacity_rollup). It returns NOT_FOUND
// for an unknown node.
func SetNodeStateTx(ctx context.Context, tx pgx.Tx, p *SetNodeStateParams) error {
	if p == nil || !validID(p.NodeID) || !validNodeState(p.State) {
		return fault.New(fault.InvalidArgument, "a node state change needs a node id and a state of active, draining or down")
	}
	if err := checkText("set node state", "node id", p.NodeID); err != nil {
		return err
	}
	return pg.InTx(ctx, tx, func(ctx context.Context, tx pgx.Tx) error {
		var pool string
		var old NodeState
		err := tx.QueryRow(ctx, `SELECT pool_id, state FROM capacity_nodes WHERE id = $1 FOR NO KEY UPDATE`, p.NodeID).Scan(&pool, &old)
		if errors.Is(err, pgx.ErrNoRows) {
			return fault.New(fault.NotFound, "node %s does not exist", p.NodeID)
		}
		if err != nil {
			return translate(err, "node %s", p.NodeID)
		}
		if old == p.State {
			return nil
		}
		if _, err := tx.Exec(ctx, `UPDATE capacity_nodes SET state = $2, updated_at = compute_now() WHERE id = $1`, p.NodeID, string(p.State)); err != nil {
			return translate(err, "node %s", p.NodeID)
		}
		// The devices, locked in id order, then updated: a reservation that
		// locks one of them after this commits re-checks node_active.
		if _, err := tx.Exec(ctx, `
WITH l AS (SELECT id FROM capacity_devices WHERE node_id = $1 ORDER BY id FOR NO KEY UPDATE)
UPDATE capacity_devices d SET node_active = $2 FROM l WHERE d.id = l.id`, p.NodeID, p.State == NodeActive); err != nil {
			return translate(err, "devices of node %s", p.NodeID)
		}
		var devices int
		if err := tx.QueryRow(ctx, `UPDATE capacity_node_resources SET updated_at = compute_now() WHERE node_id = $1 RETURNING devices`, p.NodeID).Scan(&devices); err != nil {
			return translate(err, "resources of node %s", p.NodeID)
		}
		sign := 0
		switch {
		case old == NodeActive:
			sign = -1
		case p.State == NodeActive:
			sign = 1
		}
		if sign == 0 {
			return nil // draining <-> down: neither is bookable
		}
		_, err = tx.Exec(ctx, `UPDATE capacity_pool_capacity_rollup SET active_nodes = active_nodes + $2, active_devices = active_devices + $3, updated_at = compute_now()
WHERE pool_id = $1 AND stripe = capacity_stripe($4)`, pool, sign, sign*devices, p.NodeID)
		return translate(err, "rollup of pool %s", pool)
	})
}

func validID(s string) bool { return s != "" && len(s) <= 200 }

// checkText checks, for operation op, each pair of a field's name and its
// value with fault.CheckText: an id that is not valid UTF-8 or holds a NUL byte
// is INVALID_ARGUMENT before any statement is sent (the statement would fail,
// and abort the caller's transaction).
func checkText(op string, fields ...string) error {
	for i := 0; i+1 < len(fields); i += 2 {
		if err := fault.CheckText(op+": "+fields[i], fields[i+1]); err != nil {
			return err
		}
	}
	return nil
}

func validNodeState(s NodeState) bool {
	return s == NodeActive || s == NodeDraining || s == NodeDown
}

// translate gives a statement's error its code, naming what it was about: a
// missing referenced row is NOT_FOUND, a duplicate or an exclusion violation is
// CONFLICT (pg.Translate does the rest).
func translate(err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	what := fmt.Sprintf(format, args...)
	switch pg.SQLState(err) {
	case "23503":
		return fault.Wrap(fault.NotFound, err, "%s refers to something that does not exist", what)
	case "23505":
		return fault.Wrap(fault.Conflict, err, "%s already exists", what)
	}
	return pg.Translate(fmt.Errorf("error writing %s: %w", what, err))
}

// execBatch sends b and checks that each statement succeeded and changed
// exactly one row (each is an UPDATE of a counter row that must exist).
func execBatch(ctx context.Context, tx pgx.Tx, b *pgx.Batch, what string) error {
	res := tx.SendBatch(ctx, b)
	var first error
	for i := 0; i < b.Len(); i++ {
		tag, err := res.Exec()
		if err != nil && first == nil {
			first = pg.Translate(fmt.Errorf("error %s: %w", what, err))
		}
		if err == nil && tag.RowsAffected() != 1 && first == nil {
			first = fault.New(fault.Internal, "%s: statement %d changed %d rows, want 1 (a counter row is missing)", what, i+1, tag.RowsAffected())
		}
	}
	if err := res.Close(); err != nil && first == nil {
		first = pg.Translate(fmt.Errorf("error %s: %w", what, err))
	}
	return first
}
