package demo

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/bettercompute/bettercompute/cmd/better-compute/cli"
	"github.com/bettercompute/bettercompute/domain/capacity"
	"github.com/bettercompute/bettercompute/domain/outbox"
	"github.com/bettercompute/bettercompute/domain/workflow"
	"github.com/bettercompute/bettercompute/domain/workflow/confirmation"
	"github.com/bettercompute/bettercompute/platform/clock"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/workers"
)

// The order workflow: an order holds devices of the demo pool, mails its
// customer a payment link (a confirmation bound to its "paid" signal, valid
// for PayWindow), waits up to PayWindow for that signal, then confirms the
// booking or releases the hold; either way it appends an event (topic
// demo.order.<status>).
//
//	reserve + link ──▶ await "paid" (PayWindow) ─┬─ link confirmed ─▶ confirm ──▶ completed (confirmed)
//	   │                                         └─ timed out ──────▶ release ──▶ completed (released)
//	   └─ sold out, 3 attempts ─▶ reject ──▶ completed (rejected)
//	CancelTx, before the end ─▶ cancel (the compensation: releases the hold) ──▶ cancelled
//
// The link's token is secret: CreateTx returns it once, in the reserve step's
// transaction, which appends it in a PaymentLinkTopic event (the email to
// send) and keeps it nowhere else: not in the workflow's state (the workflows
// page shows it), not in a log line. Every finishing step revokes the links
// still pending (settleLinks).
const (
	// OrderKind is the order workflow's kind.
	OrderKind = "demo_order"
	// PayWindow is how long an order waits for its payment: short, because dev
	// runs on the system clock.
	PayWindow = 15 * time.Second
	// HoldGrace keeps an order's hold alive past PayWindow, so the workflow's
	// own release or confirm finds it live. Should the workflow never get
	// there, the hold expires on its own (capacity's hold-expiry job).
	HoldGrace = 30 * time.Second
	// PricePerDevice is what an order costs per device: its payment link's
	// amount.
	PricePerDevice = 30
	// PaymentLinkTopic is the topic of the payment links' emails (a
	// PaymentLink each), which the demo_mailbox sink delivers to the
	// customers' inbox. Not demo.order.*: those are the orders' outcomes, one
	// per order, which the demo_order_log sink prints whole.
	PaymentLinkTopic = "demo.mail.payment_link"
	// The orders' devices: the demo's pool, charged to the shop's quota.
	orderPool   = DemoPool
	orderTenant = "shop"
	orderQuota  = 10
)

// OrderInput is what an order's workflow starts with: the order's row and
// what it books.
type OrderInput struct {
	OrderID  int64     `json:"order_id"`
	Customer string    `json:"customer"`
	Devices  int       `json:"devices"`
	Start    time.Time `json:"start"`
	End      time.Time `json:"end"`
}

// OrderState is the workflow's saved state.
type OrderState struct {
	Order         OrderInput `json:"order"`
	ReservationID int64      `json:"reservation_id,omitempty"`
}

// OrderResult is how an order ended: its workflow's result and its event's
// payload.
type OrderResult struct {
	OrderID       int64  `json:"order_id"`
	Status        string `json:"status"` // confirmed, released, rejected or cancelled
	ReservationID int64  `json:"reservation_id,omitempty"`
	Paid          int    `json:"paid,omitempty"`
	Reason        string `json:"reason,omitempty"`
	// Refund: the order was paid but not confirmed (the payment came as it
	// was cancelled, or after its hold lapsed): pay it back.
	Refund bool `json:"refund,omitempty"`
}

// Payment is the "paid" signal's payload.
type Payment struct {
	Amount int `json:"amount"`
}

// PaymentLink is a PaymentLinkTopic event's payload: the email that carries
// an order's payment link to its customer (the event's key).
type PaymentLink struct {
	OrderID int64 `json:"order_id"`
	Amount  int   `json:"amount"`
	// Token is the link's secret (confirmation.Token(Token).URL(base) is the
	// link). Log OrderID, never this.
	Token string `json:"token"`
}

// OrderWorkflow is the order workflow's definition.
var OrderWorkflow = &workflow.Workflow[OrderInput, OrderState, OrderResult]{
	Kind: OrderKind,
	Init: func(in OrderInput) (OrderState, error) { return OrderState{Order: in}, nil },
	Steps: []workflow.Step[OrderState]{
		// A sold-out pool or an exhausted quota (CONFLICT) is tried 3 times,
		// then the order is rejected.
		{Name: "reserve", Tx: reserveOrder, Retry: workflow.Retry{Attempts: 3, Backoff: time.Second}, OnError: "reject"},
		{Name: "confirm", Tx: confirmOrder},
		{Name: "release", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[OrderState]) (workflow.Next, error) {
			return releaseOrder(ctx, tx, c, "released", "not paid within "+PayWindow.String())
		}},
		{Name: "reject", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[OrderState]) (workflow.Next, error) {
			return releaseOrder(ctx, tx, c, "rejected", c.Err)
		}},
		{Name: "cancel", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[OrderState]) (workflow.Next, error) {
			return releaseOrder(ctx, tx, c, "cancelled", "cancelled by the customer")
		}},
	},
	Signals:    []string{"paid"},
	Compensate: "cancel",
}

// reserveOrder holds the order's devices, mails its customer a payment link,
// then waits for its payment. Its hold, the row's status, the link (its
// binding and the email's event) and the wait commit together, once: a
// rolled-back attempt's token never worked and was never mailed.
func reserveOrder(ctx context.Context, tx pgx.Tx, c *workflow.Call[OrderState]) (workflow.Next, error) {
	o := c.State.Order
	r, err := capacity.ReserveTx(ctx, tx, &capacity.ReserveParams{
		PoolID: orderPool, Tenant: orderTenant, Devices: o.Devices, Start: o.Start, End: o.End,
		TTL: PayWindow + HoldGrace,
	})
	if err != nil {
		return workflow.Next{}, err
	}
	c.State.ReservationID = r.ID
	_, err = tx.Exec(ctx, `UPDATE demo_workflow_orders SET status = 'reserved', reservation_id = $2, updated_at = compute_now()
		WHERE id = $1`, o.OrderID, r.ID)
	if err != nil {
		return workflow.Next{}, err
	}
	// The link expires with the wait: a link confirmed later is refused
	// (ErrNotValid), and the customer pays nothing for a released order.
	amount := PricePerDevice * o.Devices
	tok, _, err := confirmation.CreateTx(ctx, tx, OrderWorkflowID(o.OrderID), "paid",
		&confirmation.CreateOpts{Payload: Payment{Amount: amount}, TTL: PayWindow})
	if err != nil {
		return workflow.Next{}, err
	}
	// The token goes into the email's event only (string(tok): a Token
	// formats as "bcc_…"), not into c.State.
	err = outbox.AppendTx(ctx, tx, outbox.Message{Topic: PaymentLinkTopic, Key: o.Customer,
		Payload: PaymentLink{OrderID: o.OrderID, Amount: amount, Token: string(tok)}})
	if err != nil {
		return workflow.Next{}, err
	}
	return workflow.AwaitSignal("paid", PayWindow, "confirm", "release"), nil
}

// confirmOrder records the payment (the "paid" signal arrived: its link was
// confirmed) and turns the order's hold into a booking.
func confirmOrder(ctx context.Context, tx pgx.Tx, c *workflow.Call[OrderState]) (workflow.Next, error) {
	var p Payment
	if err := c.Signal.Decode(&p); err != nil {
		return workflow.Next{}, err
	}
	// paid_at before the hold is tried: an order paid after its hold lapsed
	// ends released with a refund (finishOrder).
	_, err := tx.Exec(ctx, `UPDATE demo_workflow_orders SET paid_at = coalesce(paid_at, compute_now()), updated_at = compute_now()
		WHERE id = $1`, c.State.Order.OrderID)
	if err != nil {
		return workflow.Next{}, err
	}
	_, err = capacity.ConfirmTx(ctx, tx, &capacity.ConfirmParams{ReservationID: c.State.ReservationID})
	if fault.Has(err, fault.Conflict) {
		// The hold lapsed: this step ran long after the payment came (no
		// worker ran meanwhile).
		return releaseOrder(ctx, tx, c, "released", "the hold lapsed before the payment was taken")
	}
	if err != nil {
		return workflow.Next{}, err
	}
	return finishOrder(ctx, tx, c, OrderResult{Status: "confirmed", Paid: p.Amount})
}

// releaseOrder releases the order's hold, if it has one, and ends the order
// with status.
func releaseOrder(ctx context.Context, tx pgx.Tx, c *workflow.Call[OrderState], status, reason string) (workflow.Next, error) {
	if id := c.State.ReservationID; id != 0 {
		_, err := capacity.ReleaseTx(ctx, tx, &capacity.ReleaseParams{ReservationID: id})
		if err != nil && !fault.Has(err, fault.Conflict) { // CONFLICT: it expired on its own first
			return workflow.Next{}, err
		}
	}
	return finishOrder(ctx, tx, c, OrderResult{Status: status, Reason: reason})
}

// finishOrder settles the order's payment link, writes the order's final
// status and appends its event, in the step's transaction, and finishes the
// workflow with res.
func finishOrder(ctx context.Context, tx pgx.Tx, c *workflow.Call[OrderState], res OrderResult) (workflow.Next, error) {
	o := c.State.Order
	res.OrderID, res.ReservationID = o.OrderID, c.State.ReservationID
	paidAt, err := settleLinks(ctx, tx, OrderWorkflowID(o.OrderID))
	if err != nil {
		return workflow.Next{}, err
	}
	// Refund: the order was paid (confirmOrder recorded it, or its link was
	// confirmed while the workflow was taking its timeout or its cancel, and
	// the signal stays unconsumed) but ends unconfirmed.
	err = tx.QueryRow(ctx, `UPDATE demo_workflow_orders SET status = $2, reason = nullif($3, ''),
		paid_at = coalesce(paid_at, $4), updated_at = compute_now()
		WHERE id = $1 RETURNING paid_at IS NOT NULL AND $2 <> 'confirmed'`, o.OrderID, res.Status, res.Reason, paidAt).Scan(&res.Refund)
	if err != nil {
		return workflow.Next{}, err
	}
	err = outbox.AppendTx(ctx, tx, outbox.Message{Topic: "demo.order." + res.Status, Key: o.Customer, Payload: res})
	if err != nil {
		return workflow.Next{}, err
	}
	return workflow.Finish(res), nil
}

// settleLinks revokes the workflow's pending payment links, in the finishing
// step's transaction, so that an ended order's link says "unknown, expired or
// revoked" (ErrNotValid). It returns when a link was confirmed, or nil.
//
// RevokeTx waits for a confirmation in flight (they serialize on the
// binding's row, and the confirmation's signal does not wait for this step):
// once it returns, the link is either revoked or confirmed, and a payment
// that slipped in as the order was ending is seen here and refunded.
func settleLinks(ctx context.Context, tx pgx.Tx, workflowID string) (*time.Time, error) {
	bs, err := confirmation.List(ctx, tx, confirmation.ListOpts{WorkflowID: workflowID})
	if err != nil {
		return nil, err
	}
	var paidAt *time.Time
	for _, b := range bs {
		if b.State == confirmation.Pending {
			nb, err := confirmation.RevokeTx(ctx, tx, b.ID)
			if err != nil && !errors.Is(err, confirmation.ErrAlreadyConfirmed) {
				return nil, err
			}
			b = *nb
		}
		if b.State == confirmation.Confirmed && b.UsedAt != nil && (paidAt == nil || b.UsedAt.Before(*paidAt)) {
			paidAt = b.UsedAt
		}
	}
	return paidAt, nil
}

// OrderWorkflowID is the id of order orderID's workflow.
func OrderWorkflowID(orderID int64) string { return fmt.Sprintf("order-%d", orderID) }

// PlaceOrderTx places an order in the caller's transaction: its row and its
// workflow commit together, or neither does.
func PlaceOrderTx(ctx context.Context, tx pgx.Tx, customer string, devices int, start, end time.Time) (int64, error) {
	var id int64
	err := tx.QueryRow(ctx, `INSERT INTO demo_workflow_orders (customer, devices, start_at, end_at)
		VALUES ($1, $2, $3, $4) RETURNING id`, customer, devices, start, end).Scan(&id)
	if err != nil {
		return 0, err
	}
	in := OrderInput{OrderID: id, Customer: customer, Devices: devices, Start: start, End: end}
	_, err = OrderWorkflow.StartTx(ctx, tx, in, &workflow.StartOpts{ID: OrderWorkflowID(id)})
	return id, err
}

// CancelOrderTx cancels an order's workflow in the caller's transaction: its
// compensation step (cancel) releases the hold and ends the order.
func CancelOrderTx(ctx context.Context, tx pgx.Tx, orderID int64) error {
	return workflow.CancelTx(ctx, tx, OrderWorkflowID(orderID), "cancelled by the customer")
}

// orderTopics are the topics of the orders' events.
var orderTopics = []string{"demo.order.confirmed", "demo.order.released", "demo.order.rejected", "demo.order.cancelled", "demo.order.returned"}

// workflowDemo paces the demo.
type workflowDemo struct {
	Every     time.Duration // a new order each interval
	PayWithin time.Duration // a paying customer pays within this
	Rental    time.Duration // each order books its devices from now for this long
}

var defaultWorkflowDemo = workflowDemo{Every: 2 * time.Second, PayWithin: 8 * time.Second, Rental: 20 * time.Second}

// demoWorkflowModule is the workflow demo: the order workflow, a log sink
// that prints every order's event once its transaction has committed, the
// mailbox sink that delivers the payment links' emails, and the operator's
// view of that mailbox (GET /demo/mailbox).
func demoWorkflowModule() cli.Module {
	return cli.Module{
		Name:       "demo_workflow",
		Migrations: migrationsOf("demo_workflow"),
		Dev: func(ctx context.Context, db *pg.Pool, log zerolog.Logger) {
			runWorkflowDemo(ctx, log, db, defaultWorkflowDemo)
		},
		Routes: mailboxRoutes,
		Register: func(r *workers.Registry) error {
			return errors.Join(
				workers.AddWorkflow(r, OrderWorkflow),
				workers.AddSink(r, mailboxSink()),
				workers.AddSink(r, workers.Sink{
					Name:   "demo_order_log",
					Topics: orderTopics,
					Handle: func(ctx context.Context, events []outbox.Event) error {
						log := workers.RuntimeFrom(ctx).Log()
						for _, e := range events {
							log.Info().Str("topic", e.Topic).Str("customer", e.Key).RawJSON("payload", e.Payload).
								Msg("workflow demo sink: order event delivered")
						}
						return nil
					},
				}),
			)
		},
	}
}

// ensureOrderPool creates the demo pool (ensureDemoPool) and sets the shop's
// quota in it.
func ensureOrderPool(ctx context.Context, db *pg.Pool) error {
	if err := ensureDemoPool(ctx, db); err != nil {
		return err
	}
	err := capacity.SetQuota(ctx, db, &capacity.SetQuotaParams{Tenant: orderTenant, PoolID: orderPool, Limit: orderQuota})
	if fault.Has(err, fault.Conflict) {
		return nil // the shop holds more than that now: the quota stays as it is
	}
	return err
}

// orderAction is what a customer does to an order later: pay or cancel it.
type orderAction struct {
	at     time.Time
	order  int64
	cancel bool
	late   bool // a payment after the pay window: refused
}

// runWorkflowDemo plays the shop until ctx is done. Every cfg.Every a customer
// places an order (its row and its workflow in one transaction) for 1 or 2
// devices over the next cfg.Rental; most orders are paid within cfg.PayWithin
// (the customer confirms the payment link from its mailbox, as the public
// page's Confirm button does: confirmation.Confirm stores the "paid" signal),
// some are paid too late (the link has expired with the wait: ErrNotValid),
// some are cancelled (the workflow's compensation releases the hold), and
// some are never paid (the await times out after PayWindow and the hold is
// released). When a confirmed
// order's rental is over, the loop returns its devices.
func runWorkflowDemo(ctx context.Context, log zerolog.Logger, db *pg.Pool, cfg workflowDemo) {
	if err := ensureOrderPool(ctx, db); err != nil {
		if ctx.Err() == nil {
			log.Warn().Err(err).Msg("workflow demo: cannot create the demo pool; the demo does not run")
		}
		return
	}
	place := time.NewTicker(cfg.Every)
	defer place.Stop()
	tick := time.NewTicker(max(cfg.Every/4, 10*time.Millisecond))
	defer tick.Stop()
	var pending []orderAction
	for {
		select {
		case <-ctx.Done():
			return
		case <-place.C:
			if a, err := placeDemoOrder(ctx, log, db, cfg); err != nil {
				if ctx.Err() == nil {
					log.Warn().Err(err).Msg("workflow demo: placing an order failed")
				}
			} else if a != nil {
				pending = append(pending, *a)
			}
		case <-tick.C:
			now, rest := time.Now(), pending[:0]
			for _, a := range pending {
				if now.Before(a.at) {
					rest = append(rest, a)
					continue
				}
				err := a.run(ctx, log, db)
				if errors.Is(err, errNoMail) && now.Before(a.at.Add(PayWindow+HoldGrace)) {
					rest = append(rest, a) // the mail is on its way: look again at the next tick
					continue
				}
				if err != nil && ctx.Err() == nil {
					log.Warn().Err(err).Int64("order", a.order).Msg("workflow demo: a customer's action failed")
				}
			}
			pending = rest
			if err := returnRentals(ctx, log, db); err != nil && ctx.Err() == nil {
				log.Warn().Err(err).Msg("workflow demo: returning rentals failed")
			}
		}
	}
}

// placeDemoOrder places an order and decides what its customer does next.
func placeDemoOrder(ctx context.Context, log zerolog.Logger, db *pg.Pool, cfg workflowDemo) (*orderAction, error) {
	customers := []string{"ada", "grace", "edsger", "barbara", "ken"}
	customer, devices := customers[rand.IntN(len(customers))], 1
	if rand.IntN(5) == 0 {
		devices = 2
	}
	var id int64
	// The application's request (traced with dev --trace: its trace goes on
	// through the workflow's steps to the delivery of the event they append).
	ctx, span := cli.TracerProvider(ctx).Tracer("demo").Start(ctx, "demo.place_order")
	defer span.End()
	err := pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		now, err := clock.Now(ctx, tx)
		if err != nil {
			return err
		}
		start := now.Truncate(time.Second)
		id, err = PlaceOrderTx(ctx, tx, customer, devices, start, start.Add(cfg.Rental))
		return err
	})
	if err != nil {
		return nil, err
	}
	a := &orderAction{order: id}
	plan := ""
	switch n := rand.IntN(20); {
	case n < 14:
		a.at = time.Now().Add(cfg.PayWithin/10 + rand.N(cfg.PayWithin))
		plan = "pays in " + time.Until(a.at).Round(100*time.Millisecond).String()
	case n < 16:
		a.at, a.late = time.Now().Add(PayWindow+3*time.Second), true
		plan = "pays too late, in " + time.Until(a.at).Round(time.Second).String()
	case n < 18:
		a.at, a.cancel = time.Now().Add(rand.N(cfg.PayWithin)), true
		plan = "cancels in " + time.Until(a.at).Round(100*time.Millisecond).String()
	default:
		a, plan = nil, "never pays: times out in "+PayWindow.String()
	}
	log.Info().Int64("order", id).Str("workflow_id", OrderWorkflowID(id)).Str("customer", customer).Int("devices", devices).
		Str("plan", plan).Msg("workflow demo: order placed")
	return a, nil
}

// run cancels the order, or pays it by confirming the payment link found in
// its customer's mailbox (errNoMail when it has not arrived yet). It logs the
// order, never the link.
func (a orderAction) run(ctx context.Context, log zerolog.Logger, db *pg.Pool) error {
	ctx, span := cli.TracerProvider(ctx).Tracer("demo").Start(ctx, "demo.pay_or_cancel_order")
	defer span.End()
	ev := log.Info().Int64("order", a.order).Str("workflow_id", OrderWorkflowID(a.order))
	if a.cancel {
		err := pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
			return CancelOrderTx(ctx, tx, a.order)
		})
		switch {
		case fault.Has(err, fault.Conflict):
			ev.Err(err).Msg("workflow demo: too late to cancel: the order has ended")
		case err != nil:
			return err
		default:
			ev.Msg("workflow demo: the customer cancelled the order")
		}
		return nil
	}
	tok, amount, err := readMail(ctx, db, a.order)
	if err != nil {
		return err
	}
	_, err = confirmation.Confirm(ctx, db, string(tok))
	switch {
	case errors.Is(err, confirmation.ErrAlreadyConfirmed):
		ev.Int("amount", amount).Msg("workflow demo: the link was confirmed before: paid once")
	case errors.Is(err, confirmation.ErrNotValid), fault.Has(err, fault.Conflict):
		// The link expired with the order's wait, or the order has ended
		// (its link revoked, or its workflow finishing): nothing was paid.
		ev.Err(err).Int("amount", amount).Bool("late", a.late).Msg("workflow demo: payment refused, the order has ended")
	case err != nil:
		return err
	default:
		ev.Int("amount", amount).Bool("late", a.late).Msg("workflow demo: order paid (payment link confirmed)")
	}
	return nil
}

// returnRentals ends the confirmed orders whose rental is over: their devices
// go back to the pool, in one transaction with the order's new status and its
// event.
func returnRentals(ctx context.Context, log zerolog.Logger, db *pg.Pool) error {
	type rental struct {
		id, reservation int64
		customer        string
	}
	var done []rental
	err := pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT id, reservation_id, customer FROM demo_workflow_orders
			WHERE status = 'confirmed' AND end_at <= compute_now() ORDER BY id LIMIT 20 FOR UPDATE SKIP LOCKED`)
		if err != nil {
			return err
		}
		done, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (rental, error) {
			var r rental
			return r, row.Scan(&r.id, &r.reservation, &r.customer)
		})
		if err != nil {
			return err
		}
		for _, r := range done {
			_, err := capacity.ReleaseTx(ctx, tx, &capacity.ReleaseParams{ReservationID: r.reservation})
			if err != nil && !fault.Has(err, fault.Conflict) {
				return err
			}
			if _, err := tx.Exec(ctx, `UPDATE demo_workflow_orders SET status = 'returned', updated_at = compute_now() WHERE id = $1`, r.id); err != nil {
				return err
			}
			err = outbox.AppendTx(ctx, tx, outbox.Message{Topic: "demo.order.returned", Key: r.customer,
				Payload: map[string]any{"order_id": r.id, "status": "returned", "reservation_id": r.reservation}})
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil && len(done) > 0 {
		log.Debug().Int("orders", len(done)).Msg("workflow demo: rentals over, devices returned")
	}
	return err
}
