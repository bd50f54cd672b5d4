package demo

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/bettercompute/bettercompute/cmd/better-compute/cli"
	"github.com/bettercompute/bettercompute/domain/outbox"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/outboxworker"
)

// DemoOutboxTopic is the topic of the demo's events: watch them with
//
//	curl -N 'http://127.0.0.1:8080/v1/events?topics=demo.order_placed&from=start'
const DemoOutboxTopic = "demo.order_placed"

// demoConfirmation is a row of demo_outbox_confirmations, as the demo
// dispatcher publishes it.
type demoConfirmation struct {
	ID       string `json:"id"`
	Customer string `json:"customer"`
	OrderID  int64  `json:"order_id"`
	Amount   int    `json:"amount"`
	Attempts int    `json:"attempts"`
}

// demoConfirmations is the demo's table dispatcher: it "sends" each order's
// confirmation (a log line), in order per customer, failing now and then to
// show a retry.
func newDemoConfirmations() *outboxworker.Dispatcher[demoConfirmation] {
	d, err := outboxworker.NewDispatcher(outboxworker.DispatcherOptions[demoConfirmation]{
		Name: "demo_confirmations", Table: "demo_outbox_confirmations", OrderBy: "customer", Sequence: "seq",
		Publish: func(ctx context.Context, c demoConfirmation) error {
			if rand.IntN(10) == 0 && c.Attempts == 0 {
				return fmt.Errorf("demo: the mail server is busy (order %d); retried in 2 s", c.OrderID)
			}
			if rt := workers.RuntimeFrom(ctx); rt != nil {
				log := rt.Log()
				log.Info().Str("customer", c.Customer).Int64("order", c.OrderID).Int("amount", c.Amount).
					Str("idempotency_key", c.ID).Int("attempts", c.Attempts).Msg("outbox demo dispatcher: confirmation sent")
			}
			return nil
		},
	})
	if err != nil {
		panic(err)
	}
	return d
}

// demoOutboxModule is the outbox demo: a log sink that prints every demo
// event, and the confirmations dispatcher, which the module carries into the
// registry and into its Dev loop (which notifies it after each order).
func demoOutboxModule() cli.Module { return outboxModule(newDemoConfirmations()) }

// outboxModule is the outbox demo with its confirmations dispatcher.
func outboxModule(confirmations *outboxworker.Dispatcher[demoConfirmation]) cli.Module {
	return cli.Module{
		Name:       "demo_outbox",
		Migrations: migrationsOf("demo_outbox"),
		Dev: func(ctx context.Context, db *pg.Pool, log zerolog.Logger) {
			runOutboxDemo(ctx, log, db, confirmations, 2*time.Second)
		},
		Register: func(r *workers.Registry) error {
			if err := workers.AddSink(r, workers.Sink{
				Name:   "demo_log",
				Topics: []string{DemoOutboxTopic},
				Handle: func(ctx context.Context, events []outbox.Event) error {
					log := workers.RuntimeFrom(ctx).Log()
					for _, e := range events {
						log.Info().Str("event", e.ID.String()).Str("topic", e.Topic).Str("key", e.Key).
							RawJSON("payload", e.Payload).Msg("outbox demo sink: event delivered")
					}
					return nil
				},
			}); err != nil {
				return err
			}
			return outboxworker.AddDispatcher(r, confirmations)
		},
	}
}

// runOutboxDemo places an order every interval until ctx is done: one
// transaction inserts the order, appends its event and writes its confirmation
// to the outbox table; after the commit, Notify starts a dispatcher pass.
func runOutboxDemo(ctx context.Context, log zerolog.Logger, db *pg.Pool, confirmations *outboxworker.Dispatcher[demoConfirmation], every time.Duration) {
	customers := []string{"ada", "grace", "edsger", "barbara", "ken"}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		customer, amount := customers[rand.IntN(len(customers))], 1+rand.IntN(100)
		err := pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
			var id int64
			if err := tx.QueryRow(ctx, `INSERT INTO demo_outbox_orders (customer, amount) VALUES ($1, $2) RETURNING id`, customer, amount).Scan(&id); err != nil {
				return err
			}
			if err := outbox.AppendTx(ctx, tx, outbox.Message{Topic: DemoOutboxTopic, Key: customer,
				Payload: map[string]any{"order": id, "customer": customer, "amount": amount}}); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO demo_outbox_confirmations (customer, order_id, amount) VALUES ($1, $2, $3)`, customer, id, amount)
			return err
		})
		if err == nil {
			err = confirmations.Notify(ctx, db)
		}
		if err != nil && ctx.Err() == nil {
			log.Warn().Err(err).Msg("outbox demo: placing an order failed")
		}
	}
}
