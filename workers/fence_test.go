package workers_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/clock"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/internal/lease"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

// staleArgs is worked by staleWorker. Both attempts park so the test can run
// them in the order River's measured bug needs: attempt 1 resumes and commits
// while attempt 2 is running. Fenced picks workers.InTx over a plain transaction.
type staleArgs struct {
	Fenced bool `json:"fenced"`
}

func (staleArgs) Kind() string { return "test_stale" }

type attemptCtl struct {
	started chan struct{}
	release chan struct{}
	result  chan error
}

type staleWorker struct {
	river.WorkerDefaults[staleArgs]
	attempts [3]attemptCtl // by attempt number (1 and 2)
}

func newStaleWorker() *staleWorker {
	w := &staleWorker{}
	for i := range w.attempts {
		w.attempts[i] = attemptCtl{started: make(chan struct{}), release: make(chan struct{}), result: make(chan error, 1)}
	}
	return w
}

func (w *staleWorker) Work(ctx context.Context, job *river.Job[staleArgs]) error {
	ctl := w.attempts[min(job.Attempt, 2)]
	close(ctl.started)
	<-ctl.release // paused, as a GC pause or SIGSTOP would
	write := func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO stale_writes (attempt, fenced) VALUES ($1, $2)`, job.Attempt, job.Args.Fenced)
		return err
	}
	var err error
	if job.Args.Fenced {
		err = workers.InTx(ctx, job, write)
	} else {
		// River alone: write and complete in a plain transaction.
		rt := workers.RuntimeFrom(ctx)
		err = pg.InTx(ctx, rt.Pool(), func(ctx context.Context, tx pgx.Tx) error {
			if err := write(ctx, tx); err != nil {
				return err
			}
			_, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job)
			return err
		})
	}
	ctl.result <- err
	return err
}

// runStale runs one job through the stale-attempt choreography and returns the
// errors of attempts 1 and 2: attempt 1 starts and parks; the job is rescued (made
// available, as River's rescuer or a shard takeover does); attempt 2 starts and
// parks; attempt 1 resumes and tries to commit while attempt 2 runs; then attempt 2
// resumes.
func runStale(t *testing.T, db *pgtest.DB, fenced bool) (err1, err2 error) {
	t.Helper()
	ctx := context.Background()
	w := newStaleWorker()
	reg := workers.NewRegistry()
	workers.AddWorker(reg, w)
	workertest.Start(t, db.Pool, reg, nil)

	var jobID int64
	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		res, err := jobs.InsertTx(ctx, tx, staleArgs{Fenced: fenced}, &river.InsertOpts{Queue: jobs.ShardQueue(3)})
		if err == nil {
			jobID = res.Job.ID
		}
		return err
	}))
	<-w.attempts[1].started
	db.MustExec(t, `UPDATE river_job SET state = 'available' WHERE id = $1`, jobID) // the rescue
	<-w.attempts[2].started
	close(w.attempts[1].release)
	err1 = <-w.attempts[1].result
	// Give attempt 1's outcome time to reach River's completer, which records
	// it by job id with only state = 'running' as its check: recorded now, a
	// stale attempt's outcome would snooze attempt 2 under it.
	time.Sleep(500 * time.Millisecond)
	close(w.attempts[2].release)
	err2 = <-w.attempts[2].result
	return err1, err2
}

// TestStaleAttemptIsFenced reproduces River's measured behaviour — attempt 1,
// paused past a rescue, commits its writes while attempt 2 runs, and attempt 2
// then completes nothing — and shows that with our fenced transaction attempt 1
// gets FENCED and writes nothing, and attempt 2's writes commit.
func TestStaleAttemptIsFenced(t *testing.T) {
	t.Parallel()
	t.Run("river alone lets the stale attempt commit", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t)
		db.MustExec(t, `CREATE TABLE stale_writes (attempt int NOT NULL, fenced bool NOT NULL)`)
		err1, _ := runStale(t, db, false)
		require.NoError(t, err1)
		require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM stale_writes WHERE attempt = 1`),
			"the stale attempt committed its write while attempt 2 was running")
	})
	t.Run("fenced", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t)
		db.MustExec(t, `CREATE TABLE stale_writes (attempt int NOT NULL, fenced bool NOT NULL)`)
		err1, err2 := runStale(t, db, true)
		require.Truef(t, fault.Has(err1, fault.Fenced), "attempt 1 must get FENCED, got %v", err1)
		require.NoError(t, err2)
		require.Equal(t, 0, db.MustCount(t, `SELECT count(*) FROM stale_writes WHERE attempt = 1`), "the stale attempt wrote nothing")
		require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM stale_writes WHERE attempt = 2`), "attempt 2's write committed")
		require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'test_stale' AND state = 'completed'`))
	})
}

// TestLostLeaseIsFenced: a transaction fenced by a lease that another owner took
// writes nothing, and a takeover waits for a fenced transaction in flight. The
// lease expires on the sim clock, not by waiting out a short real TTL.
func TestLostLeaseIsFenced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	db.MustExec(t, `CREATE TABLE fenced_writes (who text NOT NULL)`)
	require.NoError(t, clock.UseSim(ctx, db.Pool, time.Now()))

	a, err := lease.Acquire(ctx, db.Pool, "shard/1", "a", 10*time.Second)
	require.NoError(t, err)
	require.EqualValues(t, 1, a.Epoch)

	// While a's fenced transaction is open, b's takeover (after expiry) waits.
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	require.NoError(t, lease.FenceTx(ctx, tx, a))
	var pid int
	require.NoError(t, tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
	_, err = clock.Advance(ctx, db.Pool, 11*time.Second) // a's lease expires
	require.NoError(t, err)
	took := make(chan lease.Lease, 1)
	go func() {
		b, err := lease.Acquire(ctx, db.Pool, "shard/1", "b", 10*time.Second)
		if err == nil {
			took <- b
		}
		close(took)
	}()
	workertest.WaitFor(t, 30*time.Second, "the takeover waiting for the fenced transaction's lock", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`, pid) == 1
	})
	select {
	case <-took:
		t.Fatal("the takeover must wait for the fenced transaction in flight")
	default:
	}
	_, err = tx.Exec(ctx, `INSERT INTO fenced_writes VALUES ('a-before')`)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	b := <-took
	require.Equal(t, "b", b.Owner)
	require.EqualValues(t, 2, b.Epoch, "the epoch goes up when the owner changes")

	// After the takeover, a's fence finds nothing: FENCED, and nothing is written.
	err = pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		if err := lease.FenceTx(ctx, tx, a); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO fenced_writes VALUES ('a-after')`)
		return err
	})
	require.True(t, fault.Has(err, fault.Fenced), "got %v", err)
	require.Equal(t, 0, db.MustCount(t, `SELECT count(*) FROM fenced_writes WHERE who = 'a-after'`))
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM fenced_writes WHERE who = 'a-before'`))

	// Renewal by the holder keeps the epoch; release lets anyone take it at once.
	b2, err := lease.Acquire(ctx, db.Pool, "shard/1", "b", 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, b.Epoch, b2.Epoch)
	_, err = lease.Acquire(ctx, db.Pool, "shard/1", "c", 10*time.Second)
	require.True(t, fault.Has(err, fault.Conflict), "a held lease is CONFLICT for another owner, got %v", err)
	require.NoError(t, lease.Release(ctx, db.Pool, b2))
	c, err := lease.Acquire(ctx, db.Pool, "shard/1", "c", 10*time.Second)
	require.NoError(t, err)
	require.EqualValues(t, 3, c.Epoch)
}

// TestKeeperReportsLossAtOnce: when another owner takes a lease (here as if this
// process had been paused past its expiry), the keeper calls OnLost at its next
// round, and keeps the leases it still holds. The leases live 9 s: only the
// theft ends one.
func TestKeeperReportsLossAtOnce(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	db := pgtest.New(t)
	var mu sync.Mutex
	var lost, acquired []string
	k := lease.NewKeeper(lease.KeeperOptions{
		DB: db.Pool, Owner: "k1", TTL: 9 * time.Second, Renew: time.Second, Log: workertest.Logger(t),
		OnAcquired: func(a lease.Acquired) { mu.Lock(); acquired = append(acquired, a.Name); mu.Unlock() },
		OnLost:     func(l lease.Lease) { mu.Lock(); lost = append(lost, l.Name); mu.Unlock() },
	})
	k.Want("sink/a", "sink/b")
	go k.Run(ctx)
	workertest.WaitFor(t, 30*time.Second, "both acquired", func() bool { mu.Lock(); defer mu.Unlock(); return len(acquired) == 2 })

	// Another owner steals sink/a (as if k1 had been paused past its expiry).
	db.MustExec(t, `UPDATE compute_leases SET owner = 'thief', epoch = epoch + 1 WHERE name = 'sink/a'`)
	workertest.WaitFor(t, 30*time.Second, "loss reported", func() bool { mu.Lock(); defer mu.Unlock(); return len(lost) == 1 })
	mu.Lock()
	require.Equal(t, []string{"sink/a"}, lost)
	mu.Unlock()
	_, held := k.Held("sink/a")
	require.False(t, held)
	_, held = k.Held("sink/b")
	require.True(t, held)
}

type dropArgs struct {
	Drops int `json:"drops"` // how many times the transaction loses its connection
}

func (dropArgs) Kind() string { return "test_drop" }

type dropWorker struct {
	river.WorkerDefaults[dropArgs]
	calls atomic.Int32
}

func (w *dropWorker) Work(ctx context.Context, job *river.Job[dropArgs]) error {
	return workers.InTx(ctx, job, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO drop_writes (job_id) VALUES ($1)`, job.ID); err != nil {
			return err
		}
		if int(w.calls.Add(1)) <= job.Args.Drops {
			// The server ends this session mid-transaction, as a restart would.
			_, err := tx.Exec(ctx, `SELECT pg_terminate_backend(pg_backend_pid())`)
			return err
		}
		return nil
	})
}

// TestFencedTxRetriesALostConnection: a fenced transaction that loses its
// connection (the database restarted under it) is run again in place while the
// lease holds: the job completes in its first attempt, with no River retry and
// no error recorded, and its write is committed exactly once.
func TestFencedTxRetriesALostConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	db.MustExec(t, `CREATE TABLE drop_writes (job_id bigint NOT NULL)`)
	reg := workers.NewRegistry()
	w := &dropWorker{}
	workers.AddWorker(reg, w)
	workertest.Start(t, db.Pool, reg, &workers.Options{Shards: []int{0}})
	var id int64
	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		res, err := jobs.InsertTx(ctx, tx, dropArgs{Drops: 2}, &river.InsertOpts{Queue: jobs.ShardQueue(0)})
		id = res.Job.ID
		return err
	}))
	workertest.WaitFor(t, 20*time.Second, "the job completes", func() bool { return jobState(t, db, id) == "completed" })
	require.Equal(t, int32(3), w.calls.Load(), "two lost connections, then the commit")
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM drop_writes WHERE job_id = $1`, id))
	require.Equal(t, 1, db.MustCount(t, `SELECT attempt FROM river_job WHERE id = $1`, id), "no River retry")
	require.Equal(t, 0, db.MustCount(t, `SELECT coalesce(array_length(errors, 1), 0) FROM river_job WHERE id = $1`, id))
}

// outcomeArgs is worked by outcomeWorker: Mode picks what the attempt does, Name
// names a parked attempt's controls.
type outcomeArgs struct {
	Mode string `json:"mode"`
	Name string `json:"name,omitempty"`
}

func (outcomeArgs) Kind() string { return "test_outcome" }

// outcomeWorker's modes:
//
//	park          wait for the test's release, then write in InTx
//	cancel_in_fn  InTx whose function moves its own job out of running, then writes
//	invalid       return INVALID_ARGUMENT
//	fenced_once   return FENCED the first time, then complete
//	fail_once     return a plain error the first time, then complete
//	bad_text_once fail_once, with a NUL byte and invalid UTF-8 in the error
//	bad_text_cancel  river.JobCancel of an error with a NUL byte
type outcomeWorker struct {
	river.WorkerDefaults[outcomeArgs]
	mu     sync.Mutex
	parked map[string]*attemptCtl
	calls  map[int64]int
}

func newOutcomeWorker(names ...string) *outcomeWorker {
	w := &outcomeWorker{parked: map[string]*attemptCtl{}, calls: map[int64]int{}}
	for _, n := range names {
		w.parked[n] = &attemptCtl{started: make(chan struct{}), release: make(chan struct{}), result: make(chan error, 1)}
	}
	return w
}

func (w *outcomeWorker) Work(ctx context.Context, job *river.Job[outcomeArgs]) error {
	w.mu.Lock()
	w.calls[job.ID]++
	n := w.calls[job.ID]
	ctl := w.parked[job.Args.Name]
	w.mu.Unlock()
	write := func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO outcome_writes (job_id) VALUES ($1)`, job.ID)
		return err
	}
	switch job.Args.Mode {
	case "park":
		if n > 1 {
			return fault.New(fault.Fenced, "a later attempt of a parked job") // given back again
		}
		close(ctl.started)
		<-ctl.release // paused, as a GC pause or SIGSTOP would
		// Detached from the job's context, so the fences decide, not a
		// cancellation the keeper may send when it notices the loss.
		err := workers.InTx(context.WithoutCancel(ctx), job, write)
		ctl.result <- err
		return err
	case "cancel_in_fn":
		err := workers.InTx(ctx, job, func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `UPDATE river_job SET state = 'cancelled', finalized_at = $2 WHERE id = $1`, job.ID, time.Now()); err != nil {
				return err
			}
			return write(ctx, tx)
		})
		ctl.result <- err
		return err
	case "invalid":
		return fault.New(fault.InvalidArgument, "job %d cannot be worked", job.ID)
	case "fenced_once":
		if n == 1 {
			return fault.New(fault.Fenced, "job %d: fenced once", job.ID)
		}
	case "fail_once":
		if n == 1 {
			return errors.New("a transient failure")
		}
	case "bad_text_once":
		if n == 1 {
			return errors.New("card \x00declined \xff")
		}
	case "bad_text_cancel":
		return river.JobCancel(errors.New("card \x00declined for good"))
	}
	return workers.InTx(ctx, job, write)
}

// startOutcome starts a runtime on shard 0 with leases that expire only when the
// test makes them (10 s TTL), and the worker w.
func startOutcome(t *testing.T, db *pgtest.DB, w *outcomeWorker) *workers.Runtime {
	t.Helper()
	db.MustExec(t, `CREATE TABLE outcome_writes (job_id bigint NOT NULL)`)
	reg := workers.NewRegistry()
	require.NoError(t, workers.AddWorker(reg, w))
	rt := workertest.Start(t, db.Pool, reg, &workers.Options{Shards: []int{0}, LeaseTTL: 10 * time.Second, LeaseRenew: 3 * time.Second})
	workertest.WaitFor(t, 30*time.Second, "shard 0's lease held", func() bool { _, ok := rt.LeaseForQueue(jobs.ShardQueue(0)); return ok })
	return rt
}

func insertOutcome(t *testing.T, db *pgtest.DB, args outcomeArgs, opts *river.InsertOpts) int64 {
	t.Helper()
	if opts == nil {
		opts = &river.InsertOpts{}
	}
	opts.Queue = jobs.ShardQueue(0)
	var id int64
	require.NoError(t, pg.InTx(context.Background(), db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		res, err := jobs.InsertTx(ctx, tx, args, opts)
		if err == nil {
			id = res.Job.ID
		}
		return err
	}))
	return id
}

// TestInTxAfterTheShardLeaseIsLost: an attempt that started while its process
// held the shard lease, and reaches InTx after another owner took the lease,
// gets FENCED and writes nothing, and its job is not completed.
func TestInTxAfterTheShardLeaseIsLost(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	w := newOutcomeWorker("a")
	startOutcome(t, db, w)
	id := insertOutcome(t, db, outcomeArgs{Mode: "park", Name: "a"}, nil)
	<-w.parked["a"].started

	// Another owner takes the lease (as after this process was paused past its
	// expiry), and keeps it.
	db.MustExec(t, `UPDATE compute_leases SET owner = 'thief', epoch = epoch + 1, expires_at = compute_now() + interval '1 hour' WHERE name = 'shard/0'`)
	close(w.parked["a"].release)
	err := <-w.parked["a"].result
	require.Equal(t, fault.Fenced, fault.CodeOf(err), "InTx after the lease was lost: %v", err)
	require.Equal(t, 0, db.MustCount(t, `SELECT count(*) FROM outcome_writes`), "the fenced attempt wrote nothing")
	require.NotEqual(t, "completed", jobState(t, db, id), "the fenced attempt did not complete its job")
}

// TestInTxRefusesAJobNoLongerRunning: the fenced transaction commits only for a
// job still running this attempt. A job that left running while its attempt was
// paused (an operator cancelled it) is refused by the fence; one that leaves
// running inside the transaction itself is refused by the completion-state
// check. Either way: FENCED, and nothing the attempt wrote is committed.
func TestInTxRefusesAJobNoLongerRunning(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	w := newOutcomeWorker("paused", "in_fn")
	startOutcome(t, db, w)

	id := insertOutcome(t, db, outcomeArgs{Mode: "park", Name: "paused"}, nil)
	<-w.parked["paused"].started
	db.MustExec(t, `UPDATE river_job SET state = 'cancelled', finalized_at = $2 WHERE id = $1`, id, time.Now())
	close(w.parked["paused"].release)
	err := <-w.parked["paused"].result
	require.Equal(t, fault.Fenced, fault.CodeOf(err), "a cancelled job's attempt: %v", err)
	require.Contains(t, err.Error(), "stale")
	require.Equal(t, 0, db.MustCount(t, `SELECT count(*) FROM outcome_writes WHERE job_id = $1`, id))
	require.Equal(t, "cancelled", jobState(t, db, id))

	id = insertOutcome(t, db, outcomeArgs{Mode: "cancel_in_fn", Name: "in_fn"}, nil)
	err = <-w.parked["in_fn"].result
	require.Equal(t, fault.Fenced, fault.CodeOf(err), "completion found the job cancelled: %v", err)
	require.Contains(t, err.Error(), "completion found it cancelled")
	require.Equal(t, 0, db.MustCount(t, `SELECT count(*) FROM outcome_writes WHERE job_id = $1`, id), "the transaction was rolled back")
}

// TestErrorsWithBadTextAreRecorded: an error whose message holds a NUL byte
// or invalid UTF-8 (which River's jsonb errors column refuses: River's
// completer then failed its whole batch of completions and gave up, leaving
// the jobs running) is recorded with those bytes dropped or replaced, and the
// job goes on as any other error's: retried, or cancelled by the worker.
func TestErrorsWithBadTextAreRecorded(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	w := newOutcomeWorker()
	startOutcome(t, db, w)
	retried := insertOutcome(t, db, outcomeArgs{Mode: "bad_text_once"}, nil)
	cancelled := insertOutcome(t, db, outcomeArgs{Mode: "bad_text_cancel"}, nil)
	read := func(id int64) (state string, attempt int, lastErr string) {
		require.NoError(t, db.QueryRow(context.Background(), `SELECT state::text, attempt,
				coalesce(errors[array_length(errors, 1)]->>'error', '') FROM river_job WHERE id = $1`, id).
			Scan(&state, &attempt, &lastErr))
		return state, attempt, lastErr
	}
	for id, want := range map[int64]string{retried: "completed", cancelled: "cancelled"} {
		workertest.WaitFor(t, 60*time.Second, fmt.Sprintf("job %d %s", id, want), func() bool {
			state, _, _ := read(id)
			return state == want
		})
	}
	_, attempt, lastErr := read(retried)
	require.Equal(t, 2, attempt, "retried once")
	require.Contains(t, lastErr, "card declined \uFFFD")
	_, attempt, lastErr = read(cancelled)
	require.Equal(t, 1, attempt)
	require.Contains(t, lastErr, "card declined for good")
}

// TestErrorsBecomeRiverOutcomes: the one mapping of errors to River outcomes, as
// River records them in river_job. INVALID_ARGUMENT and arguments that do not
// decode cancel the job at its first attempt; FENCED snoozes it (no error
// recorded, no attempt used) and it runs again; any other error is a River
// retry (an error recorded, a second attempt).
func TestErrorsBecomeRiverOutcomes(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	w := newOutcomeWorker()
	startOutcome(t, db, w)

	invalid := insertOutcome(t, db, outcomeArgs{Mode: "invalid"}, nil)
	fenced := insertOutcome(t, db, outcomeArgs{Mode: "fenced_once"}, nil)
	failed := insertOutcome(t, db, outcomeArgs{Mode: "fail_once"}, nil)
	// Arguments that do not decode: inserted scheduled far ahead, broken, then due.
	undecodable := insertOutcome(t, db, outcomeArgs{Mode: "ok"}, &river.InsertOpts{ScheduledAt: time.Now().Add(time.Hour)})
	db.MustExec(t, `UPDATE river_job SET args = '{"mode": 5}', state = 'available', scheduled_at = $2 WHERE id = $1`, undecodable, time.Now())

	type row struct {
		State    string
		Attempt  int
		Errors   int
		Snoozes  int
		LastErr  string
		Finished bool
	}
	read := func(id int64) row {
		var r row
		require.NoError(t, db.QueryRow(context.Background(), `SELECT state::text, attempt, coalesce(array_length(errors, 1), 0),
				coalesce((metadata->>'snoozes')::int, 0), coalesce(errors[array_length(errors, 1)]->>'error', ''), finalized_at IS NOT NULL
			FROM river_job WHERE id = $1`, id).
			Scan(&r.State, &r.Attempt, &r.Errors, &r.Snoozes, &r.LastErr, &r.Finished))
		return r
	}
	for _, id := range []int64{invalid, fenced, failed, undecodable} {
		workertest.WaitFor(t, 60*time.Second, fmt.Sprintf("job %d finalized", id), func() bool { return read(id).Finished })
	}

	r := read(invalid)
	require.Equal(t, row{State: "cancelled", Attempt: 1, Errors: 1, LastErr: r.LastErr, Finished: true}, r, "INVALID_ARGUMENT cancels at once")
	require.Contains(t, r.LastErr, "INVALID_ARGUMENT")
	r = read(undecodable)
	require.Equal(t, row{State: "cancelled", Attempt: 1, Errors: 1, LastErr: r.LastErr, Finished: true}, r, "undecodable args cancel at once")
	require.Contains(t, r.LastErr, "do not decode")
	require.Equal(t, row{State: "completed", Attempt: 1, Snoozes: 1, Finished: true}, read(fenced),
		"FENCED snoozes: no error, no attempt used, run again")
	r = read(failed)
	require.Equal(t, row{State: "completed", Attempt: 2, Errors: 1, LastErr: r.LastErr, Finished: true}, r, "a plain error is retried")
	require.Contains(t, r.LastErr, "a transient failure")
	require.Equal(t, 2, db.MustCount(t, `SELECT count(*) FROM outcome_writes`), "the snoozed and the retried job wrote once each")
}
