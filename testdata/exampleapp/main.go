// Command exampleapp is an application built on Better Compute, as the README
// shows: its main hands its module (migrations and a reconciler) to cli.Main and
// gets the whole binary. Tests build it and run it as worker processes.
//
// The application side of the example is Change: it changes an item and marks it
// dirty in one transaction. The reconciler copies qty to reconciled_qty. A task
// (InsertTask) is a fenced job of the application's own: its one write is
// recorded in example_task_runs, so tests can count how often it ran.
package main

import (
	"context"
	"embed"
	"errors"
	"io/fs"
	"os"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/bettercompute/bettercompute/cmd/better-compute/cli"
	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/workers"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

func main() {
	cli.Main(cli.App{Name: "exampleapp", Modules: []cli.Module{Module()}})
}

// Module is the example application's module.
func Module() cli.Module {
	sub, _ := fs.Sub(migrationFS, "migrations")
	return cli.Module{
		Name:       "example",
		Migrations: sub,
		Register: func(r *workers.Registry) error {
			return errors.Join(
				workers.AddWorker(r, &taskWorker{}),
				workers.AddReconciler(r, workers.Reconciler{
					Kind:      "example_item",
					Reconcile: reconcile,
					List: func(ctx context.Context, db pg.DBTX, after string, limit int) ([]string, error) {
						rows, err := db.Query(ctx, `SELECT id FROM example_items WHERE id > $1 ORDER BY id LIMIT $2`, after, limit)
						if err != nil {
							return nil, err
						}
						return pgx.CollectRows(rows, pgx.RowTo[string])
					},
				}),
			)
		},
	}
}

// reconcile copies an item's qty to reconciled_qty and logs what it saw. With
// EXAMPLE_RECONCILE_SLEEP set (a duration), it holds its transaction open that
// long, so tests can pause or kill a worker mid-reconcile.
func reconcile(ctx context.Context, tx pgx.Tx, key string) (workers.Result, error) {
	// The start is read before any lock, so two overlapping reconciles of one key
	// would show overlapping intervals even if one waited for the other's lock.
	var started time.Time
	if err := tx.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&started); err != nil {
		return workers.Result{}, err
	}
	var version int64
	err := tx.QueryRow(ctx, `UPDATE example_items SET reconciled_qty = qty, reconciled_version = version
		WHERE id = $1 RETURNING version`, key).Scan(&version)
	if err != nil {
		return workers.Result{}, err
	}
	if d, err := time.ParseDuration(os.Getenv("EXAMPLE_RECONCILE_SLEEP")); err == nil && d > 0 {
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return workers.Result{}, ctx.Err()
		}
	}
	_, err = tx.Exec(ctx, `INSERT INTO example_reconcile_log (item_id, seen_version, worker, started_at, finished_at)
		VALUES ($1, $2, $3, $4, clock_timestamp())`, key, version, strconv.Itoa(os.Getpid()), started)
	return workers.Result{}, err
}

// Change is the application's state change: it sets an item's qty and marks the
// item dirty, in one transaction.
func Change(ctx context.Context, db *pg.Pool, id string, qty int64) error {
	return pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO example_items (id, qty) VALUES ($1, $2)
			ON CONFLICT (id) DO UPDATE SET qty = EXCLUDED.qty, version = example_items.version + 1, updated_at = compute_now()`, id, qty)
		if err != nil {
			return err
		}
		return jobs.DirtyTx(ctx, tx, "example_item", id, nil)
	})
}

// Task is the example's own fenced job: it records its run in its shard's
// fenced transaction.
type Task struct {
	ID string `json:"id"`
}

// Kind is the task's River kind.
func (Task) Kind() string { return "example_task" }

type taskWorker struct{ river.WorkerDefaults[Task] }

func (w *taskWorker) Work(ctx context.Context, job *river.Job[Task]) error {
	return workers.InTx(ctx, job, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO example_task_runs (task_id, job_id, worker) VALUES ($1, $2, $3)`,
			job.Args.ID, job.ID, strconv.Itoa(os.Getpid()))
		return err
	})
}

// InsertTaskTx enqueues task id in tx, in the shard queue its id picks.
func InsertTaskTx(ctx context.Context, tx pgx.Tx, id string) error {
	_, err := jobs.InsertForKeyTx(ctx, tx, id, Task{ID: id}, nil)
	return err
}
