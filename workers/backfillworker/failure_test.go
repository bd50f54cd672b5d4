package backfillworker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/backfill"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

// waitJob waits until River's job id is in one of states, and returns its state.
func waitJob(t *testing.T, db *pgtest.DB, id int64, states ...string) string {
	t.Helper()
	var state string
	workertest.WaitFor(t, 60*time.Second, fmt.Sprintf("job %d %v", id, states), func() bool {
		require.NoError(t, db.QueryRow(context.Background(), `SELECT state FROM river_job WHERE id = $1`, id).Scan(&state))
		for _, s := range states {
			if state == s {
				return true
			}
		}
		return false
	})
	return state
}

// waitErrors waits until the backfill's run has recorded n failed attempts.
func waitErrors(t *testing.T, db *pgtest.DB, name string, n int64) *backfill.Progress {
	t.Helper()
	var p *backfill.Progress
	workertest.WaitFor(t, 60*time.Second, fmt.Sprintf("backfill %s: %d failed attempts recorded", name, n), func() bool {
		p = mustGet(t, db, name)
		return p.Errors >= n
	})
	require.EqualValues(t, n, p.Errors)
	require.NotNil(t, p.LastError)
	return p
}

// retryUntilDone makes the job's retries due at once (as River UI's retry
// does) until the backfill is done.
func retryUntilDone(t *testing.T, db *pgtest.DB, rt *workers.Runtime, name string, job int64) *backfill.Progress {
	t.Helper()
	var p *backfill.Progress
	workertest.WaitFor(t, 60*time.Second, "backfill "+name+" done", func() bool {
		p = mustGet(t, db, name)
		if p.State == backfill.Done {
			return true
		}
		var state string
		require.NoError(t, db.QueryRow(context.Background(), `SELECT state FROM river_job WHERE id = $1`, job).Scan(&state))
		if state == "retryable" {
			_, err := rt.Client().JobRetry(context.Background(), job)
			require.NoError(t, err)
		}
		return false
	})
	return p
}

// jobErrors returns the error texts River recorded for job id, in order.
func jobErrors(t *testing.T, db *pgtest.DB, id int64) []string {
	t.Helper()
	var errs []string
	require.NoError(t, db.QueryRow(context.Background(), `SELECT coalesce(array_agg(e->>'error' ORDER BY n), '{}')
		FROM river_job, unnest(errors) WITH ORDINALITY AS x(e, n) WHERE id = $1`, id).Scan(&errs))
	return errs
}

// waitJobErrors waits until River has recorded n errors for job id (it does so
// after the worker returned, and so after the backfill's last_error), and
// returns them.
func waitJobErrors(t *testing.T, db *pgtest.DB, id int64, n int) []string {
	t.Helper()
	var errs []string
	workertest.WaitFor(t, 60*time.Second, fmt.Sprintf("River's record of job %d's error %d", id, n), func() bool {
		errs = jobErrors(t, db, id)
		return len(errs) >= n
	})
	return errs
}

// A batch error longer than 1,000 characters, carrying a configured secret (the
// database password, in a connection string), is the backfill's last_error cut
// to its first 1,000 characters with the secret removed: removed before the
// cut, so that no piece of a secret the cut falls in survives either. The
// message is mostly two-byte characters, so a cut by bytes keeps far fewer.
func TestLastErrorIsCutAndRedacted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newDB(t)
	makeTable(t, db, "cut_items", 100)
	const secret = "Zq9-hunter2-Sup3r-s3cret"
	// The recorded message is "attempt 1: backfill cut_fill batch 0: " and the
	// batch's error. The second copy of the secret starts at character 994 of
	// it, so the 1,000-character cut falls inside it.
	const prefix = "attempt 1: backfill cut_fill batch 0: "
	head := "cannot reach postgres://app:" + secret + "@replica.internal:5432/app; "
	filler := strings.Repeat("é", 994-len(prefix)-len(head))
	errText := head + filler + secret + " and the rest, past the cut"
	b := fillBackfill("cut_fill", "cut_items", func(_ context.Context, call int) error {
		if call == 1 {
			return errors.New(errText)
		}
		return nil
	}, nil)
	startWorker(t, db, registry(t, b), &workers.Options{Secrets: []string{secret}})
	p, err := startBackfill(ctx, db.Pool, b)
	require.NoError(t, err)
	job := *p.JobID

	// River retries the job after about a second, and the retry succeeds; the
	// last error stays.
	p = waitErrors(t, db, b.Name, 1)
	last := *p.LastError
	require.True(t, strings.HasPrefix(last, prefix+"cannot reach postgres://app:xxxxx@replica.internal"), last)
	require.Equal(t, 1000, utf8.RuneCountInString(last), "last_error is the error's first 1,000 characters")
	require.True(t, utf8.ValidString(last))
	require.NotContains(t, last, secret[:4], "no piece of the secret survives, not even where the cut falls")
	for _, e := range waitJobErrors(t, db, job, 1) {
		require.NotContains(t, e, secret, "River's record of the error has the secret removed too")
	}

	waitState(t, db, b.Name, backfill.Done, 60*time.Second)
	requireRecount(t, db, b.Name, "cut_items", 100)
}

// A batch that returns INVALID_ARGUMENT cancels its job at once, without a
// retry, and the backfill shows stalled (running, its job cancelled) with the
// error as its last error; resume carries it on once the cause is fixed.
func TestInvalidArgumentCancelsAndStalls(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newDB(t)
	makeTable(t, db, "invalid_items", 300)
	var broken atomic.Bool
	broken.Store(true)
	b := fillBackfill("invalid_fill", "invalid_items", nil, func(context.Context, pgx.Tx) error {
		if broken.Load() {
			return fault.New(fault.InvalidArgument, "row 7 has no price: fix the data, then resume")
		}
		return nil
	})
	startWorker(t, db, registry(t, b), nil)
	p, err := startBackfill(ctx, db.Pool, b)
	require.NoError(t, err)
	job := *p.JobID
	waitJob(t, db, job, "cancelled", "discarded", "completed")

	p = mustGet(t, db, b.Name)
	require.Equal(t, backfill.Running, p.State)
	require.True(t, p.Stalled(), "a running backfill whose job was cancelled is stalled")
	require.Equal(t, "cancelled", *p.JobState)
	require.EqualValues(t, 1, *p.JobAttempt, "cancelled at its first attempt, not retried")
	require.EqualValues(t, 1, p.Errors)
	require.NotNil(t, p.LastError)
	require.Equal(t, "attempt 1: backfill invalid_fill batch 0: INVALID_ARGUMENT: row 7 has no price: fix the data, then resume", *p.LastError)
	require.Zero(t, p.RowsDone)
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM invalid_items WHERE filled IS NOT NULL`), "the batch rolled back")
	require.Zero(t, liveJobs(t, db, b.Name), "nothing will run it until resume")

	broken.Store(false)
	r, err := backfill.Resume(ctx, db.Pool, b.Name)
	require.NoError(t, err)
	require.False(t, r.Stalled())
	waitState(t, db, b.Name, backfill.Done, 60*time.Second)
	requireRecount(t, db, b.Name, "invalid_items", 300)
}

// A batch that keeps failing is retried until River's last attempt (25), and
// then the backfill shows stalled, its job discarded; resume carries it on.
// River's backoff spreads the attempts over weeks: the test makes each retry
// due at once, as River UI's retry does, and every attempt is a real one.
func TestStalledAfterTheLastAttempt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newDB(t)
	makeTable(t, db, "exhaust_items", 200)
	var broken atomic.Bool
	broken.Store(true)
	b := fillBackfill("exhaust_fill", "exhaust_items", func(context.Context, int) error {
		if broken.Load() {
			return errors.New("the replica is gone")
		}
		return nil
	}, nil)
	rt := startWorker(t, db, registry(t, b), nil)
	p, err := startBackfill(ctx, db.Pool, b)
	require.NoError(t, err)
	job := *p.JobID
	for i := 0; ; i++ {
		require.Less(t, i, 40, "the job should have been discarded after its last attempt")
		if waitJob(t, db, job, "retryable", "discarded") == "discarded" {
			break
		}
		p = mustGet(t, db, b.Name)
		require.False(t, p.Stalled(), "a backfill whose job will be retried is not stalled")
		_, err := rt.Client().JobRetry(ctx, job)
		require.NoError(t, err)
	}

	p = mustGet(t, db, b.Name)
	require.Equal(t, backfill.Running, p.State)
	require.True(t, p.Stalled(), "stalled after the last attempt")
	require.Equal(t, "discarded", *p.JobState)
	require.EqualValues(t, 25, *p.JobMaxAttempts, "River's default attempts")
	require.EqualValues(t, 25, *p.JobAttempt, "every attempt ran")
	require.EqualValues(t, 25, p.Errors, "each failed attempt counted")
	require.Equal(t, "attempt 25: backfill exhaust_fill batch 0: the replica is gone", *p.LastError)
	require.Len(t, jobErrors(t, db, job), 25)
	require.Zero(t, liveJobs(t, db, b.Name))

	broken.Store(false)
	_, err = backfill.Resume(ctx, db.Pool, b.Name)
	require.NoError(t, err)
	waitState(t, db, b.Name, backfill.Done, 60*time.Second)
	requireRecount(t, db, b.Name, "exhaust_items", 200)
}

// An unexpected failure in a batch (a panic, or a batch function that reports a
// negative row count) is INTERNAL_ERROR: the batch rolls back, the error is the
// backfill's last error and River's record, and River retries the job.
func TestUnexpectedFailureIsInternalError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newDB(t)
	makeTable(t, db, "internal_items", 250)
	b := fillBackfill("internal_fill", "internal_items", nil, nil)
	inner := b.Batch
	var calls atomic.Int64
	second := make(chan struct{})
	b.Batch = func(ctx context.Context, tx pgx.Tx, n int) (int, error) {
		switch calls.Add(1) {
		case 1:
			var m map[string]int
			m["boom"]++ // a bug: assignment to entry in nil map
		case 2:
			select { // until the test has read the first failure
			case <-second:
			case <-ctx.Done():
				return 0, ctx.Err()
			}
			if _, err := inner(ctx, tx, n); err != nil {
				return 0, err
			}
			return -1, nil // rows updated, and a nonsense count
		}
		return inner(ctx, tx, n)
	}
	rt := startWorker(t, db, registry(t, b), nil)
	p, err := startBackfill(ctx, db.Pool, b)
	require.NoError(t, err)
	job := *p.JobID

	p = waitErrors(t, db, b.Name, 1)
	require.Equal(t, "attempt 1: INTERNAL_ERROR: backfill internal_fill batch 0: the batch function panicked: assignment to entry in nil map", *p.LastError)
	errs := waitJobErrors(t, db, job, 1)
	require.Len(t, errs, 1)
	require.True(t, strings.HasPrefix(errs[0], "INTERNAL_ERROR: backfill internal_fill batch 0: the batch function panicked"), errs[0])

	state := waitJob(t, db, job, "retryable", "running", "cancelled", "discarded")
	require.Contains(t, []string{"retryable", "running"}, state, "River retries an internal error")
	close(second)
	p = waitErrors(t, db, b.Name, 2)
	require.Equal(t, "retryable", waitJob(t, db, job, "retryable"))
	require.Equal(t, "attempt 2: INTERNAL_ERROR: backfill internal_fill batch 0: the batch function returned -1 rows", *p.LastError)
	require.True(t, strings.HasPrefix(waitJobErrors(t, db, job, 2)[1], "INTERNAL_ERROR: "))
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM internal_items WHERE filled IS NOT NULL`), "both batches rolled back")
	require.Zero(t, p.RowsDone)

	p = retryUntilDone(t, db, rt, b.Name, job) // the third attempt's backoff is 16 s
	requireRecount(t, db, b.Name, "internal_items", 250)
	require.EqualValues(t, 2, p.Errors)
}

// jobsOutcome reads bettercompute_jobs_total for kind and outcome from reg.
func jobsOutcome(t *testing.T, reg *prometheus.Registry, kind, outcome string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != "bettercompute_jobs_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["kind"] == kind && labels["outcome"] == outcome {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}

// A worker that loses its shard lease in the middle of a batch (here: its
// identity restarted elsewhere, as after a pause, and the new incarnation took
// its leases) has the batch cancelled with FENCED: the batch rolls back, the
// job's outcome is fenced (not a failure: no last error, no retry with backoff),
// and the new holder carries the backfill on with every row handled once.
func TestLeaseLostMidBatchIsFenced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newDB(t)
	const rows, size = 600, 100
	makeTable(t, db, "fence_items", rows)
	entered := make(chan struct{})
	causes := make(chan error, 1)
	b := fillBackfill("fence_fill", "fence_items", func(ctx context.Context, call int) error {
		if call != 3 {
			return nil
		}
		// The third batch, inside its transaction, waits until its job is
		// cancelled (or the test gives up).
		close(entered)
		select {
		case <-ctx.Done():
			causes <- context.Cause(ctx)
			return ctx.Err()
		case <-time.After(60 * time.Second):
			causes <- errors.New("the batch was never cancelled")
			return errors.New("the batch was never cancelled")
		}
	}, nil)
	b.BatchSize = size

	promA := prometheus.NewRegistry()
	// Worker A beats its identity's heartbeat once only, so that B, a restart of
	// the same identity, takes it for a paused process and replaces it.
	reg := registry(t, b)
	setOf(reg).drain = time.Minute // one job runs the batches, at most 30 s
	rtA := startWorker(t, db, reg, &workers.Options{Identity: "fence-test", Heartbeat: time.Hour,
		Metrics: workers.NewMetrics(promA)})
	_, err := startBackfill(ctx, db.Pool, b)
	require.NoError(t, err)
	select {
	case <-entered:
	case <-time.After(60 * time.Second):
		t.Fatal("the third batch never started")
	}
	require.EqualValues(t, 2, mustGet(t, db, b.Name).Batches)
	// A declared its beats hourly; make it declare a silence of 300 ms fatal
	// instead, so B judges it paused once it has been silent that long (on a
	// fast machine the third batch starts sooner than that).
	db.MustExec(t, `UPDATE compute_workers SET dead_after = interval '300 milliseconds' WHERE identity = 'fence-test'`)
	workertest.WaitFor(t, 30*time.Second, "worker A silent past its dead_after", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM compute_workers WHERE identity = 'fence-test'
			AND seen_at < compute_now() - interval '500 milliseconds'`) == 1
	})

	startWorker(t, db, registry(t, b), &workers.Options{Identity: "fence-test", Heartbeat: 100 * time.Millisecond})
	var cause error
	select {
	case cause = <-causes:
	case <-time.After(90 * time.Second):
		t.Fatal("the batch in flight was not cancelled")
	}
	require.True(t, fault.Has(cause, fault.Fenced), "the batch was cancelled by the lost lease: %v", cause)
	workertest.WaitFor(t, 60*time.Second, "worker A's backfill job outcome: fenced", func() bool {
		return jobsOutcome(t, promA, kindOf(b), "fenced") >= 1
	})
	require.Zero(t, jobsOutcome(t, promA, kindOf(b), "failed"), "a fenced batch is not a failure")

	p := waitState(t, db, b.Name, backfill.Done, 60*time.Second)
	requireRecount(t, db, b.Name, "fence_items", rows)
	require.Zero(t, p.Errors, "a fenced batch is no failed attempt")
	require.Nil(t, p.LastError)
	require.Equal(t, 2*size, db.MustCount(t, `SELECT count(*) FROM bf_handled WHERE owner = $1`, rtA.Owner()),
		"worker A committed its first two batches and not the one in flight")
}

// A batch still running when the job's Timeout passes is cancelled (its
// statement too) and fails with UNAVAILABLE, the code of a timeout: rolled back,
// the backfill's last error says it timed out, and River retries it.
func TestTimeoutCancelsTheBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newDB(t)
	makeTable(t, db, "timeout_items", 300)
	var slow atomic.Bool
	slow.Store(true)
	b := fillBackfill("timeout_fill", "timeout_items", nil, func(ctx context.Context, tx pgx.Tx) error {
		if slow.CompareAndSwap(true, false) { // the first batch only
			_, err := tx.Exec(ctx, `SELECT pg_sleep(60)`) // far past the timeout
			return err
		}
		return nil
	})
	b.Timeout = 5 * time.Second // room for the retries' batches on a loaded machine
	startWorker(t, db, registry(t, b), nil)
	p, err := startBackfill(ctx, db.Pool, b)
	require.NoError(t, err)
	job := *p.JobID

	// River retries the job after about a second, and the retry succeeds.
	p = waitErrors(t, db, b.Name, 1)
	require.True(t, strings.HasPrefix(*p.LastError, "attempt 1: UNAVAILABLE: backfill timeout_fill: the batch timed out (the job's timeout is 5s): "), *p.LastError)
	errs := waitJobErrors(t, db, job, 1)
	require.True(t, strings.HasPrefix(errs[0], "UNAVAILABLE: "), errs[0])
	// On the record: the first attempt, from its start (River's errors[1].at)
	// to its error (the backfill's last_error_at), ran until the timeout, and
	// ended long before the 60 s statement would have.
	var ran float64
	require.NoError(t, db.QueryRow(ctx, `SELECT extract(epoch FROM b.last_error_at - (j.errors[1]->>'at')::timestamptz)::float8
		FROM river_job j, compute_backfills b WHERE j.id = $1 AND b.name = $2`, job, b.Name).Scan(&ran))
	require.GreaterOrEqual(t, ran, 4.9, "the attempt ran until its timeout")
	require.Less(t, ran, 40.0, "the timeout cut the batch short")
	workertest.WaitFor(t, 30*time.Second, "no backend still sleeping", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(60)' AND state = 'active'`) == 0
	})
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM timeout_items WHERE filled IS NOT NULL`), "the batch rolled back")

	waitState(t, db, b.Name, backfill.Done, 2*time.Minute)
	requireRecount(t, db, b.Name, "timeout_items", 300)
}
