package pg_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

// BenchmarkTx compares the transaction helper (BEGIN and SET LOCAL
// statement_timeout in one round trip, one SELECT, COMMIT) with a raw pgx
// transaction without the timeout (BEGIN, the same SELECT, COMMIT) on the same
// pool, in the same run. It reports each one's ns/op and helper/raw; the aim is
// 1.10 or less.
func BenchmarkTx(b *testing.B) {
	ctx := context.Background()
	db := pgtest.New(b, pgtest.Options{Empty: true, MaxConns: 1})

	helper := func() {
		err := pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
			var n int
			return tx.QueryRow(ctx, "SELECT $1::int", 1).Scan(&n)
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	raw := func() {
		tx, err := db.Pool.Pool.BeginTx(ctx, pgx.TxOptions{})
		if err != nil {
			b.Fatal(err)
		}
		var n int
		if err := tx.QueryRow(ctx, "SELECT $1::int", 1).Scan(&n); err != nil {
			b.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			b.Fatal(err)
		}
	}
	// Warm the connection, then interleave the two in small rounds so that any
	// drift of the machine hits both alike.
	for range 50 {
		helper()
		raw()
	}
	const round = 16
	var helperTime, rawTime time.Duration
	var helperN, rawN int
	b.ResetTimer()
	for i := 0; i < b.N; {
		n := min(round, b.N-i)
		t0 := time.Now()
		for range n {
			helper()
		}
		t1 := time.Now()
		for range n {
			raw()
		}
		t2 := time.Now()
		helperTime += t1.Sub(t0)
		rawTime += t2.Sub(t1)
		helperN += n
		rawN += n
		i += n
	}
	b.StopTimer()
	h := float64(helperTime.Nanoseconds()) / float64(helperN)
	r := float64(rawTime.Nanoseconds()) / float64(rawN)
	b.ReportMetric(h, "helper-ns/tx")
	b.ReportMetric(r, "raw-ns/tx")
	b.ReportMetric(h/r, "helper/raw")
}
