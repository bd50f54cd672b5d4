// Command exampleapp is an application built on Better Compute, as docs/applications.md
// shows: its main hands its module (migrations, a reconciler, a fenced task and a
// workflow) to cli.Main and gets the whole binary. Tests build it and run it as worker processes.
//
// The application side of the example is Change: it changes an item and marks it
// dirty in one transaction. The reconciler copies qty to reconciled_qty. A task
// (InsertTask) is a fenced job of the application's own: its one write is
// recorded in example_task_runs, so tests can count how often it ran, with
// when its transaction started and finished; EXAMPLE_TASK_SLEEP holds the
// transaction open between the two, so tests can count the tasks of a tenant
// running at once.
//
// Order is a durable workflow (domain/workflow) of three transactional steps,
// reserve, charge and confirm, each writing one row of
// example_workflow_effects in its step's fenced transaction; an order started
// with AwaitPayment waits after reserve for the signal "paid" (PayTx), up to
// PaymentTimeout, before it charges, and releases its reservation if none
// comes. Tests kill -9 and pause its worker processes mid-step and count the
// effect rows: each is written exactly once.
//
// Tally is a second workflow, of kind example_tally: it awaits the signal
// "add" again and again until it has consumed N of them. Its first step,
// open, can hold its transaction open (EXAMPLE_TALLY_HOLD), so tests can pause
// a worker inside it and signal the workflow meanwhile.
package main

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/bettercompute/bettercompute/cmd/better-compute/cli"
	"github.com/bettercompute/bettercompute/domain/workflow"
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
				workers.AddWorkflow(r, Order),
				workers.AddWorkflow(r, Tally),
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
// long, so tests can pause or kill a worker mid-reconcile; with
// EXAMPLE_RECONCILE_SLOW set, an item whose id starts with "slow-" holds it
// that long instead, so one process can have short and long reconciles in
// flight at once.
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
	sleep := os.Getenv("EXAMPLE_RECONCILE_SLEEP")
	if slow := os.Getenv("EXAMPLE_RECONCILE_SLOW"); slow != "" && strings.HasPrefix(key, "slow-") {
		sleep = slow
	}
	if d, err := time.ParseDuration(sleep); err == nil && d > 0 {
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
		return workers.DirtyTx(ctx, tx, "example_item", id, nil)
	})
}

// Task is the example's own fenced job: it records its run in its shard's
// fenced transaction. Its tenant, if any, is the job's (workers.WithTenant
// where it is inserted): the job's metadata carries it.
type Task struct {
	ID string `json:"id"`
}

// Kind is the task's River kind.
func (Task) Kind() string { return "example_task" }

type taskWorker struct{ river.WorkerDefaults[Task] }

// Work records the task's run, with when its fenced transaction started and
// finished (the database's wall clock). With EXAMPLE_TASK_SLEEP set (a
// duration), it reads the start first and then holds the transaction open that
// long, so tests can count the tasks running at once and kill or pause a
// worker mid-task; without it the run is the one statement it always was,
// started_at the time it was recorded.
func (w *taskWorker) Work(ctx context.Context, job *river.Job[Task]) error {
	return workers.InTx(ctx, job, func(ctx context.Context, tx pgx.Tx) error {
		var started *time.Time
		if d, err := time.ParseDuration(os.Getenv("EXAMPLE_TASK_SLEEP")); err == nil && d > 0 {
			started = new(time.Time)
			if err := tx.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(started); err != nil {
				return err
			}
			select {
			case <-time.After(d):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO example_task_runs (task_id, job_id, worker, started_at, finished_at)
			VALUES ($1, $2, $3, coalesce($4, clock_timestamp()), clock_timestamp())`,
			job.Args.ID, job.ID, strconv.Itoa(os.Getpid()), started)
		return err
	})
}

// InsertTaskTx enqueues task id in tx, in the shard queue its id picks.
func InsertTaskTx(ctx context.Context, tx pgx.Tx, id string) error {
	_, err := workers.InsertForKeyTx(ctx, tx, id, Task{ID: id}, nil)
	return err
}

// OrderInput starts an order workflow.
type OrderInput struct {
	Order string `json:"order"`
	// AwaitPayment makes the order wait after reserve for the signal "paid".
	AwaitPayment bool `json:"await_payment,omitempty"`
}

// OrderState is an order workflow's saved state.
type OrderState struct {
	Order string `json:"order"`
	// Amount is what the "paid" signal said.
	Amount int64 `json:"amount,omitempty"`
	// Done are the steps committed so far, in order.
	Done []string `json:"done,omitempty"`
}

// OrderResult is a finished order.
type OrderResult struct {
	Order    string   `json:"order"`
	Amount   int64    `json:"amount,omitempty"`
	Released bool     `json:"released,omitempty"`
	Steps    []string `json:"steps"`
}

// Payment is the payload of the signal "paid".
type Payment struct {
	Amount int64 `json:"amount"`
}

// PaymentTimeout is how long an order that awaits its payment waits for it.
const PaymentTimeout = 24 * time.Hour

// Order is the example's workflow, of kind example_order: reserve, (await
// "paid",) charge, confirm; or reserve, then release when the payment does
// not come in time.
var Order = &workflow.Workflow[OrderInput, OrderState, OrderResult]{
	Kind: "example_order",
	Init: func(in OrderInput) (OrderState, error) { return OrderState{Order: in.Order}, nil },
	Steps: []workflow.Step[OrderState]{
		{Name: "reserve", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[OrderState]) (workflow.Next, error) {
			if err := orderEffect(ctx, tx, c); err != nil {
				return workflow.Next{}, err
			}
			var in OrderInput
			if err := json.Unmarshal(c.Input, &in); err != nil {
				return workflow.Next{}, err
			}
			if in.AwaitPayment {
				return workflow.AwaitSignal("paid", PaymentTimeout, "charge", "release"), nil
			}
			return workflow.Goto("charge"), nil
		}},
		{Name: "charge", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[OrderState]) (workflow.Next, error) {
			if c.Signal != nil {
				var p Payment
				if err := c.Signal.Decode(&p); err != nil {
					return workflow.Next{}, err
				}
				c.State.Amount = p.Amount
			}
			if err := orderEffect(ctx, tx, c); err != nil {
				return workflow.Next{}, err
			}
			return workflow.Goto("confirm"), nil
		}},
		{Name: "confirm", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[OrderState]) (workflow.Next, error) {
			if err := orderEffect(ctx, tx, c); err != nil {
				return workflow.Next{}, err
			}
			return workflow.Finish(OrderResult{Order: c.State.Order, Amount: c.State.Amount, Steps: c.State.Done}), nil
		}},
		{Name: "release", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[OrderState]) (workflow.Next, error) {
			if err := orderEffect(ctx, tx, c); err != nil {
				return workflow.Next{}, err
			}
			return workflow.Finish(OrderResult{Order: c.State.Order, Released: true, Steps: c.State.Done}), nil
		}},
	},
	Signals: []string{"paid"},
}

// orderEffect is a step's domain write: its row of example_workflow_effects,
// counted, in the step's transaction. With EXAMPLE_STEP_SLEEP set (a
// duration), the step then holds its transaction open that long before it
// returns, so tests can kill or pause a worker mid-step.
func orderEffect(ctx context.Context, tx pgx.Tx, c *workflow.Call[OrderState]) error {
	_, err := tx.Exec(ctx, `INSERT INTO example_workflow_effects (workflow_id, step, worker) VALUES ($1, $2, $3)
		ON CONFLICT (workflow_id, step) DO UPDATE SET n = example_workflow_effects.n + 1,
		    worker = EXCLUDED.worker, written_at = clock_timestamp()`, c.WorkflowID, c.Step, strconv.Itoa(os.Getpid()))
	if err != nil {
		return err
	}
	c.State.Done = append(c.State.Done, c.Step)
	if d, err := time.ParseDuration(os.Getenv("EXAMPLE_STEP_SLEEP")); err == nil && d > 0 {
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// StartOrderTx starts the order workflow id in tx: if tx rolls back, nothing
// was started.
func StartOrderTx(ctx context.Context, tx pgx.Tx, id string, in OrderInput) error {
	_, err := Order.StartTx(ctx, tx, in, &workflow.StartOpts{ID: id})
	return err
}

// PayTx sends order id its payment, in tx; a repeated payment with the same
// key counts once.
func PayTx(ctx context.Context, tx pgx.Tx, id, key string, amount int64) error {
	_, err := workflow.SignalTx(ctx, tx, id, "paid", Payment{Amount: amount}, &workflow.SignalOpts{DedupKey: key})
	return err
}

// TallyInput starts a tally: it consumes N signals "add".
type TallyInput struct {
	N int `json:"n"`
}

// TallyState is a tally's saved state, and its result.
type TallyState struct {
	N   int   `json:"n"`
	Got int   `json:"got"`
	Sum int64 `json:"sum"`
}

// Tally is the example's second workflow, of kind example_tally: open, then
// add once per signal "add" (its payload a Payment, summed) until N have come.
// open writes its row of example_workflow_effects and, with EXAMPLE_TALLY_HOLD
// set (a duration), then holds its transaction open that long.
var Tally = &workflow.Workflow[TallyInput, TallyState, TallyState]{
	Kind: "example_tally",
	Init: func(in TallyInput) (TallyState, error) { return TallyState{N: in.N}, nil },
	Steps: []workflow.Step[TallyState]{
		{Name: "open", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[TallyState]) (workflow.Next, error) {
			_, err := tx.Exec(ctx, `INSERT INTO example_workflow_effects (workflow_id, step, worker) VALUES ($1, $2, $3)
				ON CONFLICT (workflow_id, step) DO UPDATE SET n = example_workflow_effects.n + 1,
				    worker = EXCLUDED.worker, written_at = clock_timestamp()`, c.WorkflowID, c.Step, strconv.Itoa(os.Getpid()))
			if err != nil {
				return workflow.Next{}, err
			}
			if d, err := time.ParseDuration(os.Getenv("EXAMPLE_TALLY_HOLD")); err == nil && d > 0 {
				select {
				case <-time.After(d):
				case <-ctx.Done():
					return workflow.Next{}, ctx.Err()
				}
			}
			return workflow.AwaitSignal("add", 0, "add", ""), nil
		}},
		{Name: "add", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[TallyState]) (workflow.Next, error) {
			var p Payment
			if err := c.Signal.Decode(&p); err != nil {
				return workflow.Next{}, err
			}
			c.State.Got++
			c.State.Sum += p.Amount
			if c.State.Got >= c.State.N {
				return workflow.Finish(c.State), nil
			}
			return workflow.AwaitSignal("add", 0, "add", ""), nil
		}},
	},
	Signals: []string{"add"},
}
