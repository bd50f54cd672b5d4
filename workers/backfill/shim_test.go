package backfill

import "github.com/bettercompute/bettercompute/workers"

// The tests add backfills to bare registries: Add installs the backfill
// module first, as cli.App does before an application's modules.
type Backfill = workers.Backfill

func Add(r *workers.Registry, b Backfill) error {
	if err := Register(r); err != nil {
		return err
	}
	return workers.AddBackfill(r, b)
}
