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

	var plan []string
	require.ErrorIs(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, pruneLockSQL); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, COSTS OFF) "+pruneSQL, 0.0, 100)
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
	require.Regexp(t, `Index Scan using compute_events_pkey on compute_events e \(actual time=\S+ rows=100 loops=1\)`, text,
		"the head scan walks the key and stops at the batch")
	require.Regexp(t, `Tid Scan on compute_events e_1 \(actual time=\S+ rows=100 loops=1\)`, text,
		"the delete fetches those rows, not the log")
	require.NotRegexp(t, `(Seq|Bitmap Heap) Scan on compute_events `, text)
	require.Contains(t, text, "Delete on compute_events e_1 (actual time=")
}
