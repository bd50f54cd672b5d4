package outbox

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

// TestPrunePlanIsBoundedByTheBatch: behind a long log (analyzed while empty,
// then filled, so the statistics are wrong), one Prune walks the head of the
// primary key to its batch and deletes exactly those rows by their ctid, so its
// cost is the batch: the log is never scanned, hashed or sorted.
func TestPrunePlanIsBoundedByTheBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	db.MustExec(t, `ANALYZE compute_events`)
	db.MustExec(t, `INSERT INTO compute_events (topic, created_at)
SELECT 't', compute_now() - interval '1 day' FROM generate_series(1, 20000)`)
	// The rows are prunable once every older transaction of the cluster (another
	// test's, say) has ended.
	require.Eventually(t, func() bool {
		var n int
		err := db.QueryRow(ctx, `SELECT count(*) FROM compute_events WHERE txid < pg_snapshot_xmin(pg_current_snapshot())`).Scan(&n)
		return err == nil && n == 20000
	}, 20*time.Second, 5*time.Millisecond)

	var plan *planNode
	require.ErrorIs(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, pruneLockSQL); err != nil {
			return err
		}
		var err error
		plan, err = explain(ctx, tx, pruneSQL, 0.0, 100)
		if err != nil {
			return err
		}
		return errRollback
	}), errRollback)
	t.Log("\n" + plan.String())
	nodes := plan.nodes()
	onLog := func(match func(n *planNode) bool) []*planNode {
		return find(nodes, func(n *planNode) bool { return n.Relation == "compute_events" && match(n) })
	}

	heads := onLog(func(n *planNode) bool { return n.NodeType == "Index Scan" && n.Index == "compute_events_pkey" })
	require.Len(t, heads, 1, "one scan of the log's key finds the head")
	require.EqualValues(t, 100, heads[0].ActualRows, "the head scan walks the key and stops at the batch")
	require.EqualValues(t, 1, heads[0].ActualLoops)
	fetches := onLog(func(n *planNode) bool { return n.NodeType == "Tid Scan" })
	require.Len(t, fetches, 1, "the delete fetches the head's rows by their ctid")
	require.EqualValues(t, 100, fetches[0].ActualRows, "the delete fetches those rows, not the log")
	require.EqualValues(t, 1, fetches[0].ActualLoops)
	require.Len(t, onLog(func(n *planNode) bool { return n.NodeType == "ModifyTable" && n.Operation == "Delete" }), 1,
		"one delete on the log")
	require.Empty(t, onLog(func(n *planNode) bool {
		return strings.Contains(n.NodeType, "Seq Scan") || strings.HasPrefix(n.NodeType, "Bitmap")
	}), "the log is never scanned whole")
	require.Len(t, onLog(func(*planNode) bool { return true }), 3, "the log is read by the head scan and the ctid fetch only")
}
