package capacity_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/domain/capacity"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
)

// A hold on two linked devices for four hours, confirmed once the tenant has
// paid, in the application's own transactions.
func ExampleReserveTx() {
	ctx := context.Background()
	var db *pg.Pool // the application's pool
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
	}
	err = pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		_, err := capacity.ConfirmTx(ctx, tx, &capacity.ConfirmParams{ReservationID: r.ID})
		return err // CONFLICT if the hold lapsed meanwhile
	})
	fmt.Println(r.Devices, err)
}

// Extending a hold names the version read: a concurrent extension makes this
// one CONFLICT instead of overwriting it.
func ExampleExtendTx() {
	ctx := context.Background()
	var db *pg.Pool
	var id int64
	err := pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		r, err := capacity.Get(ctx, tx, id)
		if err != nil {
			return err
		}
		_, err = capacity.ExtendTx(ctx, tx, &capacity.ExtendParams{ReservationID: id, Version: r.Version, By: 5 * time.Minute})
		return err
	})
	fmt.Println(err)
}
