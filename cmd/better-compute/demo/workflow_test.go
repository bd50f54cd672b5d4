package demo

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/cmd/better-compute/cli"
	"github.com/bettercompute/bettercompute/cmd/better-compute/cli/clitest"
	"github.com/bettercompute/bettercompute/domain/capacity"
	"github.com/bettercompute/bettercompute/domain/workflow"
	"github.com/bettercompute/bettercompute/domain/workflow/confirmation"
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

// waitMail waits until order id's payment link is in its customer's mailbox
// (the demo_mailbox sink delivered its email) and returns its token and
// amount.
func waitMail(t *testing.T, db *pg.Pool, id int64) (confirmation.Token, int) {
	t.Helper()
	var (
		tok    confirmation.Token
		amount int
	)
	workertest.WaitFor(t, 30*time.Second, "the order's payment link in the mailbox", func() bool {
		var err error
		tok, amount, err = readMail(context.Background(), db, id)
		if errors.Is(err, errNoMail) {
			return false
		}
		require.NoError(t, err)
		return true
	})
	require.NoError(t, confirmation.CheckToken(string(tok)))
	return tok, amount
}

// pay confirms the payment link tok, as its customer does.
func pay(db *pg.Pool, tok confirmation.Token) error {
	_, err := confirmation.Confirm(context.Background(), db, string(tok))
	return err
}

// orderLinks are the states of order id's payment links (its confirmation
// bindings), oldest first.
func orderLinks(t *testing.T, db *pg.Pool, id int64) []confirmation.State {
	t.Helper()
	bs, err := confirmation.List(context.Background(), db, confirmation.ListOpts{WorkflowID: OrderWorkflowID(id)})
	require.NoError(t, err)
	var out []confirmation.State
	for i := len(bs) - 1; i >= 0; i-- {
		out = append(out, bs[i].State)
	}
	return out
}

// requireNoToken: tok is nowhere in order id's workflow (its state, result,
// error and history, which the workflows page shows) nor in its events other
// than the email's.
func requireNoToken(t *testing.T, db *pgtest.DB, id int64, tok confirmation.Token) {
	t.Helper()
	ctx := context.Background()
	i, err := workflow.Get(ctx, db.Pool, OrderWorkflowID(id))
	require.NoError(t, err)
	hist, err := workflow.History(ctx, db.Pool, OrderWorkflowID(id))
	require.NoError(t, err)
	enc, err := json.Marshal([]any{i, hist})
	require.NoError(t, err)
	require.NotContains(t, string(enc), string(tok), "the token is in the workflow")
	require.NotContains(t, string(enc), confirmation.TokenPrefix, "a token is in the workflow")
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM compute_events WHERE topic <> $1 AND payload::text LIKE '%' || $2 || '%'`,
		PaymentLinkTopic, confirmation.TokenPrefix), "a token is in an event other than the email's")
}

// TestOrderWorkflowPaidOrderIsConfirmed: a paid order's workflow holds its
// devices and mails its payment link; confirming the link sends the "paid"
// signal, and the workflow turns the hold into a booking, with the order's
// row (paid) and one confirmed event. The link confirmed again is
// ErrAlreadyConfirmed: one payment.
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
	require.False(t, o.paid)

	// The email: the order's link, for 2 devices' price, valid as long as the wait.
	tok, amount := waitMail(t, db.Pool, id)
	require.Equal(t, 2*PricePerDevice, amount)
	bs, err := confirmation.List(ctx, db.Pool, confirmation.ListOpts{WorkflowID: OrderWorkflowID(id)})
	require.NoError(t, err)
	require.Len(t, bs, 1)
	require.Equal(t, "paid", bs[0].Signal)
	require.JSONEq(t, `{"amount": 60}`, string(bs[0].Payload))
	require.Equal(t, orderT0.Add(PayWindow), bs[0].ExpiresAt.UTC(), "the link expires with the wait")
	requireNoToken(t, db, id, tok)

	// Confirmed twice (the customer clicks again): the second is refused, the
	// payment counts once.
	require.NoError(t, pay(db.Pool, tok))
	err = pay(db.Pool, tok)
	require.ErrorIs(t, err, confirmation.ErrAlreadyConfirmed)
	require.NotContains(t, err.Error(), string(tok))
	out, err := OrderWorkflow.Wait(ctx, db.Pool, OrderWorkflowID(id), 20*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, OrderResult{OrderID: id, Status: "confirmed", ReservationID: *o.reservation, Paid: 2 * PricePerDevice}, out)
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM compute_workflow_signals WHERE workflow_id = $1`, OrderWorkflowID(id)), "one payment")

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
	require.Equal(t, []confirmation.State{confirmation.Confirmed}, orderLinks(t, db.Pool, id))
	requireNoToken(t, db, id, tok)

	hist, err := workflow.History(ctx, db.Pool, OrderWorkflowID(id))
	require.NoError(t, err)
	require.Len(t, hist, 2)
	require.Equal(t, []string{"reserve", "confirm"}, []string{hist[0].Step, hist[1].Step})
	requireNothingHeld(t, db, 2)

	// The paid order is over: its link again is refused as used, and writes
	// nothing.
	var paidAt time.Time
	require.NoError(t, db.QueryRow(ctx, `SELECT paid_at FROM demo_workflow_orders WHERE id = $1`, id).Scan(&paidAt))
	require.ErrorIs(t, pay(db.Pool, tok), confirmation.ErrAlreadyConfirmed)
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM compute_workflow_signals WHERE workflow_id = $1`, OrderWorkflowID(id)))
	var again time.Time
	require.NoError(t, db.QueryRow(ctx, `SELECT paid_at FROM demo_workflow_orders WHERE id = $1`, id).Scan(&again))
	require.Equal(t, paidAt, again)
}

// TestOrderWorkflowUnpaidOrderTimesOut: an order nobody pays waits on
// compute_now(); when the sim clock passes the pay window, its link expires
// (confirming it then is ErrNotValid, even before the workflow's timeout step
// ran) and the timeout step releases the hold (before its own expiry) and
// appends the released event. Nothing was paid.
func TestOrderWorkflowUnpaidOrderTimesOut(t *testing.T) {
	t.Parallel()
	db := startOrderDemo(t)
	ctx := context.Background()
	id := placeOrder(t, db.Pool, 1)
	waitReserved(t, db.Pool, id)
	o := getOrder(t, db, id)
	require.NotNil(t, o.reservation)
	tok, _ := waitMail(t, db.Pool, id)
	// Still waiting a while later: the wall clock does not end the wait.
	time.Sleep(300 * time.Millisecond)
	i, err := workflow.Get(ctx, db.Pool, OrderWorkflowID(id))
	require.NoError(t, err)
	require.Equal(t, workflow.Waiting, i.Status)
	require.Equal(t, orderT0.Add(PayWindow), i.WakeAt.UTC())

	// Past the pay window, not yet past the hold's own expiry: the link
	// confirmed now is refused, whether or not the timeout step has run.
	_, err = db.Exec(ctx, `SELECT compute_advance_sim_clock(interval '20 seconds')`)
	require.NoError(t, err)
	err = pay(db.Pool, tok)
	require.ErrorIs(t, err, confirmation.ErrNotValid)
	require.NotContains(t, err.Error(), string(tok))
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

	require.ErrorIs(t, pay(db.Pool, tok), confirmation.ErrNotValid)
	require.False(t, getOrder(t, db, id).paid, "nothing was paid")
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM compute_workflow_signals`))
	require.Equal(t, []confirmation.State{confirmation.Expired}, orderLinks(t, db.Pool, id))
	requireNoToken(t, db, id, tok)
	requireNothingHeld(t, db, 0)
}

// TestOrderWorkflowCancelledOrderIsCompensated: cancelling a waiting order
// runs its compensation step once, which releases the hold, revokes the
// payment link and appends the cancelled event; the link confirmed in the
// cancel's wake is refused.
func TestOrderWorkflowCancelledOrderIsCompensated(t *testing.T) {
	t.Parallel()
	db := startOrderDemo(t)
	ctx := context.Background()
	id := placeOrder(t, db.Pool, 1)
	waitReserved(t, db.Pool, id)
	o := getOrder(t, db, id)
	tok, _ := waitMail(t, db.Pool, id)
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
	require.ErrorIs(t, pay(db.Pool, tok), confirmation.ErrNotValid)
	require.Equal(t, []confirmation.State{confirmation.Revoked}, orderLinks(t, db.Pool, id))
	require.False(t, getOrder(t, db, id).paid)
	requireNothingHeld(t, db, 0)
}

// TestOrderWorkflowPaidAsCancelledIsRefunded: a link confirmed in the
// transaction that cancels the order (its signal accepted, never consumed):
// the compensation sees the confirmed link, records the payment and ends the
// order cancelled with a refund.
func TestOrderWorkflowPaidAsCancelledIsRefunded(t *testing.T) {
	t.Parallel()
	db := startOrderDemo(t)
	ctx := context.Background()
	id := placeOrder(t, db.Pool, 1)
	waitReserved(t, db.Pool, id)
	o := getOrder(t, db, id)
	tok, _ := waitMail(t, db.Pool, id)
	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := confirmation.ConfirmTx(ctx, tx, string(tok)); err != nil {
			return err
		}
		return CancelOrderTx(ctx, tx, id)
	}))
	i := waitOrder(t, db.Pool, id)
	require.Equal(t, workflow.Cancelled, i.Status)
	require.Equal(t, []OrderResult{{OrderID: id, Status: "cancelled", ReservationID: *o.reservation, Reason: "cancelled by the customer", Refund: true}},
		orderEvents(t, db, "demo.order.cancelled", id))
	got := getOrder(t, db, id)
	require.Equal(t, "cancelled", got.status)
	require.True(t, got.paid, "the payment is recorded, to refund it")
	require.Equal(t, []confirmation.State{confirmation.Confirmed}, orderLinks(t, db.Pool, id))
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
	require.Empty(t, orderLinks(t, db.Pool, id), "no link for an order that held nothing")
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
// clock: orders are paid (their links confirmed from the mailbox) and
// confirmed, cancelled and compensated. No token is in the loop's log. Once the
// loop stops and the sim clock passes the pay window and the rentals, every
// order has ended with exactly one event, the loop's return ends the
// confirmed rentals, and nothing is left reserved.
func TestOrderWorkflowDemoLoop(t *testing.T) {
	t.Parallel()
	db := startOrderDemo(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	// The loop's log, every level, to look for tokens in it.
	logs := &clitest.Buffer{}
	log := zerolog.New(logs).Level(zerolog.DebugLevel)
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

	// Paid through their links: every confirmed order was paid, its link
	// confirmed, with its price; the log says so and holds no token.
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM demo_workflow_orders WHERE status = 'confirmed' AND paid_at IS NULL`))
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM demo_workflow_orders o JOIN compute_workflows w ON w.id = 'order-' || o.id
		WHERE o.status = 'confirmed' AND (w.result->>'paid')::int <> $1 * o.devices`, PricePerDevice))
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM demo_workflow_orders o WHERE o.status = 'confirmed' AND NOT EXISTS (
		SELECT 1 FROM compute_confirmations c WHERE c.workflow_id = 'order-' || o.id AND c.used_at IS NOT NULL)`))
	require.Contains(t, logs.String(), "order paid (payment link confirmed)")
	rows, err := db.Query(context.Background(), `SELECT link_token FROM demo_workflow_mailbox`)
	require.NoError(t, err)
	tokens, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.NotEmpty(t, tokens)
	for _, tok := range tokens {
		require.NotContains(t, logs.String(), tok, "a token in the demo's log")
	}
	require.NotRegexp(t, `bcc_[A-Za-z0-9_-]{43}`, logs.String(), "a token in the demo's log")

	// The rentals end: the loop's return gives their devices back.
	_, err = db.Exec(context.Background(), `SELECT compute_advance_sim_clock(interval '1 minute')`)
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
