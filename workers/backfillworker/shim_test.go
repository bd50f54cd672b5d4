package backfillworker

import (
	"context"

	"github.com/bettercompute/bettercompute/domain/backfill"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/workers"
)

// The tests add backfills to bare registries: Add installs the backfill
// module first, as cli.App does before an application's modules.
type Backfill = workers.Backfill

func Add(r *workers.Registry, b Backfill) error {
	if err := Register(r); err != nil {
		return err
	}
	return workers.AddBackfill(r, b)
}

// startBackfill starts b as the CLI's backfill start does.
func startBackfill(ctx context.Context, db pg.DBTX, b Backfill) (*backfill.Progress, error) {
	return backfill.Start(ctx, db, b.Name, b.Estimate)
}
