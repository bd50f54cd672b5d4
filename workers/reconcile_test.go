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
		return workers.DirtyTx(context.Background(), tx, kind, key, &workers.DirtyOpts{Delay: delay})
	}))
}

// TestDirtyCoalesces: 1,000 dirties of one waiting key keep one row and, once
// worked, give one reconcile; the earlier not-before wins.
func TestDirtyCoalesces(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)

	// Waiting an hour: 1,000 more dirties keep one row and only raise the gen.
	dirty(t, db, "thing", "k1", time.Hour)
	for i := 0; i < 1000; i++ {
		dirty(t, db, "thing", "k1", time.Hour+time.Duration(i)*time.Second)
	}
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM compute_dirty`))
	require.Equal(t, 1001, db.MustCount(t, `SELECT gen FROM compute_dirty WHERE key = 'k1'`))
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM compute_dirty WHERE key = 'k1' AND job_id IS NULL
		AND not_before BETWEEN compute_now() + interval '59 minutes' AND compute_now() + interval '61 minutes'`),
		"a later not-before does not move the key")
	require.Equal(t, 0, db.MustCount(t, `SELECT count(*) FROM river_job`), "a waiting key costs no River job")

	// An earlier not-before wins: the key becomes due now.
	dirty(t, db, "thing", "k1", 0)
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM compute_dirty WHERE key = 'k1'
		AND not_before <= compute_now()`), "the earlier not-before moved the key")

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
	require.Equal(t, 0, db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind LIKE 'reconcile%'`),
		"a batch that commits writes no River job: it took its key in its own transaction")
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
					return workers.DirtyTx(ctx, tx, "thing", key, nil)
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
	require.Equal(t, 0, db.MustCount(t, `SELECT count(*) FROM river_job WHERE state NOT IN ('completed')`))
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
	dirty(t, db, "thing", "during", 0) // while it runs: it does not wait for the run, and no second run starts now
	waiting := db.MustCount(t, `SELECT count(*) FROM compute_dirty WHERE key = 'during' AND gen = 2 AND job_id IS NULL`)
	riverJobs := db.MustCount(t, `SELECT count(*) FROM river_job`)
	close(release)
	require.Equal(t, 1, waiting, "the dirty during the run bumped the gen of the row the run took")
	require.Zero(t, riverJobs, "a batch writes no River job")
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
// several per fenced transaction, with no River job; a key that fails
// leaves its batch (the rest commits) and retries as its own River job.
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
			if err := workers.DirtyTx(ctx, tx, "thing", fmt.Sprintf("k%02d", i), nil); err != nil {
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
	require.Equal(t, 0, db.MustCount(t, `SELECT count(*) FROM river_job WHERE state <> 'completed'`))
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM (SELECT txid FROM done GROUP BY txid HAVING count(*) > 10) big`),
		"no batch above its reconciler's Batch")
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'reconcile_batch'`), "a batch writes no River job")
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'reconcile' AND args->>'key' = 'k13'
		AND attempt = 2 AND errors[1]->>'error' LIKE '%k13 fails once%'`), "the failing key retried as its own job")
}

// TestMarkDirtyFromATrigger: a trigger that calls compute_mark_dirty marks keys
// dirty in the writer's transaction: a committed write is reconciled, a rolled
// back one leaves nothing, and many writes of one row coalesce.
func TestMarkDirtyFromATrigger(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	db.MustExec(t, `CREATE TABLE stock (sku text PRIMARY KEY, qty int NOT NULL)`)
	db.MustExec(t, `CREATE TABLE seen (sku text, qty int)`)
	db.MustExec(t, `CREATE FUNCTION stock_dirty() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM compute_mark_dirty('stock', NEW.sku);
    RETURN NEW;
END $$`)
	db.MustExec(t, `CREATE TRIGGER stock_dirty AFTER INSERT OR UPDATE ON stock FOR EACH ROW EXECUTE FUNCTION stock_dirty()`)

	var runs atomic.Int64
	reg := workers.NewRegistry()
	require.NoError(t, workers.AddReconciler(reg, workers.Reconciler{Kind: "stock",
		Reconcile: func(ctx context.Context, tx pgx.Tx, key string) (workers.Result, error) {
			runs.Add(1)
			_, err := tx.Exec(ctx, `INSERT INTO seen SELECT sku, qty FROM stock WHERE sku = $1`, key)
			return workers.Result{}, err
		}}))

	// Before any worker runs: 50 updates of one row are one dirty row.
	db.MustExec(t, `INSERT INTO stock VALUES ('apple', 0)`)
	for i := 1; i <= 50; i++ {
		db.MustExec(t, `UPDATE stock SET qty = $1 WHERE sku = 'apple'`, i)
	}
	require.Equal(t, 51, db.MustCount(t, `SELECT gen FROM compute_dirty WHERE kind = 'stock' AND key = 'apple'`))
	err := pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO stock VALUES ('pear', 1)`); err != nil {
			return err
		}
		return errors.New("roll back")
	})
	require.Error(t, err)
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM compute_dirty WHERE key = 'pear'`), "a rolled-back write marks nothing")

	workertest.Start(t, db.Pool, reg, nil)
	workertest.WaitFor(t, 30*time.Second, "apple reconciled", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM compute_dirty`) == 0
	})
	require.EqualValues(t, 1, runs.Load(), "51 marks of a waiting key, one reconcile")
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM seen WHERE sku = 'apple' AND qty = 50`))

	// With the worker running: a committed write is reconciled.
	db.MustExec(t, `INSERT INTO stock VALUES ('plum', 7)`)
	workertest.WaitFor(t, 30*time.Second, "plum reconciled", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM seen WHERE sku = 'plum' AND qty = 7`) == 1
	})
}

// TestBatchOfADeadHolderIsWorkedByRiver: a batch claimed by a process that died
// before it committed (its job running under it) is handed back by the shard's
// next holder and worked by River like any job: its keys are reconciled once,
// and the job completes.
func TestBatchOfADeadHolderIsWorkedByRiver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	db.MustExec(t, `UPDATE compute_settings SET shard_count = 1`) // every key in shard 0
	db.MustExec(t, `CREATE TABLE done (key text)`)
	for i := 0; i < 5; i++ {
		dirty(t, db, "thing", fmt.Sprintf("k%d", i), 0)
	}
	// The dead holder: its lease (expired a moment ago) and its claim.
	db.MustExec(t, `INSERT INTO compute_leases (name, owner, epoch, expires_at) VALUES ('shard/0', 'ghost#1', 4, compute_now() + interval '1 hour')`)
	rows, err := db.Query(ctx, jobs.ClaimDirtySQL, 0, "shard/0", "ghost#1", int64(4), []string{"thing"}, []int{32}, 32, time.Now(), "shard_0")
	require.NoError(t, err)
	rows.Close()
	require.NoError(t, rows.Err())
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'reconcile_batch' AND state = 'running'
		AND attempted_by = '{ghost#1}' AND jsonb_array_length(args->'keys') = 5`))
	require.Equal(t, 5, db.MustCount(t, `SELECT count(*) FROM compute_dirty WHERE job_id IS NOT NULL`))
	db.MustExec(t, `UPDATE compute_leases SET expires_at = compute_now() - interval '1 second' WHERE name = 'shard/0'`)

	reg := workers.NewRegistry()
	require.NoError(t, workers.AddReconciler(reg, workers.Reconciler{Kind: "thing",
		Reconcile: func(ctx context.Context, tx pgx.Tx, key string) (workers.Result, error) {
			_, err := tx.Exec(ctx, `INSERT INTO done VALUES ($1)`, key)
			return workers.Result{}, err
		}}))
	workertest.Start(t, db.Pool, reg, &workers.Options{Shards: []int{0}})
	workertest.WaitFor(t, 30*time.Second, "the dead holder's batch worked", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM compute_dirty`) == 0
	})
	require.Equal(t, 5, db.MustCount(t, `SELECT count(DISTINCT key) FROM done`))
	require.Equal(t, 5, db.MustCount(t, `SELECT count(*) FROM done`), "each key once")
	workertest.WaitFor(t, 10*time.Second, "the batch job completed", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'reconcile_batch' AND state = 'completed'
			AND attempt = 2 AND errors[1]->>'error' LIKE '%handed back%'`) == 1
	})
}

// TestCancelledFailingKeyWaitsForTheNextDirty: a key failing on its own job,
// cancelled by an operator (River UI), is left alone until it is dirtied again;
// then its shard's holder claims it.
func TestCancelledFailingKeyWaitsForTheNextDirty(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	var broken atomic.Bool
	broken.Store(true)
	var runs atomic.Int64
	reg := workers.NewRegistry()
	require.NoError(t, workers.AddReconciler(reg, workers.Reconciler{Kind: "thing",
		Reconcile: func(ctx context.Context, tx pgx.Tx, key string) (workers.Result, error) {
			runs.Add(1)
			if broken.Load() {
				return workers.Result{}, errors.New("still broken")
			}
			return workers.Result{}, nil
		}}))
	workertest.Start(t, db.Pool, reg, nil)
	dirty(t, db, "thing", "k", 0)
	workertest.WaitFor(t, 30*time.Second, "the key has its own job", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM compute_dirty d JOIN river_job j ON j.id = d.job_id
			WHERE j.kind = 'reconcile' AND j.state IN ('retryable', 'available', 'scheduled')`) == 1
	})
	db.MustExec(t, `UPDATE river_job SET state = 'cancelled', finalized_at = $1 WHERE kind = 'reconcile'`, time.Now())
	before := runs.Load()
	time.Sleep(500 * time.Millisecond) // room for a wrong thing: a claim of the cancelled key
	require.Equal(t, before, runs.Load(), "a cancelled key is not claimed again by itself")
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM compute_dirty`), "it stays dirty")

	broken.Store(false)
	dirty(t, db, "thing", "k", 0)
	workertest.WaitFor(t, 30*time.Second, "reconciled after the next dirty", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM compute_dirty`) == 0
	})
}

// TestBatchOfOneIsOneKeyPerTransaction: a reconciler with Batch: 1 reconciles
// one key per transaction, each in a batch job of its own, even when many keys
// of one shard are due at once.
func TestBatchOfOneIsOneKeyPerTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	db.MustExec(t, `UPDATE compute_settings SET shard_count = 1`) // every key in shard 0
	db.MustExec(t, `CREATE TABLE done (key text, txid xid8 DEFAULT pg_current_xact_id())`)
	reg := workers.NewRegistry()
	require.NoError(t, workers.AddReconciler(reg, workers.Reconciler{Kind: "thing", Batch: 1,
		Reconcile: func(ctx context.Context, tx pgx.Tx, key string) (workers.Result, error) {
			_, err := tx.Exec(ctx, `INSERT INTO done (key) VALUES ($1)`, key)
			return workers.Result{}, err
		}}))
	const keys = 20
	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		for i := 0; i < keys; i++ {
			if err := workers.DirtyTx(ctx, tx, "thing", fmt.Sprintf("k%02d", i), nil); err != nil {
				return err
			}
		}
		return nil
	}))
	workertest.Start(t, db.Pool, reg, &workers.Options{Shards: []int{0}})
	workertest.WaitFor(t, 30*time.Second, "every key reconciled", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM compute_dirty`) == 0
	})
	require.Equal(t, keys, db.MustCount(t, `SELECT count(*) FROM done`), "each key reconciled once")
	require.Equal(t, keys, db.MustCount(t, `SELECT count(DISTINCT key) FROM done`))
	require.Equal(t, keys, db.MustCount(t, `SELECT count(DISTINCT txid) FROM done`), "one key per transaction")
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM river_job`), "a batch writes no River job")
}

// TestResyncReconcilesKeysNeverDirtied: a reconciler with List has every key
// it lists reconciled at every resync interval, though nothing ever dirtied
// them, by a resync job enqueued every interval (not sooner).
func TestResyncReconcilesKeysNeverDirtied(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	db.MustExec(t, `CREATE TABLE owned (key text PRIMARY KEY)`)
	db.MustExec(t, `INSERT INTO owned SELECT 'k' || i FROM generate_series(1, 5) i`)
	db.MustExec(t, `CREATE TABLE seen (key text, at timestamptz DEFAULT clock_timestamp())`)
	reg := workers.NewRegistry()
	require.NoError(t, workers.AddReconciler(reg, workers.Reconciler{Kind: "owned",
		Reconcile: func(ctx context.Context, tx pgx.Tx, key string) (workers.Result, error) {
			_, err := tx.Exec(ctx, `INSERT INTO seen (key) VALUES ($1)`, key)
			return workers.Result{}, err
		},
		List: func(ctx context.Context, db pg.DBTX, after string, limit int) ([]string, error) {
			rows, err := db.Query(ctx, `SELECT key FROM owned WHERE key > $1 ORDER BY key LIMIT $2`, after, limit)
			if err != nil {
				return nil, err
			}
			return pgx.CollectRows(rows, pgx.RowTo[string])
		}}))
	const every = 2 * time.Second
	started := dbNow(t, db)
	workertest.Start(t, db.Pool, reg, &workers.Options{ResyncEvery: every})
	workertest.WaitFor(t, 30*time.Second, "every listed key reconciled by two resyncs", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM (SELECT key FROM seen GROUP BY key HAVING count(*) >= 2) s`) == 5
	})
	// The resync jobs were scheduled an interval apart, the first an interval
	// after the start.
	var first time.Time
	require.NoError(t, db.QueryRow(ctx, `SELECT min(scheduled_at) FROM river_job WHERE kind = 'reconcile_resync'`).Scan(&first))
	require.GreaterOrEqual(t, first.Sub(started), every-100*time.Millisecond, "the first resync came before its interval")
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM river_job a JOIN river_job b ON a.kind = 'reconcile_resync'
		AND b.kind = 'reconcile_resync' AND a.id < b.id AND b.scheduled_at - a.scheduled_at < $1::interval`,
		(every-100*time.Millisecond).String()), "two resyncs within one interval")
	// No key was reconciled more often than it was resynced. A resync job is
	// counted once it has run (attempted_at set), not once River's completer
	// has recorded it completed: the completer writes outcomes asynchronously,
	// after the keys the resync dirtied may already have been reconciled.
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM (SELECT key FROM seen GROUP BY key
		HAVING count(*) > (SELECT count(*) FROM river_job WHERE kind = 'reconcile_resync' AND attempted_at IS NOT NULL)) s`),
		"a key reconciled more often than the resyncs that listed it")
}
