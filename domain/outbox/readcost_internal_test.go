package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

// touched is how many rows of rel the plan's nodes on it read (returned or
// filtered out), and the node types that read it.
func (n *planNode) touched(rel string) (rows float64, types []string) {
	for _, c := range n.nodes() {
		if c.Relation == rel {
			rows += (c.ActualRows + c.RemovedByFilter + c.RemovedByRecheck) * c.ActualLoops
			types = append(types, c.NodeType)
		}
	}
	return rows, types
}

// TestReadTouchesRowsProportionalToTheBatch: docs/outbox.md "Rows are read
// proportionally to the batch, whatever the size of the log". The log's read
// (for sinks, and the SSE stream's with the horizon) of 10 events, after a
// cursor near the start or near the end of a log of 20,200 events, with or
// without a topic filter, reads at most 11 rows of compute_events, measured by
// EXPLAIN ANALYZE; and so when the statistics were taken while the log held
// 200 events.
func TestReadTouchesRowsProportionalToTheBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	appendN := func(n int) {
		for done := 0; done < n; done += 1000 {
			msgs := make([]Message, min(1000, n-done))
			for i := range msgs {
				msgs[i] = Message{Topic: []string{"a", "b"}[i%2], Key: fmt.Sprint(done + i), Payload: done + i}
			}
			require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error { return AppendTx(ctx, tx, msgs...) }))
		}
	}
	appendN(200)
	db.MustExec(t, `ANALYZE compute_events`)
	appendN(20_000)

	// Wait until every event is readable (older transactions of the cluster,
	// other tests', have ended), and take two cursors.
	var ids []Cursor
	deadline := time.Now().Add(60 * time.Second)
	for len(ids) < 20_200 {
		require.True(t, time.Now().Before(deadline), "only %d of 20,200 events readable", len(ids))
		evs, _, _, err := Read(ctx, db.Pool, ReadOptions{After: Cursor{}, Limit: 20_200})
		require.NoError(t, err)
		ids = ids[:0]
		for _, e := range evs {
			ids = append(ids, e.ID)
		}
		time.Sleep(10 * time.Millisecond)
	}

	const batch = 10
	for _, sql := range []string{readSQL, readStreamSQL} {
		for _, from := range []Cursor{ids[100], ids[len(ids)-50]} {
			for _, topics := range [][]string{{}, {"a"}} {
				var out []byte
				require.NoError(t, db.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+sql,
					from.txidText(), from.Seq, batch, topics).Scan(&out))
				var plans []struct {
					Plan *planNode `json:"Plan"`
				}
				require.NoError(t, json.Unmarshal(out, &plans))
				rows, types := plans[0].Plan.touched("compute_events")
				t.Logf("read %d after %s, topics %v: %v rows of compute_events by %v", batch, from, topics, rows, types)
				require.NotEmpty(t, types, "the plan reads compute_events")
				require.NotContains(t, types, "Seq Scan", "no sequential scan of the log")
				require.LessOrEqual(t, rows, float64(batch+1), "rows read for a batch of %d in a log of 20,200: %s", batch, out)
			}
		}
	}
}
