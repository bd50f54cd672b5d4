package workers_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

func dirty(t *testing.T, db *pgtest.DB, kind, key string, delay time.Duration) {
	t.Helper()
	require.NoError(t, pg.InTx(context.Background(), db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		return jobs.DirtyTx(context.Background(), tx, kind, key, &jobs.DirtyOpts{Delay: delay})
	}))
}

// TestDirtyCoalesces: 1,000 dirties of one waiting key make one job and, once
// worked, one reconcile; the earlier not-before wins and moves the waiting job.
func TestDirtyCoalesces(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)

	// Waiting an hour: 1,000 more dirties add no job and only raise the gen.
	dirty(t, db, "thing", "k1", time.Hour)
	for i := 0; i < 1000; i++ {
		dirty(t, db, "thing", "k1", time.Hour+time.Duration(i)*time.Second)
	}
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'reconcile'`))
	require.Equal(t, 1001, db.MustCount(t, `SELECT gen FROM compute_dirty WHERE key = 'k1'`))
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM river_job WHERE state = 'scheduled'
		AND scheduled_at > clock_timestamp() + interval '59 minutes'`), "a later not-before does not move the job")

	// An earlier not-before wins: the waiting job becomes due now.
	dirty(t, db, "thing", "k1", 0)
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'reconcile'`))
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM river_job WHERE state = 'available'
		AND scheduled_at <= clock_timestamp()`), "the earlier not-before moved the job")
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM compute_dirty WHERE key = 'k1'
		AND not_before <= compute_now()`))

	var reconciles atomic.Int64
	reg := workers.NewRegistry()
	require.NoError(t, workers.AddReconciler(reg, workers.Reconciler{Kind: "thing",
		Reconcile: func(ctx context.Context, tx pgx.Tx, key string) (workers.Result, error) {
			reconciles.Add(1)
			return workers.Result{}, nil
		}}))
	workertest.Start(t, db.Pool, reg, nil)
	workertest.WaitFor(t, 10*time.Second, "reconciled", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM compute_dirty`) == 0
	})
	time.Sleep(300 * time.Millisecond) // room for a second (wrong) reconcile
	require.EqualValues(t, 1, reconciles.Load(), "1,001 dirties of a waiting key give one reconcile")
}

// TestNoLostWakeupAndNoOverlap: many goroutines change and dirty random keys
// while reconciles run. Every reconcile records the version it saw; at the end
// every key's last change was seen by a reconcile, and no two reconciles of one
// key ever overlapped.
func TestNoLostWakeupAndNoOverlap(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{MaxConns: 40})
	db.MustExec(t, `CREATE TABLE things (key text PRIMARY KEY, version bigint NOT NULL DEFAULT 0)`)
	db.MustExec(t, `CREATE TABLE seen (key text, version bigint, started timestamptz, finished timestamptz)`)

	var (
		mu      sync.Mutex
		running = map[string]bool{}
		overlap atomic.Int64
	)
	reg := workers.NewRegistry()
	require.NoError(t, workers.AddReconciler(reg, workers.Reconciler{Kind: "thing",
		Reconcile: func(ctx context.Context, tx pgx.Tx, key string) (workers.Result, error) {
			mu.Lock()
			if running[key] {
				overlap.Add(1)
			}
			running[key] = true
			mu.Unlock()
			defer func() { mu.Lock(); delete(running, key); mu.Unlock() }()
			var started time.Time
			if err := tx.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&started); err != nil {
				return workers.Result{}, err
			}
			var v int64
			if err := tx.QueryRow(ctx, `SELECT version FROM things WHERE key = $1`, key).Scan(&v); err != nil {
				return workers.Result{}, err
			}
			time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond) // widen the window
			_, err := tx.Exec(ctx, `INSERT INTO seen VALUES ($1, $2, $3, clock_timestamp())`, key, v, started)
			return workers.Result{}, err
		}}))
	workertest.Start(t, db.Pool, reg, nil)

	const keys, writers, changes = 20, 8, 60
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < changes; i++ {
				key := fmt.Sprintf("k%02d", rand.IntN(keys))
				err := pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, `INSERT INTO things (key, version) VALUES ($1, 1)
						ON CONFLICT (key) DO UPDATE SET version = things.version + 1`, key); err != nil {
						return err
					}
					return jobs.DirtyTx(ctx, tx, "thing", key, nil)
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	workertest.WaitFor(t, 30*time.Second, "every key reconciled", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM compute_dirty`) == 0
	})
	require.Zero(t, overlap.Load(), "two reconciles of one key ran at once")
	require.Equal(t, 0, db.MustCount(t, `SELECT count(*) FROM things t
		WHERE t.version > coalesce((SELECT max(version) FROM seen s WHERE s.key = t.key), 0)`),
		"every key's last change was seen by a reconcile")
	require.Equal(t, 0, db.MustCount(t, `SELECT count(*) FROM seen a JOIN seen b
		ON a.key = b.key AND a.ctid < b.ctid AND a.started < b.finished AND b.started < a.finished`),
		"no two reconciles of one key overlapped in time")
	require.Equal(t, 0, db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'reconcile' AND state NOT IN ('completed')`))
}

// TestRequeueAfterAndDirtyDuringRun: a reconcile asking to run again is run again
// after the delay; a key dirtied during its reconcile runs again after it.
func TestRequeueAfterAndDirtyDuringRun(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	var runs atomic.Int64
	entered, release := make(chan struct{}), make(chan struct{})
	reg := workers.NewRegistry()
	require.NoError(t, workers.AddReconciler(reg, workers.Reconciler{Kind: "thing",
		Reconcile: func(ctx context.Context, tx pgx.Tx, key string) (workers.Result, error) {
			n := runs.Add(1)
			switch {
			case key == "during" && n == 1:
				close(entered)
				<-release
			case key == "again" && n == 1:
				return workers.Result{RequeueAfter: 200 * time.Millisecond}, nil
			}
			return workers.Result{}, nil
		}}))
	workertest.Start(t, db.Pool, reg, nil)

	dirty(t, db, "thing", "during", 0)
	<-entered
	dirty(t, db, "thing", "during", 0) // while it runs: no second job now
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM river_job WHERE state NOT IN ('completed')`))
	close(release)
	workertest.WaitFor(t, 10*time.Second, "run again after the run", func() bool { return runs.Load() == 2 })
	workertest.WaitFor(t, 10*time.Second, "clean", func() bool { return db.MustCount(t, `SELECT count(*) FROM compute_dirty`) == 0 })

	runs.Store(0)
	dirty(t, db, "thing", "again", 0)
	workertest.WaitFor(t, 10*time.Second, "requeued run", func() bool { return runs.Load() == 2 })
	workertest.WaitFor(t, 10*time.Second, "clean", func() bool { return db.MustCount(t, `SELECT count(*) FROM compute_dirty`) == 0 })
}

// TestFaultsBecomeOutcomes: args that do not decode are cancelled, never retried;
// a panic fails that attempt only; an error is retried with backoff and stored in
// the job's errors with secrets removed.
func TestFaultsBecomeOutcomes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	const secret = "hunter2-secret"
	var panics, fails atomic.Int64
	reg := workers.NewRegistry()
	require.NoError(t, workers.AddReconciler(reg, workers.Reconciler{Kind: "thing",
		Reconcile: func(ctx context.Context, tx pgx.Tx, key string) (workers.Result, error) {
			switch key {
			case "panics":
				if panics.Add(1) == 1 {
					panic("reconciler bug")
				}
			case "fails":
				if fails.Add(1) == 1 {
					return workers.Result{}, errors.New("upstream refused password " + secret)
				}
			}
			_, err := tx.Exec(ctx, `INSERT INTO done VALUES ($1)`, key)
			return workers.Result{}, err
		}}))
	db.MustExec(t, `CREATE TABLE done (key text)`)
	workertest.Start(t, db.Pool, reg, &workers.Options{Secrets: []string{secret}})

	// A job whose args do not decode: inserted by hand, as a bad deploy might.
	db.MustExec(t, `INSERT INTO river_job (args, kind, max_attempts, queue, state, scheduled_at)
		VALUES ('{"reconciler": 42}', 'reconcile', 25, 'shard_0', 'available', clock_timestamp())`)
	db.MustExec(t, `INSERT INTO river_job (args, kind, max_attempts, queue, state, scheduled_at)
		VALUES ('{"reconciler": "thing"}', 'reconcile', 25, 'shard_1', 'available', clock_timestamp())`)
	dirty(t, db, "thing", "panics", 0)
	dirty(t, db, "thing", "fails", 0)

	workertest.WaitFor(t, 10*time.Second, "bad args cancelled", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM river_job WHERE state = 'cancelled'`) == 2
	})
	require.Equal(t, 2, db.MustCount(t, `SELECT count(*) FROM river_job WHERE state = 'cancelled' AND attempt = 1`),
		"cancelled at the first attempt, never retried")

	// The panic and the error each failed one attempt; River retries them with
	// backoff (the first retry comes after about a second).
	workertest.WaitFor(t, 30*time.Second, "panicking and failing keys retried and done", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM done`) == 2
	})
	require.EqualValues(t, 2, panics.Load())
	require.EqualValues(t, 2, fails.Load())
	var errText string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT errors::text FROM river_job
		WHERE args->>'key' = 'fails'`).Scan(&errText))
	require.Contains(t, errText, "upstream refused password xxxxx")
	require.NotContains(t, errText, secret)
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM river_job WHERE args->>'key' = 'panics'
		AND errors[1]->>'error' LIKE '%reconciler bug%' AND state = 'completed'`))
}

// TestBatchReconcilesInOneTransaction: due keys of one shard are reconciled
// several per fenced transaction; a batched key that fails rolls back only into a
// retry of the job's own key, and retries on its own.
func TestBatchReconcilesInOneTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	db.MustExec(t, `UPDATE compute_settings SET shard_count = 1`) // every key in shard 0
	db.MustExec(t, `CREATE TABLE done (key text, txid xid8 DEFAULT pg_current_xact_id())`)
	var failed atomic.Bool
	reg := workers.NewRegistry()
	require.NoError(t, workers.AddReconciler(reg, workers.Reconciler{Kind: "thing", Batch: 10,
		Reconcile: func(ctx context.Context, tx pgx.Tx, key string) (workers.Result, error) {
			if key == "k13" && failed.CompareAndSwap(false, true) {
				return workers.Result{}, errors.New("k13 fails once")
			}
			_, err := tx.Exec(ctx, `INSERT INTO done (key) VALUES ($1)`, key)
			return workers.Result{}, err
		}}))
	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		for i := 0; i < 40; i++ {
			if err := jobs.DirtyTx(ctx, tx, "thing", fmt.Sprintf("k%02d", i), nil); err != nil {
				return err
			}
		}
		return nil
	}))
	workertest.Start(t, db.Pool, reg, &workers.Options{Shards: []int{0}, WorkersPerShard: 1})
	workertest.WaitFor(t, 30*time.Second, "every key reconciled", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM compute_dirty`) == 0
	})
	require.True(t, failed.Load())
	require.Equal(t, 40, db.MustCount(t, `SELECT count(DISTINCT key) FROM done`))
	require.Equal(t, 40, db.MustCount(t, `SELECT count(*) FROM done`), "each key reconciled once")
	require.Less(t, db.MustCount(t, `SELECT count(DISTINCT txid) FROM done`), 20, "keys were batched into few transactions")
	require.Equal(t, 40, db.MustCount(t, `SELECT count(*) FROM river_job WHERE state = 'completed'`))
}
