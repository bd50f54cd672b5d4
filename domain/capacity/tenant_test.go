package capacity_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/capacity"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

// TestASuspendedTenantsReservationsAreRefusedItsBookingsStay: a tenant
// suspended (the tenancy module) reserves nothing and keeps its booking;
// resumed, it reserves again.
func TestASuspendedTenantsReservationsAreRefusedItsBookingsStay(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	makePool(t, db, poolSpec{ID: "p", Nodes: 2, PerNode: 2, Tenants: map[string]int{"acme": 4}})
	start, end := hours(1, 3)
	r, err := reserve(t, db.Pool, capacity.ReserveParams{PoolID: "p", Tenant: "acme", Devices: 1, Start: start, End: end, TTL: time.Minute})
	require.NoError(t, err)

	db.MustExec(t, `SELECT compute_tenant_use('acme')`)
	db.MustExec(t, `UPDATE compute_tenants SET state = 'suspended' WHERE name = 'acme'`)
	_, err = reserve(t, db.Pool, capacity.ReserveParams{PoolID: "p", Tenant: "acme", Devices: 1, Start: start, End: end, TTL: time.Minute})
	require.True(t, fault.Has(err, fault.Conflict), "suspended: %v", err)
	require.ErrorContains(t, err, "suspended")
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM capacity_reservations WHERE tenant = 'acme'`), "the booking stays, nothing was added")
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM capacity_reservations WHERE id = $1`, r.ID))

	db.MustExec(t, `UPDATE compute_tenants SET state = 'active' WHERE name = 'acme'`)
	_, err = reserve(t, db.Pool, capacity.ReserveParams{PoolID: "p", Tenant: "acme", Devices: 1, Start: start, End: end, TTL: time.Minute})
	require.NoError(t, err)
	checkInvariants(t, db, "after resume")
}
