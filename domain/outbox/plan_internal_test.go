package outbox

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

// TestClaimPlanWalksTheIndexes: whatever the statistics say (here: analyzed
// while empty, then filled), the claim walks the sequence index in order and
// probes the partial index once per candidate, so it stops at the batch size:
// no sequential scan, no sort, no hash of the whole table.
func TestClaimPlanWalksTheIndexes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	b, err := os.ReadFile("../../testdata/outbox/stock_reports.sql")
	require.NoError(t, err)
	db.MustExec(t, string(b))
	db.MustExec(t, `ANALYZE inventory.stock_reports`)
	db.MustExec(t, `INSERT INTO inventory.stock_reports (item_id, delta)
SELECT ('00000000-0000-0000-0000-' || lpad((g % 100)::text, 12, '0'))::uuid, 1 FROM generate_series(1, 20000) g`)
	c, err := Compile(Table{Table: "inventory.stock_reports", OrderBy: "item_id", Sequence: "seq"})
	require.NoError(t, err)

	var plan []string
	require.ErrorIs(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, claimSettings, "1000", "1000"); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, COSTS OFF) "+c.claimSQL, c.args(c.t.BatchSize, 30.0)...)
		if err != nil {
			return err
		}
		plan, err = pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		return errRollback
	}), errRollback)
	text := strings.Join(plan, "\n")
	t.Log(text)
	require.Contains(t, text, "Index Scan using stock_reports_pkey")
	require.Contains(t, text, "inventory_stock_reports_busy")
	require.NotContains(t, text, "Seq Scan")
	require.NotContains(t, text, "Sort")
	require.NotContains(t, text, "Hash")
	require.Contains(t, text, "rows=100 loops=1", "the candidate scan stops at the batch")
}

var errRollback = &rollback{}

type rollback struct{}

func (*rollback) Error() string { return "rollback" }
