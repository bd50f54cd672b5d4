package demo

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/cmd/better-compute/cli"
	"github.com/bettercompute/bettercompute/domain/capacity"
	"github.com/bettercompute/bettercompute/domain/workflow"
	"github.com/bettercompute/bettercompute/platform/clock"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/migrate"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers/workertest"
	"github.com/bettercompute/bettercompute/workers/workflowworker"
)

// orderT0 is where the order tests' sim clock starts.
var orderT0 = time.Date(2030, 3, 1, 12, 0, 0, 0, time.UTC)

// startOrderDemo migrates the workflow demo's tables, puts compute_now() on a
// sim clock at orderT0, creates the demo pool and the shop's quota, and starts
// a worker with the demo application's registry (the built-in modules and the
// workflow demo's module).
func startOrderDemo(t *testing.T) *pgtest.DB {
	t.Helper()
	ctx := context.Background()
	m := demoWorkflowModule()
	ms, err := migrate.FromFS(m.Name, m.Migrations)
	require.NoError(t, err)
	db := pgtest.New(t, pgtest.Options{Groups: []migrate.Group{{Owner: m.Name, Migrations: ms}}})
	require.NoError(t, clock.UseSim(ctx, db.Pool, orderT0))
	require.NoError(t, ensureOrderPool(ctx, db.Pool))
	reg, err := cli.App{Modules: []cli.Module{m}}.Registry()
	require.NoError(t, err)
	require.NoError(t, workflowworker.Register(reg, &workflowworker.Options{WakeEvery: 50 * time.Millisecond}))
	workertest.Start(t, db.Pool, reg, nil)
	return db
}

func placeOrder(t *testing.T, db *pg.Pool, devices int) int64 {
	t.Helper()
	var id int64
	require.NoError(t, pg.InTx(context.Background(), db, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		id, err = PlaceOrderTx(ctx, tx, "ada", devices, orderT0.Add(time.Hour), orderT0.Add(2*time.Hour))
		return err
	}))
	return id
}

// waitOrder waits until order id's workflow has finished and returns it.
func waitOrder(t *testing.T, db *pg.Pool, id int64) *workflow.Info {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	i, err := workflow.Wait(ctx, db, OrderWorkflowID(id), 20*time.Millisecond)
	require.NoError(t, err)
	return i
}

// waitReserved waits until order id holds its devices and awaits its payment.
func waitReserved(t *testing.T, db *pg.Pool, id int64) {
	t.Helper()
	workertest.WaitFor(t, 30*time.Second, "the order's hold and its await", func() bool {
		i, err := workflow.Get(context.Background(), db, OrderWorkflowID(id))
		require.NoError(t, err)
		return i.Status == workflow.Waiting
	})
}

type orderRow struct {
	status      string
	reservation *int64
	paid        bool
	reason      *string
}

func getOrder(t *testing.T, db *pgtest.DB, id int64) orderRow {
	t.Helper()
	var o orderRow
	require.NoError(t, db.QueryRow(context.Background(),
		`SELECT status, reservation_id, paid_at IS NOT NULL, reason FROM demo_workflow_orders WHERE id = $1`, id).
		Scan(&o.status, &o.reservation, &o.paid, &o.reason))
	return o
}

// orderEvents returns the payloads of order id's events of topic.
func orderEvents(t *testing.T, db *pgtest.DB, topic string, id int64) []OrderResult {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT payload FROM compute_events
		WHERE topic = $1 AND (payload->>'order_id')::bigint = $2 ORDER BY seq`, topic, id)
	require.NoError(t, err)
	payloads, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
	require.NoError(t, err)
	var out []OrderResult
	for _, p := range payloads {
		var r OrderResult
		require.NoError(t, json.Unmarshal(p, &r))
		out = append(out, r)
	}
	return out
}

// requireNothingHeld: no hold is left in the demo pool, and the shop's quota
// usage equals its live bookings (want of them confirmed).
func requireNothingHeld(t *testing.T, db *pgtest.DB, confirmed int) {
	t.Helper()
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM capacity_reservations WHERE state = 'hold'`), "a hold is left")
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM capacity_bookings WHERE state = 'hold'`), "a held booking is left")
	q, err := capacity.GetQuota(context.Background(), db.Pool, orderTenant, orderPool)
	require.NoError(t, err)
	require.Equal(t, confirmed, q.Used, "the shop's quota usage")
	require.Equal(t, confirmed, db.MustCount(t, `SELECT count(*) FROM capacity_bookings WHERE tenant = $1 AND state = 'confirmed'`, orderTenant))
	c, err := capacity.Capacity(context.Background(), db.Pool, orderPool)
	require.NoError(t, err)
	require.Zero(t, c.Holds, "the pool's rollup counts a hold")
}

func pay(db *pg.Pool, id int64, amount int) error {
	return pg.InTx(context.Background(), db, func(ctx context.Context, tx pgx.Tx) error {
		return PayOrderTx(ctx, tx, id, amount)
	})
}

// TestOrderWorkflowPaidOrderIsConfirmed: a paid order's workflow holds its
// devices, takes the payment's signal and turns the hold into a booking, with
// the order's row and one confirmed event; a second payment counts once.
func TestOrderWorkflowPaidOrderIsConfirmed(t *testing.T) {
	t.Parallel()
	db := startOrderDemo(t)
	ctx := context.Background()
	id := placeOrder(t, db.Pool, 2)
	waitReserved(t, db.Pool, id)
	o := getOrder(t, db, id)
	require.Equal(t, "reserved", o.status)
	require.NotNil(t, o.reservation)
	r, err := capacity.Get(ctx, db.Pool, *o.reservation)
	require.NoError(t, err)
	require.Equal(t, capacity.Hold, r.State)
	require.Equal(t, orderT0.Add(PayWindow+HoldGrace), r.ExpiresAt.UTC(), "the hold expires on its own after the pay window and its grace")

	// Paid twice (a retried request): the dedup key counts it once.
	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		if err := PayOrderTx(ctx, tx, id, 42); err != nil {
			return err
		}
		return PayOrderTx(ctx, tx, id, 42)
	}))
	out, err := OrderWorkflow.Wait(ctx, db.Pool, OrderWorkflowID(id), 20*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, OrderResult{OrderID: id, Status: "confirmed", ReservationID: *o.reservation, Paid: 42}, out)

	r, err = capacity.Get(ctx, db.Pool, *o.reservation)
	require.NoError(t, err)
	require.Equal(t, capacity.Confirmed, r.State, "the hold became a booking")
	require.Len(t, r.Devices, 2)
	o = getOrder(t, db, id)
	require.Equal(t, "confirmed", o.status)
	require.True(t, o.paid)
	require.Equal(t, []OrderResult{out}, orderEvents(t, db, "demo.order.confirmed", id), "one event, the result")
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM compute_events WHERE topic LIKE 'demo.order.%'`))
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM compute_workflow_signals WHERE consumed_at IS NULL`), "the duplicate payment was not stored")

	hist, err := workflow.History(ctx, db.Pool, OrderWorkflowID(id))
	require.NoError(t, err)
	require.Len(t, hist, 2)
	require.Equal(t, []string{"reserve", "confirm"}, []string{hist[0].Step, hist[1].Step})
	requireNothingHeld(t, db, 2)

	// The paid order is over: its payment again (the same dedup key, a sender
	// retrying) counts as the one it was, and writes nothing.
	var paidAt time.Time
	require.NoError(t, db.QueryRow(ctx, `SELECT paid_at FROM demo_workflow_orders WHERE id = $1`, id).Scan(&paidAt))
	require.NoError(t, pay(db.Pool, id, 42))
	var again time.Time
	require.NoError(t, db.QueryRow(ctx, `SELECT paid_at FROM demo_workflow_orders WHERE id = $1`, id).Scan(&again))
	require.Equal(t, paidAt, again)
}

// TestOrderWorkflowUnpaidOrderTimesOut: an order nobody pays waits on
// compute_now(); when the sim clock passes the pay window, the timeout step
// releases the hold (before its own expiry) and appends the released event. A
// payment after that is refused (CONFLICT) and records nothing.
func TestOrderWorkflowUnpaidOrderTimesOut(t *testing.T) {
	t.Parallel()
	db := startOrderDemo(t)
	ctx := context.Background()
	id := placeOrder(t, db.Pool, 1)
	waitReserved(t, db.Pool, id)
	o := getOrder(t, db, id)
	require.NotNil(t, o.reservation)
	// Still waiting a while later: the wall clock does not end the wait.
	time.Sleep(300 * time.Millisecond)
	i, err := workflow.Get(ctx, db.Pool, OrderWorkflowID(id))
	require.NoError(t, err)
	require.Equal(t, workflow.Waiting, i.Status)
	require.Equal(t, orderT0.Add(PayWindow), i.WakeAt.UTC())

	// Past the pay window, not yet past the hold's own expiry.
	_, err = db.Exec(ctx, `SELECT compute_advance_sim_clock(interval '20 seconds')`)
	require.NoError(t, err)
	i = waitOrder(t, db.Pool, id)
	require.Equal(t, workflow.Completed, i.Status)
	var out OrderResult
	require.NoError(t, json.Unmarshal(i.Result, &out))
	require.Equal(t, OrderResult{OrderID: id, Status: "released", ReservationID: *o.reservation, Reason: "not paid within 15s"}, out)

	r, err := capacity.Get(ctx, db.Pool, *o.reservation)
	require.NoError(t, err)
	require.Equal(t, capacity.Released, r.State, "released by the workflow, not expired by the hold's job")
	o = getOrder(t, db, id)
	require.Equal(t, "released", o.status)
	require.False(t, o.paid)
	require.Equal(t, []OrderResult{out}, orderEvents(t, db, "demo.order.released", id))
	hist, err := workflow.History(ctx, db.Pool, OrderWorkflowID(id))
	require.NoError(t, err)
	require.Equal(t, []string{"reserve", "release"}, []string{hist[0].Step, hist[1].Step})

	err = pay(db.Pool, id, 42)
	require.True(t, fault.Has(err, fault.Conflict), "%v", err)
	require.False(t, getOrder(t, db, id).paid, "the refused payment rolled back with its signal")
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM compute_workflow_signals`))
	requireNothingHeld(t, db, 0)
}

// TestOrderWorkflowCancelledOrderIsCompensated: cancelling a waiting order
// runs its compensation step once, which releases the hold and appends the
// cancelled event; a payment in the cancel's wake is refused.
func TestOrderWorkflowCancelledOrderIsCompensated(t *testing.T) {
	t.Parallel()
	db := startOrderDemo(t)
	ctx := context.Background()
	id := placeOrder(t, db.Pool, 1)
	waitReserved(t, db.Pool, id)
	o := getOrder(t, db, id)
	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		return CancelOrderTx(ctx, tx, id)
	}))
	i := waitOrder(t, db.Pool, id)
	require.Equal(t, workflow.Cancelled, i.Status)
	require.Contains(t, i.Error, "cancelled by the customer")
	r, err := capacity.Get(ctx, db.Pool, *o.reservation)
	require.NoError(t, err)
	require.Equal(t, capacity.Released, r.State)
	require.Equal(t, "cancelled", getOrder(t, db, id).status)
	require.Equal(t, []OrderResult{{OrderID: id, Status: "cancelled", ReservationID: *o.reservation, Reason: "cancelled by the customer"}},
		orderEvents(t, db, "demo.order.cancelled", id))
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM compute_events WHERE topic LIKE 'demo.order.%'`))
	err = pay(db.Pool, id, 42)
	require.True(t, fault.Has(err, fault.Conflict), "%v", err)
	requireNothingHeld(t, db, 0)
}

// TestOrderWorkflowSoldOutOrderIsRejected: an order the shop's quota cannot
// hold is tried three times (CONFLICT), then its OnError step rejects it, with
// an event; nothing was held.
func TestOrderWorkflowSoldOutOrderIsRejected(t *testing.T) {
	t.Parallel()
	db := startOrderDemo(t)
	ctx := context.Background()
	id := placeOrder(t, db.Pool, orderQuota+1)
	i := waitOrder(t, db.Pool, id)
	require.Equal(t, workflow.Completed, i.Status)
	var out OrderResult
	require.NoError(t, json.Unmarshal(i.Result, &out))
	require.Equal(t, "rejected", out.Status)
	require.Zero(t, out.ReservationID)
	require.Contains(t, out.Reason, "attempt 3 of 3")
	require.Contains(t, out.Reason, "CONFLICT")
	o := getOrder(t, db, id)
	require.Equal(t, "rejected", o.status)
	require.Nil(t, o.reservation)
	require.Len(t, orderEvents(t, db, "demo.order.rejected", id), 1)
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM capacity_reservations`))
	hist, err := workflow.History(ctx, db.Pool, OrderWorkflowID(id))
	require.NoError(t, err)
	require.Equal(t, "reject", hist[len(hist)-1].Step)
	requireNothingHeld(t, db, 0)
}

// TestOrderWorkflowDemoLoop runs dev's workflow demo loop (fast) on the sim
// clock: orders are paid and confirmed, cancelled and compensated. Once the
// loop stops and the sim clock passes the pay window and the rentals, every
// order has ended with exactly one event, the loop's return ends the
// confirmed rentals, and nothing is left reserved.
func TestOrderWorkflowDemoLoop(t *testing.T) {
	t.Parallel()
	db := startOrderDemo(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	log := workertest.Logger(t)
	go func() {
		defer close(done)
		runWorkflowDemo(ctx, log, db.Pool, workflowDemo{Every: 50 * time.Millisecond, PayWithin: 200 * time.Millisecond, Rental: time.Minute})
	}()
	defer func() { cancel(); <-done }()
	workertest.WaitFor(t, 60*time.Second, "confirmed and cancelled orders", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM demo_workflow_orders WHERE status = 'confirmed'`) >= 2 &&
			db.MustCount(t, `SELECT count(*) FROM demo_workflow_orders WHERE status = 'cancelled'`) >= 1
	})
	cancel()
	<-done

	// The orders still waiting (never paid, or their payment dropped with the
	// loop) time out once the sim clock passes their pay window; an order
	// whose reserve is still being retried (the quota was full) starts its
	// wait later, so the clock moves on until every workflow has finished.
	last := time.Time{}
	workertest.WaitFor(t, 60*time.Second, "every order's workflow finished", func() bool {
		if db.MustCount(t, `SELECT count(*) FROM compute_workflows WHERE kind = $1 AND finished_at IS NULL`, OrderKind) == 0 {
			return true
		}
		if time.Since(last) > time.Second {
			_, err := db.Exec(context.Background(), `SELECT compute_advance_sim_clock(interval '20 seconds')`)
			require.NoError(t, err)
			last = time.Now()
		}
		return false
	})
	orders := db.MustCount(t, `SELECT count(*) FROM demo_workflow_orders`)
	require.Equal(t, orders, db.MustCount(t, `SELECT count(*) FROM compute_workflows WHERE kind = $1`, OrderKind), "one workflow per order")
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM demo_workflow_orders WHERE status IN ('placed', 'reserved')`))
	require.Equal(t, orders, db.MustCount(t, `SELECT count(*) FROM compute_events WHERE topic LIKE 'demo.order.%'`), "one event per order")
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM demo_workflow_orders o WHERE (SELECT count(*) FROM compute_events e
		WHERE e.topic = 'demo.order.' || o.status AND (e.payload->>'order_id')::bigint = o.id) <> 1`), "each order's event names its status")
	// Each workflow's outcome matches its order's row.
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM demo_workflow_orders o JOIN compute_workflows w ON w.id = 'order-' || o.id
		WHERE (w.status = 'cancelled') <> (o.status = 'cancelled')
		   OR (w.status = 'completed' AND w.result->>'status' <> o.status)`))
	confirmed := db.MustCount(t, `SELECT coalesce(sum(devices), 0) FROM demo_workflow_orders WHERE status = 'confirmed'`)
	requireNothingHeld(t, db, confirmed)

	// The rentals end: the loop's return gives their devices back.
	_, err := db.Exec(context.Background(), `SELECT compute_advance_sim_clock(interval '1 minute')`)
	require.NoError(t, err)
	require.NoError(t, returnRentals(context.Background(), log, db.Pool))
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM demo_workflow_orders WHERE status = 'confirmed'`))
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM capacity_reservations WHERE state IN ('hold', 'confirmed')`), "nothing is left reserved")
	requireNothingHeld(t, db, 0)
}

// TestWorkflowDemoRegisters: the order workflow and its sink join the
// built-in modules in one registry, once.
func TestWorkflowDemoRegisters(t *testing.T) {
	t.Parallel()
	reg, err := cli.App{Modules: []cli.Module{demoWorkflowModule()}}.Registry()
	require.NoError(t, err)
	require.Contains(t, workflowworker.Definitions(reg), OrderKind)
	_, err = cli.App{Modules: []cli.Module{demoWorkflowModule(), demoWorkflowModule()}}.Registry()
	require.True(t, fault.Has(err, fault.InvalidConfig), "the order workflow registered twice: %v", err)
}
