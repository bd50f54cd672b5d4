package capacity_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/capacity"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// t0 is the sim clock's start in every test that uses it.
var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// poolSpec describes a test pool: nodes n0..n(Nodes-1) with PerNode devices
// each, named <pool>-n<i>-d<j>, and tenants with their quota.
type poolSpec struct {
	ID      string
	Nodes   int
	PerNode int
	Tenants map[string]int
	// Links groups devices by index (node*PerNode+device) into named links.
	Links map[string][]int
}

func deviceName(pool string, node, dev int) string {
	return fmt.Sprintf("%s-n%d-d%02d", pool, node, dev)
}
func nodeName(pool string, node int) string { return fmt.Sprintf("%s-n%d", pool, node) }

// makePool creates the pool of spec through the domain functions.
func makePool(t testing.TB, db *pgtest.DB, spec poolSpec) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, capacity.CreatePool(ctx, db.Pool, &capacity.CreatePoolParams{PoolID: spec.ID}))
	var devs []string
	for n := 0; n < spec.Nodes; n++ {
		require.NoError(t, capacity.AddNode(ctx, db.Pool, &capacity.AddNodeParams{PoolID: spec.ID, NodeID: nodeName(spec.ID, n)}))
		require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
			for d := 0; d < spec.PerNode; d++ {
				devs = append(devs, deviceName(spec.ID, n, d))
				if err := capacity.AddDeviceTx(ctx, tx, &capacity.AddDeviceParams{NodeID: nodeName(spec.ID, n), DeviceID: deviceName(spec.ID, n, d), Kind: "gpu"}); err != nil {
					return err
				}
			}
			return nil
		}))
	}
	for name, idx := range spec.Links {
		var ids []string
		for _, i := range idx {
			ids = append(ids, devs[i])
		}
		require.NoError(t, capacity.LinkDevices(ctx, db.Pool, &capacity.LinkDevicesParams{PoolID: spec.ID, LinkID: name, DeviceIDs: ids}))
	}
	for tenant, limit := range spec.Tenants {
		require.NoError(t, capacity.SetQuota(ctx, db.Pool, &capacity.SetQuotaParams{Tenant: tenant, PoolID: spec.ID, Limit: limit}))
	}
}

// inTx runs fn in a transaction of its own and returns its result.
func inTx[T any](t testing.TB, db pg.DBTX, fn func(tx pgx.Tx) (T, error)) (T, error) {
	t.Helper()
	var out T
	err := pg.InTx(context.Background(), db, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		out, err = fn(tx)
		return err
	})
	return out, err
}

func reserve(t testing.TB, db pg.DBTX, p capacity.ReserveParams) (*capacity.Reservation, error) {
	t.Helper()
	return inTx(t, db, func(tx pgx.Tx) (*capacity.Reservation, error) {
		return capacity.ReserveTx(context.Background(), tx, &p)
	})
}

// hours is the range [t0+from h, t0+to h).
func hours(from, to int) (time.Time, time.Time) {
	return t0.Add(time.Duration(from) * time.Hour), t0.Add(time.Duration(to) * time.Hour)
}

// invariantQueries are the capacity invariants as queries that count
// violations, written against the tables (never through the domain code).
var invariantQueries = map[string]string{
	"overlapping live bookings of one device": `
SELECT count(*) FROM capacity_bookings a JOIN capacity_bookings b
  ON a.device_id = b.device_id AND a.id < b.id AND a.during && b.during
 WHERE a.state IN ('hold', 'confirmed') AND b.state IN ('hold', 'confirmed')`,
	"node resources that differ from a recount": `
SELECT count(*) FROM capacity_node_resources r
 WHERE r.devices <> (SELECT count(*) FROM capacity_devices d WHERE d.node_id = r.node_id)
    OR r.holds <> (SELECT count(*) FROM capacity_bookings b WHERE b.node_id = r.node_id AND b.state = 'hold')
    OR r.confirmed <> (SELECT count(*) FROM capacity_bookings b WHERE b.node_id = r.node_id AND b.state = 'confirmed')`,
	"devices whose node_active disagrees with their node": `
SELECT count(*) FROM capacity_devices d JOIN capacity_nodes n ON n.id = d.node_id WHERE d.node_active <> (n.state = 'active')`,
	"nodes without a resources row": `
SELECT count(*) FROM capacity_nodes n WHERE NOT EXISTS (SELECT 1 FROM capacity_node_resources r WHERE r.node_id = n.id)`,
	"pool rollups that differ from a recount": `
SELECT count(*) FROM (
    SELECT pool_id, sum(nodes) AS nodes, sum(active_nodes) AS active_nodes, sum(devices) AS devices,
           sum(active_devices) AS active_devices, sum(holds) AS holds, sum(confirmed) AS confirmed
      FROM capacity_pool_capacity_rollup GROUP BY pool_id) c
 WHERE c.nodes <> (SELECT count(*) FROM capacity_nodes n WHERE n.pool_id = c.pool_id)
    OR c.active_nodes <> (SELECT count(*) FROM capacity_nodes n WHERE n.pool_id = c.pool_id AND n.state = 'active')
    OR c.devices <> (SELECT count(*) FROM capacity_devices d WHERE d.pool_id = c.pool_id)
    OR c.active_devices <> (SELECT count(*) FROM capacity_devices d JOIN capacity_nodes n ON n.id = d.node_id
                             WHERE d.pool_id = c.pool_id AND n.state = 'active')
    OR c.holds <> (SELECT count(*) FROM capacity_bookings b WHERE b.pool_id = c.pool_id AND b.state = 'hold')
    OR c.confirmed <> (SELECT count(*) FROM capacity_bookings b WHERE b.pool_id = c.pool_id AND b.state = 'confirmed')`,
	"rollup stripes that differ from a recount of their nodes": `
SELECT count(*) FROM capacity_pool_capacity_rollup c
 WHERE c.nodes <> (SELECT count(*) FROM capacity_nodes n WHERE n.pool_id = c.pool_id AND capacity_stripe(n.id) = c.stripe)
    OR c.active_devices <> (SELECT count(*) FROM capacity_devices d JOIN capacity_nodes n ON n.id = d.node_id
                             WHERE d.pool_id = c.pool_id AND n.state = 'active' AND capacity_stripe(n.id) = c.stripe)
    OR c.holds <> (SELECT count(*) FROM capacity_bookings b WHERE b.pool_id = c.pool_id AND b.state = 'hold' AND capacity_stripe(b.node_id) = c.stripe)
    OR c.confirmed <> (SELECT count(*) FROM capacity_bookings b WHERE b.pool_id = c.pool_id AND b.state = 'confirmed' AND capacity_stripe(b.node_id) = c.stripe)`,
	"devices whose spread does not give their node's stripe": `
SELECT count(*) FROM capacity_devices WHERE spread % 8 <> capacity_stripe(node_id)`,
	"pools without their 8 rollup stripes": `
SELECT count(*) FROM capacity_pools p WHERE (SELECT count(*) FROM capacity_pool_capacity_rollup c WHERE c.pool_id = p.id) <> 8`,
	"quota usage that differs from a recount": `
SELECT count(*) FROM capacity_quota_usage q
 WHERE q.used <> (SELECT count(*) FROM capacity_bookings b
                   WHERE b.tenant = q.tenant AND b.pool_id = q.pool_id AND b.state IN ('hold', 'confirmed'))`,
	"quota usage over its limit (by recount)": `
SELECT count(*) FROM capacity_quota_usage q
 WHERE q.quota_limit < (SELECT count(*) FROM capacity_bookings b
                         WHERE b.tenant = q.tenant AND b.pool_id = q.pool_id AND b.state IN ('hold', 'confirmed'))`,
	"reservations whose bookings disagree with them": `
SELECT count(*) FROM capacity_reservations r
 WHERE r.device_count <> (SELECT count(*) FROM capacity_bookings b WHERE b.reservation_id = r.id)
    OR EXISTS (SELECT 1 FROM capacity_bookings b WHERE b.reservation_id = r.id AND (b.state <> r.state OR b.during <> r.during))`,
}

// checkInvariants fails the test for every violated invariant.
func checkInvariants(t testing.TB, db *pgtest.DB, when string) {
	t.Helper()
	for name, q := range invariantQueries {
		if n := db.MustCount(t, q); n != 0 {
			t.Errorf("%s: %d %s", when, n, name)
		}
	}
}
