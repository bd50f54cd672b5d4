package backfillworker

import (
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/backfill"
	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

// insertDuplicate inserts a copy of a batch job (epoch, batch) of name into
// queue, as a stale or duplicate runner would have it.
func insertDuplicate(ctx context.Context, db *pgtest.DB, name string, epoch, batch int64, queue string) error {
	args, _ := json.Marshal(jobs.BackfillBatch{Name: name, Epoch: epoch, Batch: batch})
	_, err := db.Exec(ctx, `INSERT INTO river_job (args, kind, max_attempts, priority, queue, state, tags, metadata)
		VALUES ($1::jsonb, $2, 25, 1, $3, 'available', '{backfill}', '{}')`, string(args), "backfill_"+name, queue)
	return err
}

// Two worker runtimes race one backfill: each serves half the shards, duplicate
// jobs for the current and the next batch are injected into queues of both all
// along, and midway the runtime that holds the backfill's own shard is stopped
// and replaced (a takeover with a handback). Every row is handled by exactly one
// committed batch, the final state is right, and the counters equal a recount.
func TestTwoRuntimesRaceOneBackfill(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newDB(t)
	const rows, size = 3000, 50
	makeTable(t, db, "race_items", rows)
	b := fillBackfill("race_fill", "race_items", nil, nil)
	b.BatchSize = size
	b.FixedBatchSize = false // sized by time, up to size

	var even, odd []int
	for i := 0; i < testShards; i++ {
		if i%2 == 0 {
			even = append(even, i)
		} else {
			odd = append(odd, i)
		}
	}
	home := jobs.ShardOf(jobs.BackfillShardKey(b.Name), testShards)
	homeShards, otherShards := even, odd
	if home%2 == 1 {
		homeShards, otherShards = odd, even
	}
	rtHome := startWorker(t, db, registry(t, b), &workers.Options{Shards: homeShards})
	startWorker(t, db, registry(t, b), &workers.Options{Shards: otherShards})

	_, err := startBackfill(ctx, db.Pool, b)
	require.NoError(t, err)

	// Inject duplicates until the backfill is done.
	stop := make(chan struct{})
	var injected atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			p, err := backfill.Get(ctx, db.Pool, b.Name)
			if err != nil || p.State != backfill.Running {
				continue
			}
			for _, batch := range []int64{p.Batches, p.Batches + 1} {
				q := jobs.ShardQueue(rand.IntN(testShards))
				if err := insertDuplicate(ctx, db, b.Name, p.Epoch, batch, q); err == nil {
					injected.Add(1)
				}
			}
		}
	}()

	// Midway, the home runtime stops (gracefully: its in-flight batch finishes
	// or is handed back) and a new one takes its shards.
	workertest.WaitFor(t, 60*time.Second, "a third of the batches", func() bool {
		return mustGet(t, db, b.Name).Batches >= rows/size/3
	})
	require.NoError(t, rtHome.Stop(ctx))
	startWorker(t, db, registry(t, b), &workers.Options{Shards: homeShards})

	waitState(t, db, b.Name, backfill.Done, 60*time.Second)
	close(stop)
	wg.Wait()
	// Every injected duplicate runs and completes; only the job the backfill's
	// row names committed batches (one each, requireRecount checks), so the
	// duplicates completed doing nothing.
	workertest.WaitFor(t, 30*time.Second, "every duplicate job worked", func() bool { return liveJobs(t, db, b.Name) == 0 })
	p := requireRecount(t, db, b.Name, "race_items", rows)
	completed := db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'backfill_race_fill' AND state = 'completed'`)
	require.Greater(t, injected.Load(), int64(0))
	require.Greater(t, int64(completed), injected.Load(), "stale duplicates completed as no-ops, beside the backfill's own jobs")
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'backfill_race_fill' AND state NOT IN ('completed')`),
		"no duplicate failed, was cancelled or discarded")
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'backfill_race_fill' AND tags <> '{backfill}'`),
		"every backfill job is tagged backfill")
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind LIKE 'backfill%' AND kind <> 'backfill_race_fill'`),
		"the backfill's jobs have its own kind")
	if os.Getenv("BF_DEBUG") != "" {
		rows, _ := db.Query(ctx, `SELECT (args->>'batch')::int, attempt, extract(epoch FROM attempted_at - scheduled_at)::numeric(8,3), extract(epoch FROM finalized_at - attempted_at)::numeric(8,3), queue, coalesce(attempted_by[1], '') FROM river_job WHERE kind = 'backfill_race_fill' ORDER BY id LIMIT 400`)
		for rows.Next() {
			var b, a int
			var wait, run float64
			var q, by string
			_ = rows.Scan(&b, &a, &wait, &run, &q, &by)
			t.Logf("batch %d attempt %d wait %.3f run %.3f %s %s", b, a, wait, run, q, by)
		}
		rows.Close()
	}
	t.Logf("batches %d, completed jobs %d (%d duplicates injected), runners %d", p.Batches, completed, injected.Load(),
		db.MustCount(t, `SELECT count(DISTINCT owner) FROM bf_handled WHERE tbl = 'race_items'`))
}

// gate makes each batch announce itself on entered and wait for release, until
// free is set.
type gate struct {
	entered chan int
	release chan struct{}
	free    atomic.Bool
}

func newGate() *gate { return &gate{entered: make(chan int), release: make(chan struct{})} }

func (g *gate) hook(ctx context.Context, call int) error {
	if g.free.Load() {
		return nil
	}
	select {
	case g.entered <- call:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-g.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// waitForLockWaiter waits until a session of the test database waits for a row
// lock: a pause or cancel queued behind the batch in flight. Releasing the batch
// before that would let the next batch start first.
func waitForLockWaiter(t *testing.T, db *pgtest.DB) {
	t.Helper()
	workertest.WaitFor(t, 30*time.Second, "a session waiting for the batch's lock", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`) > 0
	})
}

// step lets n batches through, one at a time, and waits until the next one has
// entered (it holds the backfill's row until released).
func (g *gate) step(t *testing.T, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		select {
		case <-g.entered:
		case <-time.After(30 * time.Second):
			t.Fatal("no batch entered")
		}
		g.release <- struct{}{}
	}
	select {
	case <-g.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("no batch entered")
	}
}

// Pause takes effect at the batch boundary: it waits for the batch in flight,
// and no batch starts after it returns. Resume carries on to a correct finish.
func TestPauseAndResume(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newDB(t)
	const rows, size = 1000, 100
	makeTable(t, db, "pause_items", rows)
	g := newGate()
	b := fillBackfill("pause_fill", "pause_items", g.hook, nil)
	b.BatchSize = size
	startWorker(t, db, registry(t, b), nil)

	_, err := startBackfill(ctx, db.Pool, b)
	require.NoError(t, err)
	g.step(t, 3) // three batches committed, the fourth in flight

	paused := make(chan *backfill.Progress, 1)
	go func() {
		p, err := backfill.Pause(ctx, db.Pool, b.Name)
		if err != nil {
			t.Errorf("pause: %v", err)
		}
		paused <- p
	}()
	waitForLockWaiter(t, db) // the pause waits for the batch in flight
	g.release <- struct{}{}  // the fourth batch commits; then the pause goes through
	p := <-paused
	require.NotNil(t, p)
	require.Equal(t, backfill.Paused, p.State)
	require.EqualValues(t, 4, p.Batches, "the batch in flight when pause was called committed")
	require.EqualValues(t, 4*size, p.RowsDone)

	// Nothing runs while paused: the next batch's job was cancelled, or ran and
	// found the new epoch. No live job means no batch can start.
	workertest.WaitFor(t, 30*time.Second, "no live job while paused", func() bool { return liveJobs(t, db, b.Name) == 0 })
	select {
	case call := <-g.entered:
		t.Fatalf("batch call %d started while paused", call)
	default:
	}
	p = mustGet(t, db, b.Name)
	require.Equal(t, backfill.Paused, p.State)
	require.EqualValues(t, 4*size, p.RowsDone)
	require.Equal(t, 4*size, db.MustCount(t, `SELECT count(*) FROM pause_items WHERE filled IS NOT NULL`))

	// Pausing again is a no-op; starting a paused one is refused.
	again, err := backfill.Pause(ctx, db.Pool, b.Name)
	require.NoError(t, err)
	require.Equal(t, p.Epoch, again.Epoch)
	_, err = startBackfill(ctx, db.Pool, b)
	require.True(t, fault.Has(err, fault.Conflict), "start of a paused backfill: %v", err)

	g.free.Store(true)
	r, err := backfill.Resume(ctx, db.Pool, b.Name)
	require.NoError(t, err)
	require.Equal(t, backfill.Running, r.State)
	require.Greater(t, r.Epoch, p.Epoch)
	waitState(t, db, b.Name, backfill.Done, 30*time.Second)
	requireRecount(t, db, b.Name, "pause_items", rows)

	_, err = backfill.Resume(ctx, db.Pool, b.Name)
	require.True(t, fault.Has(err, fault.Conflict), "resume of a done backfill: %v", err)
}

// Cancel stops a backfill at the batch boundary for good; start runs it again
// from zero counters, and it finishes with every row filled once.
func TestCancelAndStartAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newDB(t)
	const rows, size = 800, 100
	makeTable(t, db, "cancel_items", rows)
	g := newGate()
	b := fillBackfill("cancel_fill", "cancel_items", g.hook, nil)
	b.BatchSize = size
	startWorker(t, db, registry(t, b), nil)

	first, err := startBackfill(ctx, db.Pool, b)
	require.NoError(t, err)
	require.NotNil(t, first.RowsEstimate)
	require.EqualValues(t, rows, *first.RowsEstimate, "start records the estimate")
	_, err = startBackfill(ctx, db.Pool, b)
	require.True(t, fault.Has(err, fault.Conflict), "start of a running backfill: %v", err)

	g.step(t, 2)
	cancelled := make(chan *backfill.Progress, 1)
	go func() {
		p, err := backfill.Cancel(ctx, db.Pool, b.Name)
		if err != nil {
			t.Errorf("cancel: %v", err)
		}
		cancelled <- p
	}()
	waitForLockWaiter(t, db) // the cancel waits for the batch in flight
	g.release <- struct{}{}
	p := <-cancelled
	require.NotNil(t, p)
	require.Equal(t, backfill.Cancelled, p.State)
	require.EqualValues(t, 3, p.Batches)
	require.NotNil(t, p.FinishedAt)
	workertest.WaitFor(t, 30*time.Second, "no live job after cancel", func() bool { return liveJobs(t, db, b.Name) == 0 })
	require.Equal(t, 3*size, db.MustCount(t, `SELECT count(*) FROM cancel_items WHERE filled IS NOT NULL`))
	require.EqualValues(t, 3*size, mustGet(t, db, b.Name).RowsDone)

	_, err = backfill.Pause(ctx, db.Pool, b.Name)
	require.True(t, fault.Has(err, fault.Conflict), "pause of a cancelled backfill: %v", err)
	_, err = backfill.Resume(ctx, db.Pool, b.Name)
	require.True(t, fault.Has(err, fault.Conflict), "resume of a cancelled backfill: %v", err)

	g.free.Store(true)
	again, err := startBackfill(ctx, db.Pool, b)
	require.NoError(t, err)
	require.Zero(t, again.RowsDone)
	require.Zero(t, again.Batches)
	require.EqualValues(t, rows-3*size, *again.RowsEstimate)
	done := waitState(t, db, b.Name, backfill.Done, 30*time.Second)
	require.EqualValues(t, rows-3*size, done.RowsDone, "the second run counts its own rows")
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM cancel_items WHERE filled IS DISTINCT FROM v * 2`))
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM (SELECT row_id FROM bf_handled WHERE tbl = 'cancel_items'
		GROUP BY row_id HAVING count(*) > 1) d`))
}

// A batch that fails is rolled back, its error is the backfill's last_error,
// River retries it with backoff, and the backfill finishes with correct counts.
func TestFailingBatchIsRetriedWithItsLastError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newDB(t)
	const rows = 300
	makeTable(t, db, "fail_items", rows)
	var failed atomic.Bool
	b := fillBackfill("fail_fill", "fail_items", nil, func(ctx context.Context, tx pgx.Tx) error {
		// The second batch fails once, after its update: the rollback must undo it.
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM fail_items WHERE filled IS NOT NULL`).Scan(&n); err != nil {
			return err
		}
		if n == 200 && failed.CompareAndSwap(false, true) {
			return errors.New("boom: the disk is on fire")
		}
		return nil
	})
	startWorker(t, db, registry(t, b), nil)
	_, err := startBackfill(ctx, db.Pool, b)
	require.NoError(t, err)

	var p *backfill.Progress
	workertest.WaitFor(t, 30*time.Second, "the last error recorded", func() bool {
		p = mustGet(t, db, b.Name)
		return p.LastError != nil
	})
	require.Contains(t, *p.LastError, "boom: the disk is on fire")
	require.Contains(t, *p.LastError, "attempt 1")
	require.EqualValues(t, 1, p.Errors)
	require.NotNil(t, p.LastErrorAt)

	p = waitState(t, db, b.Name, backfill.Done, 30*time.Second)
	requireRecount(t, db, b.Name, "fail_items", rows)
	require.Contains(t, *p.LastError, "boom", "the last error stays for the record")
	// The job that ran the failed batch (the one the drain was in, whatever
	// batch it was enqueued for) was retried by River, once.
	var attempt int
	var errs int
	require.NoError(t, db.QueryRow(ctx, `SELECT attempt, array_length(errors, 1) FROM river_job
		WHERE kind = 'backfill_fail_fill' AND coalesce(array_length(errors, 1), 0) > 0`).Scan(&attempt, &errs))
	require.Equal(t, 2, attempt, "the failed batch was retried by River")
	require.Equal(t, 1, errs)
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'backfill_fail_fill'
		AND coalesce(array_length(errors, 1), 0) > 0`), "one job failed")
}

// A running backfill whose job is gone (an operator cancelled it in River UI)
// shows as stalled; resume carries it on.
func TestResumeStalledBackfill(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newDB(t)
	makeTable(t, db, "stall_items", 500)
	b := fillBackfill("stall_fill", "stall_items", nil, nil)
	b.Pause = time.Hour // the second batch waits, 'scheduled'
	rt := startWorker(t, db, registry(t, b), nil)
	_, err := startBackfill(ctx, db.Pool, b)
	require.NoError(t, err)

	var p *backfill.Progress
	workertest.WaitFor(t, 30*time.Second, "first batch", func() bool {
		p = mustGet(t, db, b.Name)
		return p.Batches == 1
	})
	require.Equal(t, "scheduled", *p.JobState, "a pause longer than River's scheduler interval schedules the job")
	require.True(t, p.JobScheduledAt.After(time.Now().Add(50*time.Minute)))
	require.False(t, p.Stalled())
	_, err = backfill.Resume(ctx, db.Pool, b.Name)
	require.True(t, fault.Has(err, fault.Conflict), "resume of a running backfill with a live job: %v", err)

	_, err = rt.Client().JobCancel(ctx, *p.JobID) // as River UI's cancel does
	require.NoError(t, err)
	p = mustGet(t, db, b.Name)
	require.Equal(t, "cancelled", *p.JobState)
	require.True(t, p.Stalled())

	r, err := backfill.Resume(ctx, db.Pool, b.Name)
	require.NoError(t, err)
	require.Equal(t, backfill.Running, r.State)
	require.True(t, r.JobLive())
	require.Greater(t, r.Epoch, p.Epoch)
	require.EqualValues(t, 1, r.Batches)
	waitFor := func() bool { return mustGet(t, db, b.Name).Batches == 2 }
	workertest.WaitFor(t, 30*time.Second, "the resumed batch", waitFor)
}

// Pausing a backfill whose next job waits in River cancels that job, with the
// reason in its errors (River UI shows it).
func TestPauseCancelsTheWaitingJob(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newDB(t)
	makeTable(t, db, "wait_items", 300)
	b := fillBackfill("wait_fill", "wait_items", nil, nil)
	b.Pause = time.Hour
	startWorker(t, db, registry(t, b), nil)
	_, err := startBackfill(ctx, db.Pool, b)
	require.NoError(t, err)
	var p *backfill.Progress
	workertest.WaitFor(t, 30*time.Second, "first batch", func() bool {
		p = mustGet(t, db, b.Name)
		return p.Batches == 1
	})
	job := *p.JobID
	p, err = backfill.Pause(ctx, db.Pool, b.Name)
	require.NoError(t, err)
	require.Equal(t, backfill.Paused, p.State)
	require.Equal(t, "cancelled", *p.JobState)
	var why string
	require.NoError(t, db.QueryRow(ctx, `SELECT errors[array_length(errors, 1)]->>'error' FROM river_job WHERE id = $1`, job).Scan(&why))
	require.Equal(t, "backfill wait_fill was paused by an operator", why)
	require.Zero(t, liveJobs(t, db, b.Name))
}

// A job whose args name another backfill than its kind says is cancelled, and
// changes nothing.
func TestMismatchedJobIsCancelled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newDB(t)
	makeTable(t, db, "odd_items", 10)
	b := fillBackfill("odd_fill", "odd_items", nil, nil)
	startWorker(t, db, registry(t, b), nil)
	args, _ := json.Marshal(jobs.BackfillBatch{Name: "other", Epoch: 1, Batch: 0})
	var id int64
	q := jobs.ShardQueue(jobs.ShardOf(jobs.BackfillShardKey(b.Name), testShards))
	require.NoError(t, db.QueryRow(ctx, `INSERT INTO river_job (args, kind, max_attempts, priority, queue, state, tags, metadata)
		VALUES ($1::jsonb, 'backfill_odd_fill', 25, 1, $2, 'available', '{}', '{}') RETURNING id`, string(args), q).Scan(&id))
	workertest.WaitFor(t, 30*time.Second, "job cancelled", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM river_job WHERE id = $1 AND state = 'cancelled'`, id) == 1
	})
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM odd_items WHERE filled IS NOT NULL`))
}

func TestRegisterRejectsBadBackfills(t *testing.T) {
	t.Parallel()
	ok := func(context.Context, pgx.Tx, int) (int, error) { return 0, nil }
	for _, tc := range []struct {
		name string
		b    Backfill
		want string
	}{
		{"bad name", Backfill{Name: "Bad-Name", Batch: ok}, "backfill name"},
		{"no batch", Backfill{Name: "x"}, "no Batch function"},
		{"huge batch", Backfill{Name: "x", Batch: ok, BatchSize: MaxBatchSize + 1}, "BatchSize"},
		{"negative pause", Backfill{Name: "x", Batch: ok, Pause: -time.Second}, "Pause"},
		{"negative rate", Backfill{Name: "x", Batch: ok, MaxRowsPerSecond: -1}, "MaxRowsPerSecond"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Add(workers.NewRegistry(), tc.b)
			require.True(t, fault.Has(err, fault.InvalidConfig), "%v", err)
			require.Contains(t, err.Error(), tc.want)
		})
	}
	reg := workers.NewRegistry()
	require.NoError(t, Add(reg, Backfill{Name: "b_second", Batch: ok}))
	require.NoError(t, Add(reg, Backfill{Name: "a_first", Batch: ok, BatchSize: 10}))
	err := Add(reg, Backfill{Name: "a_first", Batch: ok})
	require.True(t, fault.Has(err, fault.InvalidConfig), "%v", err)
	require.Contains(t, err.Error(), "registered twice")

	got := Registered(reg)
	require.Len(t, got, 2)
	require.Equal(t, "a_first", got[0].Name)
	require.Equal(t, 10, got[0].BatchSize)
	require.Equal(t, DefaultBatchSize, got[1].BatchSize, "defaults applied")
	_, err = Lookup(reg, "nope")
	require.True(t, fault.Has(err, fault.NotFound), "%v", err)
	require.Contains(t, err.Error(), "a_first, b_second")
	_, err = Lookup(workers.NewRegistry(), "nope")
	require.Contains(t, err.Error(), "registers no backfills")
}

func TestDelay(t *testing.T) {
	t.Parallel()
	b := Backfill{Pause: 100 * time.Millisecond}
	require.Equal(t, 100*time.Millisecond, delayAfter(b, 1000, time.Second))
	b.MaxRowsPerSecond = 500 // 1,000 rows may take 2 s
	require.Equal(t, 1500*time.Millisecond, delayAfter(b, 1000, 500*time.Millisecond))
	require.Equal(t, 100*time.Millisecond, delayAfter(b, 1000, 3*time.Second), "the pause is the least")
	require.Equal(t, 100*time.Millisecond, delayAfter(b, 0, 0))
}

func TestJobArgsDecode(t *testing.T) {
	t.Parallel()
	var a jobs.BackfillBatch
	require.NoError(t, json.Unmarshal([]byte(`{"name":"x_y","epoch":2,"batch":5}`), &a))
	require.Equal(t, "backfill_x_y", a.Kind())
	for _, bad := range []string{`{"name":"","epoch":1}`, `{"name":"X","epoch":1}`, `{"name":"x","epoch":0}`, `{"name":"x","epoch":1,"batch":-1}`} {
		require.Equal(t, fault.InvalidArgument, fault.CodeOf(json.Unmarshal([]byte(bad), &a)), bad)
	}
}

func TestNeverStarted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newDB(t)
	b := Backfill{Name: "never", Batch: func(context.Context, pgx.Tx, int) (int, error) { return 0, nil }}
	for _, f := range []func() error{
		func() error { _, err := backfill.Get(ctx, db.Pool, b.Name); return err },
		func() error { _, err := backfill.Pause(ctx, db.Pool, b.Name); return err },
		func() error { _, err := backfill.Cancel(ctx, db.Pool, b.Name); return err },
		func() error { _, err := backfill.Resume(ctx, db.Pool, b.Name); return err },
	} {
		err := f()
		require.True(t, fault.Has(err, fault.NotFound), "%v", err)
		require.True(t, strings.Contains(err.Error(), "never started"), "%v", err)
	}
	list, err := backfill.List(ctx, db.Pool)
	require.NoError(t, err)
	require.Empty(t, list)
}
