package workers_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/rs/zerolog"

	"github.com/bettercompute/bettercompute/cmd/better-compute/cli"
	"github.com/bettercompute/bettercompute/domain/outbox"
	"github.com/bettercompute/bettercompute/domain/workflow"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

// A reconciler brings one key to what the data says. The transaction that
// changes the data marks the key dirty; after it commits, a worker reconciles
// the key in a fenced transaction of its own.
func ExampleAddReconciler() {
	ctx := context.Background()
	db := exampleDB() // the application's pool; it has tables orders and customers
	// What the application's cli.Module registers:
	register := func(r *workers.Registry) error {
		return workers.AddReconciler(r, workers.Reconciler{
			Kind: "customer",
			Reconcile: func(ctx context.Context, tx pgx.Tx, customer string) (workers.Result, error) {
				_, err := tx.Exec(ctx, `
					INSERT INTO customers (id, orders, cents)
					SELECT $1, count(*), coalesce(sum(cents), 0) FROM orders WHERE customer = $1
					ON CONFLICT (id) DO UPDATE SET orders = EXCLUDED.orders, cents = EXCLUDED.cents`, customer)
				return workers.Result{}, err
			},
		})
	}
	defer exampleWorker(db, register)() // a worker process of the application

	err := pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO orders (id, customer, cents) VALUES ('o-1', 'ada', 1250), ('o-2', 'ada', 500)`)
		if err != nil {
			return err
		}
		return workers.DirtyTx(ctx, tx, "customer", "ada", nil) // last: after the writes it reconciles
	})
	if err != nil {
		panic(err)
	}

	var orders, cents int64
	exampleWait(db, `SELECT orders, cents FROM customers WHERE id = 'ada'`, &orders, &cents)
	fmt.Printf("ada: %d orders, %d cents\n", orders, cents)
	// Output: ada: 2 orders, 1750 cents
}

// ShipArgs is an application's fenced job: ship one order.
type ShipArgs struct {
	OrderID string `json:"order_id"`
}

// Kind is the job's River kind.
func (ShipArgs) Kind() string { return "ship_order" }

// ShipWorker ships an order in the job's fenced transaction: a stale attempt
// or a process that lost the shard's lease writes nothing.
type ShipWorker struct {
	river.WorkerDefaults[ShipArgs]
}

// Work marks the order shipped.
func (w *ShipWorker) Work(ctx context.Context, job *river.Job[ShipArgs]) error {
	return workers.InTx(ctx, job, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE orders SET state = 'shipped' WHERE id = $1 AND state = 'placed'`, job.Args.OrderID)
		return err
	})
}

// A fenced job of the application's own kind is inserted in the transaction
// that makes it necessary; its key picks the shard queue, whose lease holder
// runs it.
func ExampleInsertForKeyTx() {
	ctx := context.Background()
	db := exampleDB()
	defer exampleWorker(db, func(r *workers.Registry) error {
		return workers.AddWorker(r, &ShipWorker{})
	})()

	err := pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO orders (id, customer, cents) VALUES ('o-1', 'ada', 1250)`)
		if err != nil {
			return err
		}
		_, err = workers.InsertForKeyTx(ctx, tx, "o-1", ShipArgs{OrderID: "o-1"}, nil)
		return err
	})
	if err != nil {
		panic(err)
	}

	var state string
	exampleWait(db, `SELECT state FROM orders WHERE id = 'o-1' AND state <> 'placed'`, &state)
	fmt.Println("o-1", state)
	// Output: o-1 shipped
}

// A sink with HandleTx writes the events of its topics into this database in
// the transaction that moves its cursor past them: each event exactly once.
func ExampleAddSink() {
	ctx := context.Background()
	db := exampleDB()
	defer exampleWorker(db, func(r *workers.Registry) error {
		return workers.AddSink(r, workers.Sink{
			Name:   "audit",
			Topics: []string{"order.placed"},
			HandleTx: func(ctx context.Context, tx pgx.Tx, events []outbox.Event) error {
				for _, e := range events {
					_, err := tx.Exec(ctx, `INSERT INTO order_audit (event_id, topic, order_id, payload)
						VALUES ($1, $2, $3, $4)`, e.ID.String(), e.Topic, e.Key, e.Payload)
					if err != nil {
						return err
					}
				}
				return nil
			},
		})
	})()

	err := pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		return outbox.AppendTx(ctx, tx,
			outbox.Message{Topic: "order.placed", Key: "o-1", Payload: map[string]int{"cents": 1250}},
			outbox.Message{Topic: "order.paid", Key: "o-1"}, // not a topic of the sink's
			outbox.Message{Topic: "order.placed", Key: "o-2", Payload: map[string]int{"cents": 500}},
		)
	})
	if err != nil {
		panic(err)
	}

	exampleWait(db, `SELECT 1 FROM order_audit HAVING count(*) >= 2`, new(int))
	rows, err := db.Query(ctx, `SELECT topic, order_id, payload::text FROM order_audit ORDER BY seq`)
	if err != nil {
		panic(err)
	}
	for rows.Next() {
		var topic, order, payload string
		if err := rows.Scan(&topic, &order, &payload); err != nil {
			panic(err)
		}
		fmt.Println(topic, order, payload)
	}
	// Output:
	// order.placed o-1 {"cents": 1250}
	// order.placed o-2 {"cents": 500}
}

// A workflow registered with AddWorkflow runs in the worker processes: each
// step is a fenced transaction, and Wait returns the typed result.
func ExampleAddWorkflow() {
	type (
		Order struct{ ID string }
		State struct {
			Order string
			Cents int64
		}
		Invoice State
	)
	invoice := &workflow.Workflow[Order, State, Invoice]{
		Kind: "invoice",
		Init: func(o Order) (State, error) { return State{Order: o.ID}, nil },
		Steps: []workflow.Step[State]{
			{Name: "total", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[State]) (workflow.Next, error) {
				err := tx.QueryRow(ctx, `SELECT cents FROM orders WHERE id = $1`, c.State.Order).Scan(&c.State.Cents)
				return workflow.Goto("bill"), err
			}},
			{Name: "bill", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[State]) (workflow.Next, error) {
				_, err := tx.Exec(ctx, `UPDATE orders SET state = 'billed' WHERE id = $1`, c.State.Order)
				return workflow.Finish(Invoice(*c.State)), err
			}},
		},
	}
	ctx := context.Background()
	db := exampleDB()
	defer exampleWorker(db, func(r *workers.Registry) error { return workers.AddWorkflow(r, invoice) })()

	var id string
	err := pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO orders (id, customer, cents) VALUES ('o-1', 'ada', 1250)`)
		if err != nil {
			return err
		}
		id, err = invoice.StartTx(ctx, tx, Order{ID: "o-1"}, &workflow.StartOpts{ID: "invoice-o-1"})
		return err
	})
	if err != nil {
		panic(err)
	}

	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	result, err := invoice.Wait(ctx, db, id, 20*time.Millisecond)
	fmt.Printf("%+v %v\n", result, err)
	history, err := workflow.History(ctx, db, id)
	if err != nil {
		panic(err)
	}
	for _, h := range history {
		fmt.Println(h.Seq, h.Step, h.Outcome)
	}
	// Output:
	// {Order:o-1 Cents:1250} <nil>
	// 1 total goto
	// 2 bill completed
}

// exampleDB returns a test database with the examples' tables: orders,
// customers (an order's totals) and order_audit (a sink's copy of events).
func exampleDB() *pg.Pool {
	db := pgtest.ForExample().Pool
	_, err := db.Exec(context.Background(), `
		CREATE TABLE orders (id text PRIMARY KEY, customer text NOT NULL, cents bigint NOT NULL,
			state text NOT NULL DEFAULT 'placed');
		CREATE TABLE customers (id text PRIMARY KEY, orders bigint NOT NULL, cents bigint NOT NULL);
		CREATE TABLE order_audit (seq bigint GENERATED ALWAYS AS IDENTITY, event_id text PRIMARY KEY,
			topic text NOT NULL, order_id text NOT NULL, payload jsonb)`)
	if err != nil {
		panic(err)
	}
	return db
}

// exampleWorker starts a worker on every shard of db, as `worker` does for an
// application whose one module registers with register (cli.App.Registry adds
// the built-in modules that run sinks and workflows), with workertest's fast
// intervals, and returns its stop.
func exampleWorker(db *pg.Pool, register func(*workers.Registry) error) (stop func()) {
	ctx := context.Background()
	reg, err := cli.App{Modules: []cli.Module{{Name: "shop", Register: register}}}.Registry()
	if err != nil {
		panic(err)
	}
	o := workertest.Fast
	o.Pool, o.Registry, o.Work, o.Log = db, reg, true, zerolog.Nop()
	for shard := range pgtest.DefaultShardCount {
		o.Shards = append(o.Shards, shard)
	}
	rt, err := workers.Start(ctx, o)
	if err != nil {
		panic(err)
	}
	return func() {
		if err := rt.Stop(ctx); err != nil {
			panic(err)
		}
	}
}

// exampleWait polls query every 10 ms until it returns a row, scanned into
// dest, a minute at most. On timeout it prints so: the example then fails on
// its output, and the test binary still cleans up.
func exampleWait(db *pg.Pool, query string, dest ...any) {
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		err := db.QueryRow(context.Background(), query).Scan(dest...)
		if err == nil {
			return
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			panic(err)
		}
	}
	fmt.Println("timed out waiting for:", query)
}
