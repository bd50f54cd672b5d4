package outbox

import (
	"context"
	"encoding/json"
	"fmt"
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

	var plan *planNode
	require.ErrorIs(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, claimSettings, "1000", "1000"); err != nil {
			return err
		}
		plan, err = explain(ctx, tx, c.claimSQL, c.args(c.t.BatchSize, 30.0)...)
		if err != nil {
			return err
		}
		return errRollback
	}), errRollback)
	t.Log("\n" + plan.String())
	nodes := plan.nodes()

	candidates := find(nodes, func(n *planNode) bool {
		return n.NodeType == "Index Scan" && n.Index == "stock_reports_pkey" && n.ActualLoops == 1 &&
			len(find(n.nodes(), func(b *planNode) bool { return b.Index == "inventory_stock_reports_busy" })) > 0
	})
	require.Len(t, candidates, 1, "one scan of the sequence index finds the candidates, probing each one's key in the partial index of busy keys")
	require.EqualValues(t, c.t.BatchSize, candidates[0].ActualRows, "the candidate scan stops at the batch")
	for _, n := range find(nodes, func(n *planNode) bool { return n.Relation == "stock_reports" }) {
		require.LessOrEqual(t, n.ActualRows, float64(c.t.BatchSize), "no read of the table goes past the batch: %s", n)
	}
	require.Empty(t, find(nodes, func(n *planNode) bool {
		return strings.Contains(n.NodeType, "Seq Scan") || strings.HasPrefix(n.NodeType, "Bitmap")
	}), "no sequential or bitmap scan")
	require.Empty(t, find(nodes, func(n *planNode) bool { return strings.HasSuffix(n.NodeType, "Sort") }), "no sort")
	require.Empty(t, find(nodes, func(n *planNode) bool {
		return strings.Contains(n.NodeType, "Hash") || n.Strategy == "Hashed"
	}), "no hash")
}

// planNode is a node of EXPLAIN (FORMAT JSON)'s plan tree, with the fields the
// plan tests read. The tests assert on this structure, not on EXPLAIN's text,
// whose wording changes between PostgreSQL versions.
type planNode struct {
	NodeType    string  `json:"Node Type"`
	Operation   string  `json:"Operation"` // ModifyTable: Insert, Update, Delete
	Strategy    string  `json:"Strategy"`  // Aggregate, SetOp: Plain, Sorted, Hashed
	Relation    string  `json:"Relation Name"`
	Alias       string  `json:"Alias"`
	Index       string  `json:"Index Name"`
	Parent      string  `json:"Parent Relationship"`
	Subplan     string  `json:"Subplan Name"`
	ActualRows  float64 `json:"Actual Rows"` // fractional from PostgreSQL 18 on
	ActualLoops float64 `json:"Actual Loops"`
	// Rows a node read and dropped (EXPLAIN ANALYZE).
	RemovedByFilter  float64     `json:"Rows Removed by Filter"`
	RemovedByRecheck float64     `json:"Rows Removed by Index Recheck"`
	Plans            []*planNode `json:"Plans"`
}

// explain runs EXPLAIN (ANALYZE, COSTS OFF, FORMAT JSON) of sql in tx and
// returns the root of its plan.
func explain(ctx context.Context, tx pgx.Tx, sql string, args ...any) (*planNode, error) {
	var out []byte
	if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, COSTS OFF, FORMAT JSON) "+sql, args...).Scan(&out); err != nil {
		return nil, err
	}
	var doc []struct {
		Plan *planNode `json:"Plan"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		return nil, err
	}
	if len(doc) != 1 || doc[0].Plan == nil {
		return nil, fmt.Errorf("EXPLAIN returned no plan: %s", out)
	}
	return doc[0].Plan, nil
}

// nodes returns n and every node below it, depth first.
func (n *planNode) nodes() []*planNode {
	out := []*planNode{n}
	for _, c := range n.Plans {
		out = append(out, c.nodes()...)
	}
	return out
}

// find returns the nodes that match.
func find(nodes []*planNode, match func(*planNode) bool) []*planNode {
	var out []*planNode
	for _, n := range nodes {
		if match(n) {
			out = append(out, n)
		}
	}
	return out
}

// String draws the tree, one node a line, for the test's log.
func (n *planNode) String() string {
	var b strings.Builder
	var draw func(n *planNode, depth int)
	draw = func(n *planNode, depth int) {
		b.WriteString(strings.Repeat("  ", depth))
		if n.Subplan != "" {
			b.WriteString(n.Subplan + ": ")
		}
		b.WriteString(n.NodeType)
		if n.Operation != "" {
			b.WriteString(" (" + n.Operation + ")")
		}
		if n.Strategy != "" {
			b.WriteString(" [" + n.Strategy + "]")
		}
		if n.Index != "" {
			b.WriteString(" using " + n.Index)
		}
		if n.Relation != "" {
			b.WriteString(" on " + n.Relation + " " + n.Alias)
		}
		fmt.Fprintf(&b, " rows=%g loops=%g\n", n.ActualRows, n.ActualLoops)
		for _, c := range n.Plans {
			draw(c, depth+1)
		}
	}
	draw(n, 0)
	return b.String()
}

var errRollback = &rollback{}

type rollback struct{}

func (*rollback) Error() string { return "rollback" }
