package backfillworker_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/cmd/better-compute/cli"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
)

// An application registers its backfill in its module's Register function;
// operators then run it with better-compute backfill start NAME.
func Example() {
	normalizeNames := workers.Backfill{
		Name:      "inventory_normalized_name",
		BatchSize: 1000,
		// One batch: at most n unfinished rows, in the batch's transaction.
		Batch: func(ctx context.Context, tx pgx.Tx, n int) (int, error) {
			tag, err := tx.Exec(ctx, `
UPDATE inventory_items SET normalized_name = lower(name)
WHERE id = ANY (ARRAY(
        SELECT id FROM inventory_items WHERE normalized_name IS NULL
        ORDER BY id LIMIT $1 FOR UPDATE))
  AND normalized_name IS NULL`, n)
			return int(tag.RowsAffected()), err
		},
		// Optional: the rows left, for the progress bar and the ETA.
		Estimate: func(ctx context.Context, db pg.DBTX) (int64, error) {
			var n int64
			err := db.QueryRow(ctx, `SELECT count(*) FROM inventory_items WHERE normalized_name IS NULL`).Scan(&n)
			return n, err
		},
	}
	module := cli.Module{
		Name: "inventory",
		Register: func(r *workers.Registry) error {
			return workers.AddBackfill(r, normalizeNames)
		},
	}
	_ = module // cli.Main(cli.App{Modules: []cli.Module{module}})

	// What a worker does with it: batches, each in a transaction of its own,
	// until one handles no row. Here on three unnormalized rows, two per batch.
	ctx := context.Background()
	db := exampleItems("Widget", "GADGET", "Gizmo")
	for {
		var n int
		err := pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
			var err error
			n, err = normalizeNames.Batch(ctx, tx, 2)
			return err
		})
		if err != nil {
			panic(err)
		}
		left, err := normalizeNames.Estimate(ctx, db)
		if err != nil {
			panic(err)
		}
		fmt.Printf("batch of %d, %d left\n", n, left)
		if n == 0 {
			break
		}
	}
	// Output:
	// batch of 2, 1 left
	// batch of 1, 0 left
	// batch of 0, 0 left
}

// exampleItems returns a test database with table inventory_items holding names.
func exampleItems(names ...string) *pg.Pool {
	db := pgtest.ForExample().Pool
	ctx := context.Background()
	if _, err := db.Exec(ctx, `CREATE TABLE inventory_items (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, name text NOT NULL, normalized_name text)`); err != nil {
		panic(err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO inventory_items (name) SELECT unnest($1::text[])`, names); err != nil {
		panic(err)
	}
	return db
}
