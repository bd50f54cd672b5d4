package demo

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/bettercompute/bettercompute/cmd/better-compute/cli"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/workers"
)

// DemoReconciler is the dev demo's reconciler kind.
const DemoReconciler = "demo_counter"

// demoModule is dev's demo: a table of counters and a reconciler that copies each
// counter's value to its reconciled column; its Dev loop plays the application.
func demoModule() cli.Module {
	return cli.Module{
		Name:       "demo",
		Migrations: migrationsOf("demo"),
		Dev: func(ctx context.Context, db *pg.Pool, log zerolog.Logger) {
			runDemo(ctx, log, db, 500*time.Millisecond)
		},
		Register: func(r *workers.Registry) error {
			return workers.AddReconciler(r, workers.Reconciler{
				Kind: DemoReconciler,
				Reconcile: func(ctx context.Context, tx pgx.Tx, key string) (workers.Result, error) {
					_, err := tx.Exec(ctx, `UPDATE demo_counters SET reconciled = value, reconciled_at = compute_now() WHERE id = $1`, key)
					return workers.Result{}, err
				},
				List: func(ctx context.Context, db pg.DBTX, after string, limit int) ([]string, error) {
					rows, err := db.Query(ctx, `SELECT id FROM demo_counters WHERE id > $1 ORDER BY id LIMIT $2`, after, limit)
					if err != nil {
						return nil, err
					}
					return pgx.CollectRows(rows, pgx.RowTo[string])
				},
			})
		},
	}
}

// runDemo changes a random counter and marks it dirty, in one transaction, every
// interval, until ctx is done: the application side of the demo.
func runDemo(ctx context.Context, log zerolog.Logger, db *pg.Pool, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		id := fmt.Sprintf("counter-%03d", 1+rand.IntN(50))
		// The application's request: with dev --trace, its trace goes on to the
		// reconcile it causes.
		rctx, span := cli.TracerProvider(ctx).Tracer("demo").Start(ctx, "demo.change_counter")
		err := pg.InTx(rctx, db, func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `UPDATE demo_counters SET value = value + 1, updated_at = compute_now() WHERE id = $1`, id); err != nil {
				return err
			}
			return workers.DirtyTx(ctx, tx, DemoReconciler, id, nil)
		})
		span.End()
		if err != nil && ctx.Err() == nil {
			log.Warn().Err(err).Msg("demo: change failed")
		}
	}
}
