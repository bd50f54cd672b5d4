package riverjob

import (
	"context"
	"fmt"

	"github.com/bettercompute/bettercompute/platform/pg"
)

// RecordFencedKinds records kinds as fenced (see jobs.InsertTx): from then on the
// database refuses a job of any of them in a queue other than a shard queue.
// migrate and every worker start record their registry's kinds; a kind stays
// recorded.
func RecordFencedKinds(ctx context.Context, db pg.DBTX, kinds []string) error {
	if len(kinds) == 0 {
		return nil
	}
	_, err := db.Exec(ctx, `INSERT INTO compute_fenced_kinds (kind) SELECT unnest($1::text[]) ON CONFLICT (kind) DO NOTHING`, kinds)
	if err != nil {
		return pg.Translate(fmt.Errorf("error recording the fenced job kinds: %w", err))
	}
	return nil
}
