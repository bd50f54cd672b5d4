package capacity_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/domain/capacity"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

// A hold on two linked devices for four hours, confirmed once the tenant has
// paid, in the application's own transactions.
func ExampleReserveTx() {
	ctx := context.Background()
	db := examplePool() // the application's pool; pool gpu-eu has two linked GPUs
	start := time.Now().Add(time.Hour).Truncate(time.Hour)

	var r *capacity.Reservation
	err := pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		r, err = capacity.ReserveTx(ctx, tx, &capacity.ReserveParams{
			PoolID: "gpu-eu", Tenant: "acme", Devices: 2, Linked: true,
			Start: start, End: start.Add(4 * time.Hour), TTL: 10 * time.Minute,
		})
		return err
	})
	if fault.Has(err, fault.Conflict) {
		fmt.Println("no room:", err) // quota exhausted, or too few free devices
		return
	} else if err != nil {
		panic(err)
	}
	fmt.Println(r.State, r.Devices)
	err = pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		r, err = capacity.ConfirmTx(ctx, tx, &capacity.ConfirmParams{ReservationID: r.ID})
		return err // CONFLICT if the hold lapsed meanwhile
	})
	fmt.Println(r.State, err)
	// Output:
	// hold [gpu-eu-a gpu-eu-b]
	// confirmed <nil>
}

// Extending a hold names the version read: a concurrent extension makes this
// one CONFLICT instead of overwriting it.
func ExampleExtendTx() {
	ctx := context.Background()
	db := examplePool()
	id := exampleHold(db) // a hold, as ExampleReserveTx makes

	r, err := capacity.Get(ctx, db, id)
	if err != nil {
		panic(err)
	}
	extend := func() error {
		return pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
			_, err := capacity.ExtendTx(ctx, tx, &capacity.ExtendParams{ReservationID: id, Version: r.Version, By: 5 * time.Minute})
			return err
		})
	}
	fmt.Println(extend())
	fmt.Println(fault.Has(extend(), fault.Conflict)) // the version read is no longer the hold's
	// Output:
	// <nil>
	// true
}

// examplePool returns a test database with pool gpu-eu: one node with GPUs
// gpu-eu-a and gpu-eu-b, linked, and gpu-eu-c, and a quota of 2 for acme.
func examplePool() *pg.Pool {
	ctx := context.Background()
	db := pgtest.ForExample().Pool
	must := func(err error) {
		if err != nil {
			panic(err)
		}
	}
	must(capacity.CreatePool(ctx, db, &capacity.CreatePoolParams{PoolID: "gpu-eu"}))
	must(capacity.AddNode(ctx, db, &capacity.AddNodeParams{PoolID: "gpu-eu", NodeID: "gpu-eu-n0"}))
	must(pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		for _, d := range []string{"gpu-eu-a", "gpu-eu-b", "gpu-eu-c"} {
			if err := capacity.AddDeviceTx(ctx, tx, &capacity.AddDeviceParams{NodeID: "gpu-eu-n0", DeviceID: d, Kind: "gpu"}); err != nil {
				return err
			}
		}
		return nil
	}))
	must(capacity.LinkDevices(ctx, db, &capacity.LinkDevicesParams{PoolID: "gpu-eu", LinkID: "nvlink-0", DeviceIDs: []string{"gpu-eu-a", "gpu-eu-b"}}))
	must(capacity.SetQuota(ctx, db, &capacity.SetQuotaParams{Tenant: "acme", PoolID: "gpu-eu", Limit: 2}))
	return db
}

// exampleHold holds one device of gpu-eu for acme and returns the hold's id.
func exampleHold(db *pg.Pool) int64 {
	start := time.Now().Add(time.Hour).Truncate(time.Hour)
	var id int64
	err := pg.InTx(context.Background(), db, func(ctx context.Context, tx pgx.Tx) error {
		r, err := capacity.ReserveTx(ctx, tx, &capacity.ReserveParams{
			PoolID: "gpu-eu", Tenant: "acme", Devices: 1, Start: start, End: start.Add(time.Hour), TTL: 10 * time.Minute,
		})
		if err == nil {
			id = r.ID
		}
		return err
	})
	if err != nil {
		panic(err)
	}
	return id
}
