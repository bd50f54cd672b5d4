package workers_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/migrate"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

// TestBehindPgBouncer runs the whole path through a real PgBouncer in transaction
// mode: concurrent migrations (advisory xact lock), the statement timeout (SET
// LOCAL, not left on a server connection), a worker (River poll-only, leases),
// DirtyTx and a fenced reconcile, and a fenced job.
func TestBehindPgBouncer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	direct := pgtest.New(t, pgtest.Options{Empty: true})
	viaURL := pgtest.PgBouncer(t, direct)
	via, err := pg.Open(ctx, pg.Options{URL: viaURL, MaxConns: 20, StatementTimeout: 2 * time.Second})
	require.NoError(t, err)
	defer via.Close()

	// Two migrators at once through PgBouncer: both succeed, each migration once.
	set, err := migrate.Builtin()
	require.NoError(t, err)
	require.NoError(t, migrate.EnsureExtensions(ctx, via))
	errs := make(chan error, 2)
	for i := 0; i < 2; i++ {
		go func() { _, err := set.Apply(ctx, via, nil); errs <- err }()
	}
	require.NoError(t, <-errs)
	require.NoError(t, <-errs)
	require.Equal(t, len(set.Migrations()), direct.MustCount(t, `SELECT count(*) FROM compute_migrations`))
	_, err = migrate.InitSettings(ctx, via, 4)
	require.NoError(t, err)

	// The statement timeout fires inside a transaction and is gone after it.
	err = pg.InTx(ctx, via, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `SELECT pg_sleep(3)`)
		return err
	})
	require.Equal(t, "57014", pg.SQLState(err))
	var timeout string
	require.NoError(t, via.QueryRow(ctx, `SHOW statement_timeout`).Scan(&timeout))
	require.Equal(t, "0", timeout, "a SET LOCAL must not stay on a pooled server connection")

	db := &pgtest.DB{Pool: via, Name: direct.Name, URL: viaURL}
	db.MustExec(t, `CREATE TABLE things (key text PRIMARY KEY, n int NOT NULL DEFAULT 0, seen int)`)
	reg := workers.NewRegistry()
	require.NoError(t, workers.AddWorker(reg, &bumpWorker{}))
	require.NoError(t, workers.AddReconciler(reg, workers.Reconciler{Kind: "thing",
		Reconcile: func(ctx context.Context, tx pgx.Tx, key string) (workers.Result, error) {
			_, err := tx.Exec(ctx, `UPDATE things SET seen = n WHERE key = $1`, key)
			return workers.Result{}, err
		}}))
	db.MustExec(t, `CREATE TABLE test_items (key text PRIMARY KEY, n int NOT NULL DEFAULT 0)`)
	db.MustExec(t, `INSERT INTO test_items (key) VALUES ('a')`)
	workertest.Start(t, via, reg, nil)

	for i := 0; i < 20; i++ {
		key := string(rune('a' + i))
		require.NoError(t, pg.InTx(ctx, via, func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO things (key, n) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET n = $2`, key, i); err != nil {
				return err
			}
			return workers.DirtyTx(ctx, tx, "thing", key, nil)
		}))
	}
	require.NoError(t, pg.InTx(ctx, via, func(ctx context.Context, tx pgx.Tx) error {
		q, err := jobs.ShardQueueOfTx(ctx, tx, "a")
		if err != nil {
			return err
		}
		_, err = jobs.InsertTx(ctx, tx, bumpArgs{Key: "a"}, &river.InsertOpts{Queue: q})
		return err
	}))
	workertest.WaitFor(t, 30*time.Second, "reconciled and bumped through PgBouncer", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM things WHERE seen IS DISTINCT FROM n`) == 0 &&
			db.MustCount(t, `SELECT n FROM test_items WHERE key = 'a'`) == 1
	})
	require.Equal(t, 0, db.MustCount(t, `SELECT count(*) FROM compute_dirty`))
}
