package outboxworker_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/bettercompute/bettercompute/domain/outbox"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/outboxworker"
)

// The outbox module runs the sinks an application adds with workers.AddSink.
// cli.App registers it with the defaults; an application that sets options
// calls Register again from its module's Register. A sink receives every event
// of its topics, in order, at least once: the receiver drops a repeat by the
// event's ID.
func ExampleRegister() {
	delivered := make(chan struct{})
	var once sync.Once

	reg := workers.NewRegistry() // in an application: a cli.Module's Register
	err := errors.Join(
		outboxworker.Register(reg, &outboxworker.Options{PollEvery: 20 * time.Millisecond}),
		workers.AddSink(reg, workers.Sink{
			Name:   "billing",
			Topics: []string{"usage.recorded"},
			Handle: func(ctx context.Context, events []outbox.Event) error {
				for _, e := range events {
					// e.ID (TXID:SEQ) is the idempotency key.
					fmt.Println(e.Topic, e.Key, string(e.Payload))
				}
				once.Do(func() { close(delivered) })
				return nil
			},
		}),
	)
	if err != nil {
		panic(err)
	}

	// Here: a worker runs the sink, and an application appends an event.
	db := exampleDB()
	defer exampleWorker(db, reg)()
	err = pg.InTx(context.Background(), db, func(ctx context.Context, tx pgx.Tx) error {
		return outbox.AppendTx(ctx, tx, outbox.Message{Topic: "usage.recorded", Key: "acct-1", Payload: map[string]int{"units": 1}})
	})
	if err != nil {
		panic(err)
	}
	exampleWait(delivered, "the sink's delivery")
	// Output: usage.recorded acct-1 {"units": 1}
}

// Append writes events in the transaction that changes the state they report.
func ExampleAddSink_append() {
	ctx := context.Background()
	db := exampleDB() // the application's pool; it has table accounts
	err := pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE accounts SET used = used + 1 WHERE id = $1`, "acct-1"); err != nil {
			return err
		}
		return outbox.AppendTx(ctx, tx, outbox.Message{Topic: "usage.recorded", Key: "acct-1", Payload: map[string]int{"units": 1}})
	})
	if err != nil {
		panic(err)
	}

	// Both committed, or neither: the account and the log (compute_events).
	var used int
	var topic, key, payload string
	if err := db.QueryRow(ctx, `SELECT used FROM accounts WHERE id = 'acct-1'`).Scan(&used); err != nil {
		panic(err)
	}
	if err := db.QueryRow(ctx, `SELECT topic, key, payload::text FROM compute_events`).Scan(&topic, &key, &payload); err != nil {
		panic(err)
	}
	fmt.Println(used, topic, key, payload)
	// Output: 1 usage.recorded acct-1 {"units": 1}
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
	erpURL := exampleERP() // the receiver's address; here a server that prints what it receives

	stockReports, err := outboxworker.NewDispatcher(outboxworker.DispatcherOptions[StockReport]{
		Name:              "inventory:stock-reports",
		Table:             "inventory.stock_reports",
		OrderBy:           "item_id",
		Sequence:          "seq",
		ReconcileInterval: 10 * time.Second,
		Publish: func(ctx context.Context, r StockReport) error {
			body := fmt.Sprintf(`{"itemId":%q,"delta":%d}`, r.ItemID, r.Delta)
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, erpURL+"/stock-movements", strings.NewReader(body))
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
	db := exampleDB() // the application's pool; it has the tables of stock_reports.sql
	defer exampleWorker(db, reg)()
	item := "00000000-0000-0000-0000-000000000001"
	err = pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE inventory.items SET quantity = quantity + $2 WHERE id = $1`, item, 5)
		if err != nil || tag.RowsAffected() == 0 {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO inventory.stock_reports (item_id, delta) VALUES ($1, $2)`, item, 5); err != nil {
			return err
		}
		return stockReports.Notify(ctx, tx)
	})
	if err != nil {
		panic(err)
	}
	exampleWait(erpReceived, "the ERP's request")
	// Output: POST /stock-movements {"itemId":"00000000-0000-0000-0000-000000000001","delta":5}
}

// exampleDB returns a test database with an application's tables: accounts
// (acct-1), and inventory.items (one item) with its outbox table
// inventory.stock_reports.
func exampleDB() *pg.Pool {
	db := pgtest.ForExample().Pool
	ctx := context.Background()
	stockReports, err := os.ReadFile("../../testdata/outbox/stock_reports.sql")
	if err != nil {
		panic(err)
	}
	for _, sql := range []string{
		string(stockReports),
		`INSERT INTO inventory.items (id) VALUES ('00000000-0000-0000-0000-000000000001')`,
		`CREATE TABLE accounts (id text PRIMARY KEY, used int NOT NULL DEFAULT 0)`,
		`INSERT INTO accounts (id) VALUES ('acct-1')`,
	} {
		if _, err := db.Exec(ctx, sql); err != nil {
			panic(err)
		}
	}
	return db
}

// exampleWorker starts a worker runtime on every shard of db, as better-compute
// worker does, and returns its stop.
func exampleWorker(db *pg.Pool, reg *workers.Registry) (stop func()) {
	ctx := context.Background()
	rt, err := workers.Start(ctx, workers.Options{
		Pool: db, Registry: reg, Work: true, Log: zerolog.Nop(),
		Shards:       []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, // pgtest.DefaultShardCount
		PollInterval: 50 * time.Millisecond,
	})
	if err != nil {
		panic(err)
	}
	return func() {
		if err := rt.Stop(ctx); err != nil {
			panic(err)
		}
	}
}

// exampleWait waits for done, a minute at most; it prints a timeout, so that
// the example fails on its output (and the test binary cleans up).
func exampleWait(done <-chan struct{}, what string) {
	select {
	case <-done:
	case <-time.After(time.Minute):
		fmt.Println("timed out waiting for", what)
	}
}

// erpReceived is closed when exampleERP's server has received a request.
var erpReceived = make(chan struct{})

// exampleERP starts a server that prints each request it receives and answers
// 200, and returns its URL.
func exampleERP() string {
	var once sync.Once
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.Header.Get("Idempotency-Key") == "" {
			http.Error(w, "no Idempotency-Key", http.StatusBadRequest)
			return
		}
		once.Do(func() {
			fmt.Println(r.Method, r.URL.Path, string(body))
			close(erpReceived)
		})
	}))
	return srv.URL
}
