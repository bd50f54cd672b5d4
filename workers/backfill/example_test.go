package backfill_test

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/cmd/better-compute/cli"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/backfill"
)

// An application registers its backfill in its module's Register function;
// operators then run it with better-compute backfill start NAME.
func ExampleAdd() {
	normalizeNames := backfill.Backfill{
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
			return backfill.Add(r, normalizeNames)
		},
	}
	_ = module // cli.Main(cli.App{Modules: []cli.Module{module}})
}
