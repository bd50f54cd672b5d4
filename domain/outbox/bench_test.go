package outbox_test

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/outbox"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

// BenchmarkAppend: the cost of appending one event inside a caller's
// transaction. The peer is the same transaction (one UPDATE) without it, on the
// same pool and rows, in the same loop; each iteration runs both, in turn first
// (a row updated twice in a row is not always the cheaper one), and the
// medians are compared. The floor is the same transaction plus one empty
// statement (SELECT 1): an Append is one more round trip, so no Append can cost
// less than that.
//
//	go test ./domain/outbox -run '^$' -bench BenchmarkAppend -benchtime 1000x
func BenchmarkAppend(b *testing.B) {
	ctx := context.Background()
	db := pgtest.New(b)
	db.MustExec(b, `CREATE TABLE bench_items (id int PRIMARY KEY, n bigint NOT NULL DEFAULT 0)`)
	db.MustExec(b, `INSERT INTO bench_items (id) SELECT g FROM generate_series(1, 100) g`)
	payload := map[string]any{"item": 42, "delta": 1, "note": "a typical small payload"}
	const (
		peerTx = iota
		appendTx
		floorTx
	)
	tx := func(i, kind int) time.Duration {
		start := time.Now()
		err := pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `UPDATE bench_items SET n = n + 1 WHERE id = $1`, 1+i%100); err != nil {
				return err
			}
			switch kind {
			case appendTx:
				return outbox.AppendTx(ctx, tx, outbox.Message{Topic: "item.changed", Key: "item-42", Payload: payload})
			case floorTx:
				_, err := tx.Exec(ctx, `SELECT 1`)
				return err
			}
			return nil
		})
		require.NoError(b, err)
		return time.Since(start)
	}
	// Warm every connection the loop may use (the first call on a connection
	// plans the procedure), outside the measurement.
	for i := range 20 {
		tx(i, appendTx)
	}
	var took [3][]time.Duration
	orders := [][3]int{{peerTx, appendTx, floorTx}, {appendTx, floorTx, peerTx}, {floorTx, peerTx, appendTx}}
	i := 0
	for b.Loop() {
		for _, kind := range orders[i%len(orders)] {
			took[kind] = append(took[kind], tx(i, kind))
		}
		i++
	}
	p, w, f := median(took[peerTx]), median(took[appendTx]), median(took[floorTx])
	b.ReportMetric(float64(p.Microseconds()), "peer-µs/tx")
	b.ReportMetric(float64(w.Microseconds()), "append-µs/tx")
	b.ReportMetric(float64(w-p)/float64(time.Microsecond), "extra-µs")
	b.ReportMetric(float64(w)/float64(p), "ratio")
	b.ReportMetric(float64(f)/float64(p), "floor-ratio")
}

func median(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// BenchmarkClaim: one claim (batch 100) from an outbox table with 1,000
// pending rows and from one with 1,000,000, both analyzed while empty (the
// statistics say "no rows"), in the same run. The claim must stay proportional
// to its batch: ratio (1M / 1k) at most 1.5. Each claim's rows are released, so
// every claim sees the same table.
//
//	go test ./domain/outbox -run '^$' -bench BenchmarkClaim -benchtime 200x
func BenchmarkClaim(b *testing.B) {
	ctx := context.Background()
	db := pgtest.New(b, pgtest.Options{StatementTimeout: 5 * time.Minute})
	loadStockReports(b, db)
	db.MustExec(b, `CREATE TABLE inventory.stock_reports_big (LIKE inventory.stock_reports INCLUDING ALL)`)
	db.MustExec(b, `ANALYZE inventory.stock_reports`)
	db.MustExec(b, `ANALYZE inventory.stock_reports_big`)
	fill := `INSERT INTO %s (item_id, delta)
SELECT ('00000000-0000-0000-0000-' || lpad((g %% 1000)::text, 12, '0'))::uuid, 1 FROM generate_series(1, %d) g`
	db.MustExec(b, sprintf(fill, "inventory.stock_reports", 1000))
	start := time.Now()
	db.MustExec(b, sprintf(fill, "inventory.stock_reports_big", 1000000))
	b.Logf("1,000,000 rows inserted in %s", time.Since(start).Round(time.Millisecond))

	small, err := outbox.Compile(outbox.Table{Table: "inventory.stock_reports", OrderBy: "item_id", Sequence: "seq"})
	require.NoError(b, err)
	big, err := outbox.Compile(outbox.Table{Table: "inventory.stock_reports_big", OrderBy: "item_id", Sequence: "seq"})
	require.NoError(b, err)
	claim := func(c *outbox.Compiled) time.Duration {
		t0 := time.Now()
		batch, err := c.Claim(ctx, db.Pool)
		took := time.Since(t0)
		require.NoError(b, err)
		require.Len(b, batch.Rows, 100)
		released := make([]int64, len(batch.Rows))
		for i, r := range batch.Rows {
			released[i] = r.Seq
		}
		require.NoError(b, c.Finish(ctx, db.Pool, batch, outbox.Outcome{Released: released}))
		return took
	}
	var ts, tb []time.Duration
	for b.Loop() {
		ts = append(ts, claim(small))
		tb = append(tb, claim(big))
	}
	s, l := median(ts), median(tb)
	b.ReportMetric(float64(s.Microseconds()), "claim-1k-µs")
	b.ReportMetric(float64(l.Microseconds()), "claim-1M-µs")
	b.ReportMetric(float64(l)/float64(s), "ratio")
}
