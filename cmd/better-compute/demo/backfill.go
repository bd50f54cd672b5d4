package demo

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/bettercompute/bettercompute/cmd/better-compute/cli"
	"github.com/bettercompute/bettercompute/domain/backfill"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/workers"
)

// DemoBackfill is the name of dev's demo backfill: its jobs show in River UI
// under the kind backfill_demo_greetings.
const DemoBackfill = "demo_greetings"

// demoGreetings fills in demo_backfill_people.greeting, 200 rows a batch with
// half a second between batches, so that it runs for about a minute.
func demoGreetings() workers.Backfill {
	return workers.Backfill{
		Name:      DemoBackfill,
		BatchSize: 200,
		Pause:     500 * time.Millisecond,
		Batch: func(ctx context.Context, tx pgx.Tx, n int) (int, error) {
			tag, err := tx.Exec(ctx, `
UPDATE demo_backfill_people SET greeting = 'Hello, ' || name || '!'
WHERE id = ANY (ARRAY(
        SELECT id FROM demo_backfill_people WHERE greeting IS NULL ORDER BY id LIMIT $1 FOR UPDATE))
  AND greeting IS NULL`, n)
			return int(tag.RowsAffected()), err
		},
		Estimate: func(ctx context.Context, db pg.DBTX) (int64, error) {
			var n int64
			err := db.QueryRow(ctx, `SELECT count(*) FROM demo_backfill_people WHERE greeting IS NULL`).Scan(&n)
			return n, err
		},
	}
}

// demoBackfillModule is the backfill demo's module; its Dev loop plays the
// operator.
func demoBackfillModule() cli.Module {
	return cli.Module{
		Name:       "demo_backfill",
		Migrations: migrationsOf("demo_backfill"),
		Dev: func(ctx context.Context, db *pg.Pool, log zerolog.Logger) {
			runBackfillDemo(ctx, log, db, 5*time.Second, time.Minute)
		},
		Register: func(r *workers.Registry) error { return workers.AddBackfill(r, demoGreetings()) },
	}
}

// runBackfillDemo plays the operator: it starts the demo backfill if it was never
// started, and again `again` after it is done (having forgotten some greetings),
// checking every `every` until ctx ends. A paused or cancelled demo backfill is
// left as the operator left it.
func runBackfillDemo(ctx context.Context, log zerolog.Logger, db *pg.Pool, every, again time.Duration) {
	b := demoGreetings()
	for {
		p, err := backfill.Get(ctx, db, b.Name)
		switch {
		case fault.Has(err, fault.NotFound):
			_, err = backfill.Start(ctx, db, b.Name, b.Estimate)
		case err == nil && p.State == backfill.Done && p.FinishedAt != nil && p.Now.Sub(*p.FinishedAt) >= again:
			err = pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `UPDATE demo_backfill_people SET greeting = NULL
WHERE id IN (SELECT id FROM demo_backfill_people ORDER BY random() LIMIT 4000)`)
				return err
			})
			if err == nil {
				_, err = backfill.Start(ctx, db, b.Name, b.Estimate)
			}
		}
		if err != nil && ctx.Err() == nil && !fault.Has(err, fault.Conflict) {
			log.Warn().Err(err).Msg("demo: backfill")
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}
