package cli_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/cmd/better-compute/cli"
	"github.com/bettercompute/bettercompute/cmd/better-compute/cli/clitest"
	"github.com/bettercompute/bettercompute/domain/backfill"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/testdata/backfill/inventory"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

// bfRegistry is what a worker process of app registers.
func bfRegistry(t *testing.T, app cli.App) *workers.Registry {
	t.Helper()
	reg, err := app.Registry()
	require.NoError(t, err)
	return reg
}

// writers plays instances of one release of the inventory example: goroutines
// that add and rename items until stopped, recording what they wrote.
type writers struct {
	items  inventory.Items
	cancel context.CancelFunc
	wg     sync.WaitGroup
	ops    atomic.Int64
	mu     sync.Mutex
	names  map[int64]string // id -> the name this release last gave it
	errs   []error
}

func startWriters(db *pgtest.DB, release, n int) *writers {
	ctx, cancel := context.WithCancel(context.Background())
	w := &writers{items: inventory.Items{Release: release}, cancel: cancel, names: map[int64]string{}}
	for g := 0; g < n; g++ {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				name := fmt.Sprintf("Widget-R%d-%s", release, strings.ToUpper(fmt.Sprint(rand.Int64())))
				var err error
				var id int64
				if i%2 == 0 {
					id, err = w.items.Add(ctx, db.Pool, name)
				} else {
					// Rename an old row, one the backfill may be working on.
					id = 1 + rand.Int64N(2000)
					err = w.items.Rename(ctx, db.Pool, id, name)
				}
				if err != nil && ctx.Err() == nil {
					w.mu.Lock()
					w.errs = append(w.errs, err)
					w.mu.Unlock()
					return
				}
				if err == nil {
					w.mu.Lock()
					w.names[id] = name
					w.mu.Unlock()
					w.ops.Add(1)
				}
				time.Sleep(time.Millisecond)
			}
		}()
	}
	return w
}

func (w *writers) stop(t *testing.T) {
	t.Helper()
	w.cancel()
	w.wg.Wait()
	require.Empty(t, w.errs, "release %d writers failed", w.items.Release)
	require.Greater(t, w.ops.Load(), int64(0), "release %d writers wrote", w.items.Release)
}

// waitOps waits until w has done n more operations.
func (w *writers) waitOps(t *testing.T, n int64) {
	t.Helper()
	target := w.ops.Load() + n
	workertest.WaitFor(t, 30*time.Second, "writers at work", func() bool { return w.ops.Load() >= target })
}

// The worked example of docs/backfills.md, stage by stage, with the previous
// release's writers running all along: expand (0002) while release 1 writes;
// backfill while release 1 adds and renames items; cut over (release 3 writes
// and reads the new column) while release 2 still writes; clean up (0003, NOT
// NULL) while release 3 writes. Every row ends with the right value.
func TestBackfillWorkedExample(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	env := dbEnv(db)
	app := func(release int) cli.App {
		return cli.App{Name: "inventory", Modules: []cli.Module{inventory.Module(release)}}
	}
	const seeded = 20000

	// Release 1: the table, 20,000 items, and its writers.
	r := clitest.Run(t, ctx, app(1), env, "migrate")
	require.Equal(t, 0, r.Code, r.Stderr)
	db.MustExec(t, `INSERT INTO inventory_items (name) SELECT 'Item-' || g || '-ABC' FROM generate_series(1, $1) g`, seeded)
	v1 := startWriters(db, 1, 2)
	v1.waitOps(t, 20)

	// Release 2, expand, while release 1 writes.
	r = clitest.Run(t, ctx, app(2), env, "migrate")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "applied inventory/0002_expand_normalized_name")
	v1.waitOps(t, 20)

	// Cleaning up before the backfill ran is refused, and leaves nothing.
	r = clitest.Run(t, ctx, app(4), env, "migrate")
	require.Equal(t, 1, r.Code)
	require.Contains(t, r.Stderr, "the backfill inventory_normalized_name has not finished")
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM compute_migrations WHERE name = 'inventory/0003_normalized_name_not_null'`))

	// Release 2's worker, and the operator starts the backfill.
	workertest.Start(t, db.Pool, bfRegistry(t, app(2)), &workers.Options{LeaseTTL: 10 * time.Second, LeaseRenew: time.Second})
	r = clitest.Run(t, ctx, app(2), env, "backfill", "start", "inventory_normalized_name")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "started backfill inventory_normalized_name")
	require.Contains(t, r.Stdout, "rows to go")
	r = clitest.Run(t, ctx, app(2), env, "backfill", "start", "inventory_normalized_name")
	require.Equal(t, 1, r.Code)
	require.True(t, strings.HasPrefix(r.Stderr, "CONFLICT: backfill inventory_normalized_name is already running"), r.Stderr)

	// Watch it to the end in plain lines (stdout is not a terminal) while
	// release 1 keeps adding and renaming.
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	r = clitest.Run(t, wctx, app(2), env, "backfill", "status", "inventory_normalized_name", "--watch", "--every", "50ms")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.NotContains(t, r.Stdout, "\r", "no bar when stdout is not a terminal")
	lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
	require.Contains(t, lines[len(lines)-1], "inventory_normalized_name: done")
	p, err := backfill.Get(ctx, db.Pool, "inventory_normalized_name")
	require.NoError(t, err)
	require.Equal(t, backfill.Done, p.State)
	require.Greater(t, p.RowsDone, int64(seeded/2))
	require.LessOrEqual(t, p.RowsDone, int64(seeded), "the trigger filled what release 1 wrote")
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM inventory_items WHERE normalized_name IS NULL`))
	v1.waitOps(t, 20) // release 1 goes on writing after the backfill: the trigger covers it

	// Release 3, cut over: it writes and reads the column, while release 2
	// instances (which write as release 1 did) still run.
	v2 := startWriters(db, 2, 1)
	v1.stop(t)
	v3 := startWriters(db, 3, 2)
	v3.waitOps(t, 40)
	v2.stop(t)
	items := inventory.Items{Release: 3}
	found, err := items.Find(ctx, db.Pool, "ITEM-4242-abc")
	require.NoError(t, err)
	require.Equal(t, []int64{4242}, found, "release 3 finds a seeded item by the backfilled column")
	for _, w := range []*writers{v1, v2} {
		w.mu.Lock()
		checked := 0
		for id, name := range w.names {
			if id <= seeded {
				continue // a seeded row: any release may have renamed it since
			}
			ids, err := items.Find(ctx, db.Pool, strings.ToLower(name))
			require.NoError(t, err)
			require.Equal(t, []int64{id}, ids, "release 3 finds %q, which release %d added", name, w.items.Release)
			checked++
		}
		w.mu.Unlock()
		require.Greater(t, checked, 0)
	}

	// Release 4, clean up, while release 3 writes.
	r = clitest.Run(t, ctx, app(4), env, "migrate")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "applied inventory/0003_normalized_name_not_null")
	v3.waitOps(t, 20)
	v3.stop(t)

	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM inventory_items WHERE normalized_name IS DISTINCT FROM lower(name)`),
		"every row has the right value")
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM pg_attribute
		WHERE attrelid = 'inventory_items'::regclass AND attname = 'normalized_name' AND attnotnull`))
	_, err = inventory.Items{Release: 1}.Add(ctx, db.Pool, "too old")
	require.Error(t, err, "release 1 cannot write once the clean-up ran: it must be gone by then")
	require.Equal(t, "23502", pg.SQLState(err))

	// Release 4 no longer registers the backfill; its record stays.
	r = clitest.Run(t, ctx, app(4), env, "backfill", "status", "inventory_normalized_name")
	require.Equal(t, 1, r.Code)
	require.Contains(t, r.Stderr, "NOT_FOUND")
	r = clitest.Run(t, ctx, app(3), env, "backfill", "list")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Regexp(t, `inventory_normalized_name\s+done\s+\d+`, r.Stdout)
	r = clitest.Run(t, ctx, app(4), env, "backfill", "list")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.NotRegexp(t, `(?m)^inventory_normalized_name`, r.Stdout, "release 4 does not list it as its own")
	require.Contains(t, r.Stdout, "also in the database, not registered by this binary: inventory_normalized_name (done)\n")
}

// verbsApp is an application with three backfills over one table: alpha_fill,
// which works, beta_fill, whose every batch fails, and gamma_fill, whose batch
// finds the data wrong (INVALID_ARGUMENT).
func verbsApp() cli.App {
	return cli.App{Modules: []cli.Module{{
		Name: "verbs",
		Migrations: fstest.MapFS{"0001_items.sql": {Data: []byte(`
CREATE TABLE verbs_items (id bigint PRIMARY KEY, a int, b int);
CREATE INDEX verbs_items_no_a ON verbs_items (id) WHERE a IS NULL;
INSERT INTO verbs_items (id) SELECT g FROM generate_series(1, 500) g;`)}},
		Register: func(r *workers.Registry) error {
			err := workers.AddBackfill(r, workers.Backfill{
				Name:      "alpha_fill",
				BatchSize: 100,
				// Batches of exactly 100 rows, however long one takes on a
				// loaded machine: the test counts them.
				FixedBatchSize: true,
				Batch: func(ctx context.Context, tx pgx.Tx, n int) (int, error) {
					tag, err := tx.Exec(ctx, `UPDATE verbs_items SET a = id WHERE id = ANY (ARRAY(
						SELECT id FROM verbs_items WHERE a IS NULL ORDER BY id LIMIT $1 FOR UPDATE)) AND a IS NULL`, n)
					return int(tag.RowsAffected()), err
				},
				Estimate: func(ctx context.Context, db pg.DBTX) (int64, error) {
					var n int64
					err := db.QueryRow(ctx, `SELECT count(*) FROM verbs_items WHERE a IS NULL`).Scan(&n)
					return n, err
				},
			})
			if err != nil {
				return err
			}
			err = workers.AddBackfill(r, workers.Backfill{
				Name: "beta_fill",
				Batch: func(ctx context.Context, tx pgx.Tx, n int) (int, error) {
					return 0, errors.New("beta is broken: column b is cursed")
				},
			})
			if err != nil {
				return err
			}
			return workers.AddBackfill(r, workers.Backfill{
				Name: "gamma_fill",
				Batch: func(ctx context.Context, tx pgx.Tx, n int) (int, error) {
					return 0, fault.New(fault.InvalidArgument, "item 7 has no price")
				},
			})
		},
	}}}
}

// The verbs, their bad input (an unknown backfill, starting a running one, a
// wrong verb), and a failing batch whose last error status shows.
func TestBackfillVerbs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	env := dbEnv(db)
	app := verbsApp()
	r := clitest.Run(t, ctx, app, env, "migrate")
	require.Equal(t, 0, r.Code, r.Stderr)

	for _, args := range [][]string{{"backfill"}, {"backfill", "frobnicate", "alpha_fill"}, {"backfill", "start"},
		{"backfill", "list", "extra"}, {"backfill", "status", "alpha_fill", "--progress", "sparkles"}} {
		r = clitest.Run(t, ctx, app, env, args...)
		require.Equal(t, 1, r.Code)
		require.True(t, strings.HasPrefix(r.Stderr, "INVALID_ARGUMENT: "), r.Stderr)
	}
	r = clitest.Run(t, ctx, app, env, "backfill", "start", "nope")
	require.Equal(t, 1, r.Code)
	require.Equal(t, "NOT_FOUND: unknown backfill \"nope\": this binary knows alpha_fill, beta_fill, gamma_fill\n", r.Stderr)
	r = clitest.Run(t, ctx, cli.App{}, env, "backfill", "start", "alpha_fill")
	require.Equal(t, 1, r.Code, "a binary that does not register it does not know it")
	require.Contains(t, r.Stderr, "NOT_FOUND")

	r = clitest.Run(t, ctx, app, env, "backfill", "status", "alpha_fill")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "pending (never started)")
	// pause, resume and cancel of a never-started backfill: NOT_FOUND, the run
	// they would act on does not exist (CONFLICT is a run's state refusing them).
	for _, verb := range []string{"pause", "resume", "cancel"} {
		r = clitest.Run(t, ctx, app, env, "backfill", verb, "alpha_fill")
		require.Equal(t, 1, r.Code, verb)
		require.Equal(t, "NOT_FOUND: backfill alpha_fill was never started\n", r.Stderr, verb)
	}

	// Started with no worker running: it stays running, its first job waiting.
	r = clitest.Run(t, ctx, app, env, "backfill", "start", "alpha_fill")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "~500 rows to go")
	r = clitest.Run(t, ctx, app, env, "backfill", "start", "alpha_fill")
	require.Equal(t, 1, r.Code)
	require.Equal(t, "CONFLICT: backfill alpha_fill is already running (batch 0)\n", r.Stderr)
	r = clitest.Run(t, ctx, app, env, "backfill", "resume", "alpha_fill")
	require.Equal(t, 1, r.Code)
	require.True(t, strings.HasPrefix(r.Stderr, "CONFLICT: "), r.Stderr)
	r = clitest.Run(t, ctx, app, env, "backfill", "list")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Regexp(t, `alpha_fill\s+running\s+0\s+0\s+0%`, r.Stdout)
	require.Regexp(t, `beta_fill\s+pending`, r.Stdout)

	// A worker with leases that have room on a loaded machine.
	workertest.Start(t, db.Pool, bfRegistry(t, app), &workers.Options{LeaseTTL: 10 * time.Second, LeaseRenew: time.Second})
	r = clitest.Run(t, ctx, app, env, "backfill", "status", "alpha_fill", "--watch", "--every", "50ms", "--progress", "bar")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "100%", "the bar ends full")
	require.Contains(t, r.Stdout, "(500/500)")
	require.Contains(t, r.Stdout, "alpha_fill: done, 500 rows in 6 batches")
	r = clitest.Run(t, ctx, app, env, "backfill", "status", "alpha_fill")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Regexp(t, `(?m)^state:\s+done$`, r.Stdout)
	require.Regexp(t, `(?m)^progress:\s+500 rows in 6 batches$`, r.Stdout)
	require.Regexp(t, `(?m)^finished:`, r.Stdout)

	// A batch that fails: retried with backoff, its last error in status.
	r = clitest.Run(t, ctx, app, env, "backfill", "start", "beta_fill")
	require.Equal(t, 0, r.Code, r.Stderr)
	workertest.WaitFor(t, 30*time.Second, "beta's error recorded", func() bool {
		p, err := backfill.Get(ctx, db.Pool, "beta_fill")
		return err == nil && p.LastError != nil && p.JobState != nil && *p.JobState == "retryable"
	})
	r = clitest.Run(t, ctx, app, env, "backfill", "status", "beta_fill")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Regexp(t, `(?m)^state:\s+running, retrying batch 0 \(attempt \d+ of 25 failed; next at `, r.Stdout)
	require.Regexp(t, `(?m)^last error:\s+attempt \d+: backfill beta_fill batch 0: beta is broken: column b is cursed \(.*, \d+ failed attempts this run\)$`, r.Stdout)
	r = clitest.Run(t, ctx, app, env, "backfill", "list")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Regexp(t, `beta_fill\s+running\s+0\s+0\s+-\s+-\s+-\s+attempt \d+: backfill beta_fill batch 0: beta is broken`, r.Stdout)

	r = clitest.Run(t, ctx, app, env, "backfill", "pause", "beta_fill")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "paused backfill beta_fill after 0 rows in 0 batches")
	r = clitest.Run(t, ctx, app, env, "backfill", "pause", "beta_fill")
	require.Equal(t, 0, r.Code, "pausing a paused backfill changes nothing")
	r = clitest.Run(t, ctx, app, env, "backfill", "status", "beta_fill")
	require.Regexp(t, `(?m)^state:\s+paused$`, r.Stdout)
	require.Regexp(t, `(?m)^job:\s+\d+, cancelled, `, r.Stdout, "the waiting retry was cancelled in River")
	r = clitest.Run(t, ctx, app, env, "backfill", "cancel", "beta_fill")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "cancelled backfill beta_fill")
	r = clitest.Run(t, ctx, app, env, "backfill", "resume", "beta_fill")
	require.Equal(t, 1, r.Code)
	require.Equal(t, "CONFLICT: backfill beta_fill is cancelled: start runs it again\n", r.Stderr)
	r = clitest.Run(t, ctx, app, env, "backfill", "cancel", "alpha_fill")
	require.Equal(t, 1, r.Code)
	require.Equal(t, "CONFLICT: backfill alpha_fill is done: only a running or paused backfill is cancelled\n", r.Stderr)

	// A batch that finds the data wrong (INVALID_ARGUMENT): its job is cancelled
	// at once, and status and list show the backfill stalled with the error.
	r = clitest.Run(t, ctx, app, env, "backfill", "start", "gamma_fill")
	require.Equal(t, 0, r.Code, r.Stderr)
	workertest.WaitFor(t, 60*time.Second, "gamma's job cancelled", func() bool {
		p, err := backfill.Get(ctx, db.Pool, "gamma_fill")
		return err == nil && p.JobState != nil && *p.JobState == "cancelled"
	})
	r = clitest.Run(t, ctx, app, env, "backfill", "status", "gamma_fill")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Regexp(t, `(?m)^state:\s+stalled: its batch job \d+ is cancelled; resume carries it on$`, r.Stdout)
	require.Regexp(t, `(?m)^last error:\s+attempt 1: backfill gamma_fill batch 0: INVALID_ARGUMENT: item 7 has no price \(.*, 1 failed attempts this run\)$`, r.Stdout)
	r = clitest.Run(t, ctx, app, env, "backfill", "list")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Regexp(t, `gamma_fill\s+stalled\s+0\s+0\s+-\s+-\s+-\s+attempt 1: backfill gamma_fill batch 0: INVALID_ARGUMENT`, r.Stdout)

	// A binary that registers none of them lists them all the same, from the
	// database.
	r = clitest.Run(t, ctx, cli.App{}, env, "backfill", "list")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "also in the database, not registered by this binary: alpha_fill (done), beta_fill (cancelled), gamma_fill (running)\n")
}
