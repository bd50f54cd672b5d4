package outboxworker_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/domain/outbox"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/outboxworker"
)

// A sink receives every event of its topics, in order, at least once: the
// receiver drops a repeat by the event's ID.
func ExampleAddSink() {
	reg := workers.NewRegistry() // in an application: a cli.Module's Register
	err := outboxworker.AddSink(reg, outboxworker.Sink{
		Name:   "billing",
		Topics: []string{"usage.recorded"},
		Handle: func(ctx context.Context, events []outboxworker.Event) error {
			for _, e := range events {
				// e.ID (TXID:SEQ) is the idempotency key.
				fmt.Println(e.ID, e.Topic, e.Key, string(e.Payload))
			}
			return nil
		},
	})
	if err != nil {
		panic(err)
	}
}

// Append writes events in the transaction that changes the state they report.
func ExampleAddSink_append() {
	ctx := context.Background()
	var db *pg.Pool // the application's pool
	if db == nil {
		return
	}
	err := pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE accounts SET used = used + 1 WHERE id = $1`, "acct-1"); err != nil {
			return err
		}
		return outbox.AppendTx(ctx, tx, outbox.Message{Topic: "usage.recorded", Key: "acct-1", Payload: map[string]int{"units": 1}})
	})
	if err != nil {
		panic(err)
	}
}

// StockReport is a row of the application's outbox table
// (testdata/outbox/stock_reports.sql), decoded from its JSON.
type StockReport struct {
	ID       string `json:"id"`
	Attempts int    `json:"attempts"`
	ItemID   string `json:"item_id"`
	Delta    int    `json:"delta"`
}

// A table dispatcher publishes an application's outbox table in order per
// key; the row's id is the receiver's idempotency key.
func ExampleNewDispatcher() {
	stockReports, err := outboxworker.NewDispatcher(outboxworker.DispatcherOptions[StockReport]{
		Name:              "inventory:stock-reports",
		Table:             "inventory.stock_reports",
		OrderBy:           "item_id",
		Sequence:          "seq",
		ReconcileInterval: 10 * time.Second,
		Publish: func(ctx context.Context, r StockReport) error {
			body := fmt.Sprintf(`{"itemId":%q,"delta":%d}`, r.ItemID, r.Delta)
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://erp.example.com/stock-movements", strings.NewReader(body))
			if err != nil {
				return err
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", r.ID)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return err
			}
			resp.Body.Close()
			// Retry what may succeed later; any other answer is final.
			if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500 {
				return fmt.Errorf("ERP answered %d", resp.StatusCode)
			}
			return nil
		},
	})
	if err != nil {
		panic(err)
	}
	reg := workers.NewRegistry() // in an application: a cli.Module's Register
	if err := outboxworker.AddDispatcher(reg, stockReports); err != nil {
		panic(err)
	}

	// Writing: lock the item, then insert the report, in one transaction; the
	// Notify in it starts a pass as soon as it commits.
	ctx := context.Background()
	var db *pg.Pool // the application's pool
	if db == nil {
		return
	}
	_ = pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE inventory.items SET quantity = quantity + $2 WHERE id = $1`, "…", 5)
		if err != nil || tag.RowsAffected() == 0 {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO inventory.stock_reports (item_id, delta) VALUES ($1, $2)`, "…", 5); err != nil {
			return err
		}
		return stockReports.Notify(ctx, tx)
	})
}
