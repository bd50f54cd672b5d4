package capacity_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/capacity"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

// TestTextPostgreSQLRefusesIsRefusedFirst: a pool, node, device, link or
// tenant id (or a device's kind) that is not valid UTF-8 or holds a NUL byte
// is INVALID_ARGUMENT before any statement is sent, and the caller's
// transaction goes on and commits. Sent, each failed with INTERNAL_ERROR (and
// the functions that take the caller's transaction without a savepoint of
// their own aborted it).
func TestTextPostgreSQLRefusesIsRefusedFirst(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	makePool(t, db, poolSpec{ID: "p", Nodes: 1, PerNode: 2, Tenants: map[string]int{"acme": 2}})
	start := time.Now().Add(time.Hour)
	reserve := func(pool, tenant string) func(ctx context.Context, tx pgx.Tx) error {
		return func(ctx context.Context, tx pgx.Tx) error {
			_, err := capacity.ReserveTx(ctx, tx, &capacity.ReserveParams{PoolID: pool, Tenant: tenant, Devices: 1,
				Start: start, End: start.Add(time.Hour), TTL: time.Minute})
			return err
		}
	}
	for name, call := range map[string]func(ctx context.Context, tx pgx.Tx) error{
		"reserve, NUL tenant":           reserve("p", "acme\x00"),
		"reserve, invalid UTF-8 tenant": reserve("p", "acm\xe9"),
		"reserve, NUL pool":             reserve("p\x00", "acme"),
		"create pool, NUL id": func(ctx context.Context, tx pgx.Tx) error {
			return capacity.CreatePool(ctx, tx, &capacity.CreatePoolParams{PoolID: "q\x00"})
		},
		"add node, invalid UTF-8 id": func(ctx context.Context, tx pgx.Tx) error {
			return capacity.AddNode(ctx, tx, &capacity.AddNodeParams{PoolID: "p", NodeID: "n\xff"})
		},
		"add device, NUL id": func(ctx context.Context, tx pgx.Tx) error {
			return capacity.AddDeviceTx(ctx, tx, &capacity.AddDeviceParams{NodeID: nodeName("p", 0), DeviceID: "d\x00", Kind: "gpu"})
		},
		"add device, NUL kind": func(ctx context.Context, tx pgx.Tx) error {
			return capacity.AddDeviceTx(ctx, tx, &capacity.AddDeviceParams{NodeID: nodeName("p", 0), DeviceID: "d9", Kind: "gpu\x00"})
		},
		"link devices, NUL device": func(ctx context.Context, tx pgx.Tx) error {
			return capacity.LinkDevices(ctx, tx, &capacity.LinkDevicesParams{PoolID: "p", LinkID: "l",
				DeviceIDs: []string{deviceName("p", 0, 0), deviceName("p", 0, 1) + "\x00"}})
		},
		"set quota, NUL tenant": func(ctx context.Context, tx pgx.Tx) error {
			return capacity.SetQuota(ctx, tx, &capacity.SetQuotaParams{Tenant: "t\x00", PoolID: "p", Limit: 1})
		},
		"set node state, NUL node": func(ctx context.Context, tx pgx.Tx) error {
			return capacity.SetNodeStateTx(ctx, tx, &capacity.SetNodeStateParams{NodeID: "n\x00", State: capacity.NodeDown})
		},
		"list free, NUL link": func(ctx context.Context, tx pgx.Tx) error {
			_, err := capacity.ListFree(ctx, tx, &capacity.ListFreeParams{PoolID: "p", Start: start, End: start.Add(time.Hour), LinkID: "l\x00"})
			return err
		},
		"capacity, NUL pool": func(ctx context.Context, tx pgx.Tx) error {
			_, err := capacity.Capacity(ctx, tx, "p\x00")
			return err
		},
		"resources, NUL pool": func(ctx context.Context, tx pgx.Tx) error {
			_, err := capacity.Resources(ctx, tx, "p\x00")
			return err
		},
		"get quota, NUL tenant": func(ctx context.Context, tx pgx.Tx) error {
			_, err := capacity.GetQuota(ctx, tx, "acme\x00", "p")
			return err
		},
		"expire, NUL pool": func(ctx context.Context, tx pgx.Tx) error {
			_, err := capacity.ExpireHoldsTx(ctx, tx, &capacity.ExpireParams{PoolID: "p\x00"})
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			err := db.RequireRefusal(t, fault.InvalidArgument, call)
			require.NotContains(t, err.Error(), "\x00", "the bad bytes are quoted, not echoed")
		})
	}
	require.Equal(t, 0, db.MustCount(t, `SELECT count(*) FROM capacity_reservations`))
	require.Equal(t, 2, db.MustCount(t, `SELECT count(*) FROM capacity_devices`))
}
