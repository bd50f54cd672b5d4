package outbox_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/outbox"
	"github.com/bettercompute/bettercompute/platform/clock"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

func TestTableNamesAreValidated(t *testing.T) {
	t.Parallel()
	ok := outbox.Table{Table: "inventory.stock_reports", OrderBy: "item_id", Sequence: "seq", Where: map[string]any{"tenant": 1}}
	require.NoError(t, ok.Validate())
	for _, tc := range []struct {
		mut  func(*outbox.Table)
		want string
	}{
		{func(t *outbox.Table) { t.Table = "Stock" }, `invalid outbox table "Stock"`},
		{func(t *outbox.Table) { t.Table = "a.b.c" }, `invalid outbox table "a.b.c"`},
		{func(t *outbox.Table) { t.Table = "t; DROP TABLE x" }, `invalid outbox table "t; DROP TABLE x"`},
		{func(t *outbox.Table) { t.Table = `"t"` }, `invalid outbox table "\"t\""`},
		{func(t *outbox.Table) { t.Table = "" }, `invalid outbox table ""`},
		{func(t *outbox.Table) { t.OrderBy = "item id" }, `invalid outbox orderBy column "item id"`},
		{func(t *outbox.Table) { t.Sequence = "1seq" }, `invalid outbox sequence column "1seq"`},
		{func(t *outbox.Table) { t.Where = map[string]any{"x = 1 OR true --": 1} }, `invalid outbox where column "x = 1 OR true --"`},
		{func(t *outbox.Table) { t.OrderBy = strings.Repeat("a", 64) }, `invalid outbox orderBy column`},
	} {
		tbl := ok
		tc.mut(&tbl)
		_, err := outbox.Compile(tbl)
		require.True(t, fault.Has(err, fault.InvalidConfig), "%v", err)
		require.ErrorContains(t, err, tc.want)
	}
}

func TestBackoffAndTruncation(t *testing.T) {
	t.Parallel()
	var got []time.Duration
	for a := 1; a <= 10; a++ {
		got = append(got, outbox.Backoff(a))
	}
	s := time.Second
	require.Equal(t, []time.Duration{2 * s, 4 * s, 8 * s, 16 * s, 32 * s, 64 * s, 128 * s, 256 * s, 256 * s, 256 * s}, got)

	long := strings.Repeat("é", 1500)
	require.Equal(t, strings.Repeat("é", 1000), outbox.TruncateError(long), "characters, not bytes")
	require.Equal(t, "ab\uFFFDc", outbox.TruncateError("a\x00b\xffc"), "valid UTF-8 without NUL")
}

// loadStockReports creates the example table of testdata/outbox.
func loadStockReports(t testing.TB, db *pgtest.DB) {
	t.Helper()
	b, err := os.ReadFile("../../testdata/outbox/stock_reports.sql")
	require.NoError(t, err)
	db.MustExec(t, string(b))
}

func seqs(b *outbox.Batch) []int64 {
	out := make([]int64, len(b.Rows))
	for i, r := range b.Rows {
		out[i] = r.Seq
	}
	return out
}

// TestClaimHoldsBackBusyKeys: a claim takes due rows in sequence order, and no
// row whose key has an earlier row claimed or waiting for its retry; finishing
// touches only rows the batch still owns.
func TestClaimHoldsBackBusyKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	loadStockReports(t, db)
	require.NoError(t, clock.UseSim(ctx, db.Pool, time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)))
	k1, k2, k3 := "00000000-0000-0000-0000-000000000001", "00000000-0000-0000-0000-000000000002", "00000000-0000-0000-0000-000000000003"
	for _, k := range []string{k1, k1, k2, k3} {
		db.MustExec(t, `INSERT INTO inventory.stock_reports (item_id, delta) VALUES ($1, 1)`, k)
	}
	c, err := outbox.Compile(outbox.Table{Table: "inventory.stock_reports", OrderBy: "item_id", Sequence: "seq", ClaimTimeout: 30 * time.Second})
	require.NoError(t, err)

	b, err := c.Claim(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, []int64{1, 2, 3, 4}, seqs(b))
	require.Equal(t, k1, b.Rows[0].Key)
	require.Contains(t, string(b.Rows[0].Row), `"delta": 1`)
	// Everything is claimed: another claim finds nothing.
	b2, err := c.Claim(ctx, db.Pool)
	require.NoError(t, err)
	require.Empty(t, b2.Rows)

	require.NoError(t, c.Finish(ctx, db.Pool, b, outbox.Outcome{
		Failed: []outbox.Failure{{Seq: 1, Err: "down"}}, Released: []int64{2, 4}, Published: []int64{3}}))
	require.Equal(t, 3, db.MustCount(t, `SELECT count(*) FROM inventory.stock_reports`))
	require.Equal(t, 2, db.MustCount(t, `SELECT extract(epoch FROM next_attempt_at - compute_now())::int FROM inventory.stock_reports WHERE seq = 1`))

	// Row 1 waits for its retry, so row 2 (same key) waits too; row 4 goes.
	b, err = c.Claim(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, []int64{4}, seqs(b))

	// At the retry, row 1 and then row 2 go, in order.
	_, err = clock.Advance(ctx, db.Pool, 2*time.Second)
	require.NoError(t, err)
	b3, err := c.Claim(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, []int64{1, 2}, seqs(b3))
	require.Equal(t, 1, b3.Rows[0].Attempts)

	// Batch b (row 4) outlives its claim: another claim takes row 4, and b's
	// end no longer touches it.
	_, err = clock.Advance(ctx, db.Pool, 31*time.Second)
	require.NoError(t, err)
	b4, err := c.Claim(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, []int64{1, 2, 4}, seqs(b4))
	require.NoError(t, c.Finish(ctx, db.Pool, b, outbox.Outcome{Published: []int64{4}}))
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM inventory.stock_reports WHERE seq = 4`), "b4 owns row 4 now")
	require.NoError(t, c.Finish(ctx, db.Pool, b4, outbox.Outcome{Published: []int64{1, 2, 4}}))
	require.Equal(t, 0, db.MustCount(t, `SELECT count(*) FROM inventory.stock_reports`))
}

// TestClaimWhere: a dispatcher with Where sees only its rows, and claims of
// different Where values do not wait for each other.
func TestClaimWhere(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	db.MustExec(t, `CREATE TABLE public.outbox (
    tenant int NOT NULL, seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, id text NOT NULL DEFAULT gen_random_uuid()::text,
    "order" text NOT NULL, attempts int NOT NULL DEFAULT 0, next_attempt_at timestamptz NOT NULL DEFAULT compute_now(),
    claimed_until timestamptz, last_error text)`)
	db.MustExec(t, `INSERT INTO outbox (tenant, "order") VALUES (1, 'a'), (2, 'a'), (1, 'b')`)
	// "order" is a reserved word: identifiers are quoted once validated.
	c1, err := outbox.Compile(outbox.Table{Table: "outbox", OrderBy: "order", Sequence: "seq", Where: map[string]any{"tenant": 1}})
	require.NoError(t, err)
	c2, err := outbox.Compile(outbox.Table{Table: "outbox", OrderBy: "order", Sequence: "seq", Where: map[string]any{"tenant": 2}})
	require.NoError(t, err)
	b1, err := c1.Claim(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, []int64{1, 3}, seqs(b1))
	b2, err := c2.Claim(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, []int64{2}, seqs(b2), "tenant 2's key a is not held back by tenant 1's")
}

// TestStalledClaimGivesUpItsTurn: claims of one table take turns; a claim that
// stalls (here on a row an application transaction holds) is cancelled after
// the claim timeout, and the next claim gets its turn.
func TestStalledClaimGivesUpItsTurn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	loadStockReports(t, db)
	db.MustExec(t, `INSERT INTO inventory.stock_reports (item_id, delta) SELECT gen_random_uuid(), 1 FROM generate_series(1, 2)`)
	c, err := outbox.Compile(outbox.Table{Table: "inventory.stock_reports", OrderBy: "item_id", Sequence: "seq", ClaimTimeout: time.Second})
	require.NoError(t, err)

	app, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer app.Rollback(ctx) //nolint:errcheck
	_, err = app.Exec(ctx, `SELECT 1 FROM inventory.stock_reports WHERE seq = 1 FOR UPDATE`)
	require.NoError(t, err)

	waiting := func(event string) func() bool {
		return func() bool {
			return db.MustCount(t, `SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock' AND wait_event = $1`, event) == 1
		}
	}
	errA := make(chan error, 1)
	go func() { _, err := c.Claim(ctx, db.Pool); errA <- err }()
	waitFor(t, "claim A stalls on the row", waiting("transactionid"))
	type result struct {
		b   *outbox.Batch
		err error
	}
	resB := make(chan result, 1)
	go func() { b, err := c.Claim(ctx, db.Pool); resB <- result{b, err} }()
	waitFor(t, "claim B waits for its turn", waiting("advisory"))

	select {
	case err := <-errA:
		require.Error(t, err, "the stalled claim gives up")
	case <-time.After(20 * time.Second):
		t.Fatal("the stalled claim kept its turn")
	}
	require.NoError(t, app.Rollback(ctx))
	r := <-resB
	require.NoError(t, r.err)
	require.Equal(t, []int64{1, 2}, seqs(r.b), "B took its turn and both rows")
}

func sprintf(format string, args ...any) string { return fmt.Sprintf(format, args...) }
