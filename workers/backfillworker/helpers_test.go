package backfillworker

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/backfill"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(runChild(mode))
	}
	pgtest.Main(m)
}

// testShards is the shard count of the tests' databases: few, so that the
// runtimes of tests running in parallel poll few queues.
const testShards = 4

// newDB returns a fresh migrated database with testShards shards.
func newDB(t testing.TB) *pgtest.DB {
	t.Helper()
	db := pgtest.New(t)
	db.MustExec(t, `UPDATE compute_settings SET shard_count = $1`, testShards)
	return db
}

// startWorker starts a worker runtime as workertest.Start does, with a 10 s
// lease renewed every second unless o says otherwise: a loaded machine that
// starves a renewal for a while must not cost a test its lease. The tests about
// a lost lease take it away on purpose.
func startWorker(tb testing.TB, db *pgtest.DB, reg *workers.Registry, o *workers.Options) *workers.Runtime {
	tb.Helper()
	var opts workers.Options
	if o != nil {
		opts = *o
	}
	if opts.LeaseTTL == 0 {
		opts.LeaseTTL = 10 * time.Second
	}
	if opts.LeaseRenew == 0 {
		opts.LeaseRenew = time.Second
	}
	return workertest.Start(tb, db.Pool, reg, &opts)
}

// makeTable creates table (id, v, filled) with n rows to fill, a partial index
// on the unfilled ones, and the shared log of handled rows (at is the start of
// the batch's transaction, compute_now(): the database's record of when it ran).
func makeTable(t testing.TB, db *pgtest.DB, table string, n int) {
	t.Helper()
	db.MustExec(t, fmt.Sprintf(`CREATE TABLE %[1]s (id bigint PRIMARY KEY, v int NOT NULL, filled int)`, table))
	db.MustExec(t, fmt.Sprintf(`CREATE INDEX %[1]s_unfilled ON %[1]s (id) WHERE filled IS NULL`, table))
	db.MustExec(t, fmt.Sprintf(`INSERT INTO %[1]s (id, v) SELECT g, g %% 97 FROM generate_series(1, $1) g`, table), n)
	db.MustExec(t, `CREATE TABLE IF NOT EXISTS bf_handled (
		tbl text NOT NULL, row_id bigint NOT NULL, batch bigint NOT NULL,
		txid xid8 NOT NULL DEFAULT pg_current_xact_id(), owner text NOT NULL,
		at timestamptz NOT NULL DEFAULT compute_now())`)
}

// hook runs at the start of each batch with the batch function's call number
// (1-based, per process); an error fails the batch.
type hook func(ctx context.Context, call int) error

// fillBackfill is a backfill that sets filled = v * 2 on up to batchSize
// unfilled rows of table, in batches of a fixed size (BatchSize, 100; tests of
// the sizing by time turn FixedBatchSize off), logging each handled row (in the batch's
// transaction, so a rolled-back batch logs nothing) with the transaction id and
// the runtime that ran it. after, if not nil, runs after the update, inside the
// transaction.
func fillBackfill(name, table string, before hook, after func(ctx context.Context, tx pgx.Tx) error) Backfill {
	var calls atomic.Int64
	return Backfill{
		Name:           name,
		BatchSize:      100,
		FixedBatchSize: true,
		Batch: func(ctx context.Context, tx pgx.Tx, batchSize int) (int, error) {
			call := int(calls.Add(1))
			if before != nil {
				if err := before(ctx, call); err != nil {
					return 0, err
				}
			}
			owner := "?"
			if rt := workers.RuntimeFrom(ctx); rt != nil {
				owner = rt.Owner()
			}
			tag, err := tx.Exec(ctx, fmt.Sprintf(`
WITH upd AS (
    UPDATE %[1]s SET filled = v * 2
    WHERE id = ANY (ARRAY(SELECT id FROM %[1]s WHERE filled IS NULL ORDER BY id LIMIT $1 FOR UPDATE))
      AND filled IS NULL
    RETURNING id
)
INSERT INTO bf_handled (tbl, row_id, batch, owner)
SELECT $2, id, (SELECT batches FROM compute_backfills WHERE name = $4), $3 FROM upd`, table), batchSize, table, owner, name)
			if err != nil {
				return 0, err
			}
			if after != nil {
				if err := after(ctx, tx); err != nil {
					return 0, err
				}
			}
			return int(tag.RowsAffected()), nil
		},
		Estimate: func(ctx context.Context, db pg.DBTX) (int64, error) {
			var n int64
			err := db.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s WHERE filled IS NULL`, table)).Scan(&n)
			return n, err
		},
	}
}

// registry returns a registry with bs registered.
func registry(t testing.TB, bs ...Backfill) *workers.Registry {
	t.Helper()
	reg := workers.NewRegistry()
	for _, b := range bs {
		require.NoError(t, Add(reg, b))
	}
	return reg
}

// mustGet reads the backfill's progress.
func mustGet(t testing.TB, db pg.DBTX, name string) *backfill.Progress {
	t.Helper()
	p, err := backfill.Get(context.Background(), db, name)
	require.NoError(t, err)
	return p
}

// waitState waits until the backfill is in state s.
func waitState(t testing.TB, db pg.DBTX, name string, s backfill.State, timeout time.Duration) *backfill.Progress {
	t.Helper()
	var p *backfill.Progress
	workertest.WaitFor(t, timeout, fmt.Sprintf("backfill %s %s", name, s), func() bool {
		p = mustGet(t, db, name)
		return p.State == s
	})
	return p
}

// liveJobs counts the backfill's River jobs that will still run.
func liveJobs(t testing.TB, db *pgtest.DB, name string) int {
	t.Helper()
	return db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = $1
		AND state IN ('available', 'scheduled', 'running', 'retryable', 'pending')`, "backfill_"+name)
}

// requireRecount checks the backfill's counters against what its committed
// batches did, as the log of handled rows records it: every row of table is
// filled, each row was handled by exactly one committed batch, rows_done is the
// number of handled rows, and batches is the number of committed batches that
// handled rows plus the final one that found none.
func requireRecount(t testing.TB, db *pgtest.DB, name, table string, rows int) *backfill.Progress {
	t.Helper()
	p := mustGet(t, db, name)
	require.Equal(t, backfill.Done, p.State)
	require.Zero(t, db.MustCount(t, fmt.Sprintf(`SELECT count(*) FROM %s WHERE filled IS DISTINCT FROM v * 2`, table)), "every row filled")
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM (SELECT row_id FROM bf_handled WHERE tbl = $1
		GROUP BY row_id HAVING count(*) > 1) d`, table), "a row handled by two committed batches")
	handled := db.MustCount(t, `SELECT count(*) FROM bf_handled WHERE tbl = $1`, table)
	require.Equal(t, rows, handled, "handled rows")
	require.EqualValues(t, handled, p.RowsDone, "rows_done equals the recount")
	txs := db.MustCount(t, `SELECT count(DISTINCT txid) FROM bf_handled WHERE tbl = $1`, table)
	require.EqualValues(t, txs+1, p.Batches, "batches equals the committed batches plus the empty last one")
	// Each batch number was committed by one transaction only, and they run
	// 0, 1, … without a gap: two runners never both committed a batch.
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM (SELECT batch FROM bf_handled WHERE tbl = $1
		GROUP BY batch HAVING count(DISTINCT txid) > 1) d`, table), "a batch committed twice")
	require.Equal(t, txs, db.MustCount(t, `SELECT count(DISTINCT batch) FROM bf_handled WHERE tbl = $1`, table))
	require.EqualValues(t, p.Batches-2, db.MustCount(t, `SELECT max(batch) FROM bf_handled WHERE tbl = $1`, table))
	require.Nil(t, p.JobID, "a done backfill has no job")
	require.Zero(t, liveJobs(t, db, name), "no live job after done")
	left, ok := p.Left()
	require.True(t, ok)
	require.Zero(t, left)
	return p
}
