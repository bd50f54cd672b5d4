package workflow_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/domain/workflow"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

// Order is the checkout workflow's input, State what it keeps between steps,
// Sale its result, and Payment the payload of its "paid" signal.
type (
	Order struct {
		ID   string `json:"id"`
		Item string `json:"item"`
	}
	State struct {
		Order    Order `json:"order"`
		Reserved bool  `json:"reserved"`
	}
	Sale struct {
		Order  string `json:"order"`
		Status string `json:"status"` // sold or released
	}
	Payment struct {
		Cents int64 `json:"cents"`
	}
)

// Checkout reserves a unit, then waits up to 3 days for "paid": confirm when it
// comes, release at the deadline, or when the order is cancelled.
var Checkout = &workflow.Workflow[Order, State, Sale]{
	Kind: "checkout",
	Init: func(o Order) (State, error) {
		if o.Item == "" {
			return State{}, fault.New(fault.InvalidArgument, "order %s names no item", o.ID)
		}
		return State{Order: o}, nil
	},
	Steps: []workflow.Step[State]{
		{Name: "reserve", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[State]) (workflow.Next, error) {
			// … take the unit in tx …
			c.State.Reserved = true
			return workflow.AwaitSignal("paid", 72*time.Hour, "confirm", "release"), nil
		}},
		{Name: "confirm", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[State]) (workflow.Next, error) {
			return workflow.Finish(Sale{Order: c.State.Order.ID, Status: "sold"}), nil
		}},
		{Name: "release", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[State]) (workflow.Next, error) {
			// … give the unit back in tx, if c.State.Reserved …
			return workflow.Finish(Sale{Order: c.State.Order.ID, Status: "released"}), nil
		}},
	},
	Signals:    []string{"paid"},
	Compensate: "release",
}

// A workflow starts in the application's transaction: if it rolls back,
// nothing was started. The ID makes the start idempotent. No worker runs here,
// so the workflow stays running at its first step.
func ExampleWorkflow_StartTx() {
	ctx := context.Background()
	db := exampleDB() // migrate has recorded Checkout, as a binary that registers it does
	start := func(o Order) (string, error) {
		var id string
		err := pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
			// … the application's own writes in tx …
			var err error
			id, err = Checkout.StartTx(ctx, tx, o, &workflow.StartOpts{ID: o.ID})
			return err
		})
		return id, err
	}
	id, err := start(Order{ID: "o-1", Item: "widget"})
	if err != nil {
		panic(err)
	}
	info, err := workflow.Get(ctx, db, id)
	if err != nil {
		panic(err)
	}
	fmt.Println(info.ID, info.Kind, info.Status, info.Step)

	_, err = start(Order{ID: "o-1", Item: "widget"}) // the same workflow
	fmt.Println(err)
	_, err = start(Order{ID: "o-1", Item: "gadget"}) // another input, same ID
	fmt.Println(fault.CodeOf(err))
	_, err = start(Order{ID: "o-2"}) // Init refuses it: nothing is sent
	fmt.Println(err)
	// Output:
	// o-1 checkout running reserve
	// <nil>
	// CONFLICT
	// INVALID_ARGUMENT: order o-2 names no item
}

// A signal is sent in the sender's transaction and waits in the workflow's
// inbox until a step awaits it; a dedup key makes a repeat count once.
func ExampleSignalTx() {
	ctx := context.Background()
	db := exampleDB()
	exampleStart(db, Order{ID: "o-1", Item: "widget"}) // as ExampleWorkflow_StartTx does
	pay := func(name string) (workflow.SignalResult, error) {
		var res workflow.SignalResult
		err := pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
			var err error
			res, err = workflow.SignalTx(ctx, tx, "o-1", name, Payment{Cents: 1250},
				&workflow.SignalOpts{DedupKey: "payment-991"})
			return err
		})
		return res, err
	}
	res, err := pay("paid")
	fmt.Println(res.Duplicate, err)
	res, err = pay("paid") // the sender retrying
	fmt.Println(res.Duplicate, err)
	_, err = pay("refunded") // a name Checkout does not declare
	fmt.Println(fault.CodeOf(err))

	counts, err := workflow.Count(ctx, db)
	if err != nil {
		panic(err)
	}
	fmt.Println(counts.SignalsWaiting, "signal waiting")
	// Output:
	// false <nil>
	// true <nil>
	// INVALID_ARGUMENT
	// 1 signal waiting
}

// Cancelling a workflow with a compensation step schedules that step; the
// workflow is cancelling until it has run, with the reason as its error.
func ExampleCancelTx() {
	ctx := context.Background()
	db := exampleDB()
	exampleStart(db, Order{ID: "o-1", Item: "widget"})
	err := pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		return workflow.CancelTx(ctx, tx, "o-1", "cancelled by the customer")
	})
	if err != nil {
		panic(err)
	}
	info, err := workflow.Get(ctx, db, "o-1")
	if err != nil {
		panic(err)
	}
	fmt.Println(info.Status, info.Step, info.Error)
	// Output: cancelling release cancelled by the customer
}

// Validate checks a definition as workers.AddWorkflow does: a step that names
// an undefined one is INVALID_CONFIG.
func ExampleWorkflow_Validate() {
	broken := &workflow.Workflow[Order, State, Sale]{
		Kind:  "checkout",
		Steps: []workflow.Step[State]{{Name: "reserve", Tx: Checkout.Steps[0].Tx, OnError: "reject"}},
	}
	fmt.Println(Checkout.Validate())
	fmt.Println(broken.Validate())
	// Output:
	// <nil>
	// INVALID_CONFIG: workflow checkout: step reserve: OnError step reject is not defined
}

// A step's retry policy: the wait before each retry doubles up to MaxBackoff.
func ExampleRetry_Delay() {
	r := workflow.Retry{Attempts: 6, Backoff: time.Second, MaxBackoff: 10 * time.Second}
	for attempt := 1; attempt < r.Attempts; attempt++ {
		fmt.Printf("after attempt %d: %s\n", attempt, r.Delay(attempt))
	}
	// Output:
	// after attempt 1: 1s
	// after attempt 2: 2s
	// after attempt 3: 4s
	// after attempt 4: 8s
	// after attempt 5: 10s
}

// exampleDB returns a test database where Checkout's kind is recorded, as
// migrate and every worker start of a binary that registers it record it.
func exampleDB() *pg.Pool {
	db := pgtest.ForExample().Pool
	if err := workflow.RecordKinds(context.Background(), db, []workflow.Meta{Checkout.Meta()}); err != nil {
		panic(err)
	}
	return db
}

// exampleStart starts a Checkout of o in a transaction of its own.
func exampleStart(db *pg.Pool, o Order) {
	err := pg.InTx(context.Background(), db, func(ctx context.Context, tx pgx.Tx) error {
		_, err := Checkout.StartTx(ctx, tx, o, &workflow.StartOpts{ID: o.ID})
		return err
	})
	if err != nil {
		panic(err)
	}
}
