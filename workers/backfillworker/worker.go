package backfillworker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/bettercompute/bettercompute/domain/backfill"
	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/tracing"
	"github.com/bettercompute/bettercompute/workers"
)

// worker runs the batches of one backfill (its kind is backfill_<name>).
type worker struct {
	river.WorkerDefaults[jobs.BackfillBatch]
	b   workers.Backfill
	set *set
}

// Timeout is the backfill's Timeout (0: the runtime's job timeout).
func (w *worker) Timeout(*river.Job[jobs.BackfillBatch]) time.Duration { return w.b.Timeout }

// maxErrorLen is how many characters of a batch error last_error keeps.
const maxErrorLen = 1000

// Work runs the backfill's batches, each in its own fenced transaction, for as
// long as they come back full and the drain lasts: see the package doc.
func (w *worker) Work(ctx context.Context, job *river.Job[jobs.BackfillBatch]) error {
	args := job.Args
	if args.Name != w.b.Name {
		return fault.New(fault.InvalidArgument, "job %d of kind %s names backfill %q", job.ID, job.Kind, args.Name)
	}
	began := time.Now()
	deadline := began.Add(w.drainFor(ctx))
	var (
		ran, rows int64
		size      int
		forceLast bool
	)
	if rt := workers.RuntimeFrom(ctx); rt == nil {
		forceLast = true // InTx says what is wrong
	} else if _, ok := rt.LeaseForQueue(job.Queue); !ok {
		forceLast = true // InTx fences it, or says it is not in a shard queue
	}
	for {
		// The last batch the drain has time for runs in workers.InTx, which
		// completes the job in the batch's transaction; the ones before it leave
		// the job running, as the one that carries the backfill on.
		last := forceLast || !time.Now().Add(w.b.Pause).Before(deadline)
		var out outcome
		fn := func(ctx context.Context, tx pgx.Tx) error {
			out = outcome{}
			return w.batchTx(ctx, tx, job, last, deadline, &out)
		}
		var err error
		bctx, span := batchSpan(ctx, args.Name)
		if last {
			err = workers.InTx(bctx, job, fn)
		} else {
			err = w.inFencedTx(bctx, job, func(ctx context.Context, tx pgx.Tx) error {
				if err := fn(ctx, tx); err != nil {
					return err
				}
				if out.carry {
					return nil
				}
				// The batch handed the backfill on (to done or a new job), or the
				// row does not name this job: the job completes with it.
				return workers.CompleteTx(ctx, tx, job)
			})
			if err != nil && pg.Disconnected(err) && ctx.Err() == nil {
				// InTx retries a lost connection while the lease holds; the row
				// says whether the batch committed, so running it through InTx
				// again is safe.
				forceLast = true
				workers.EndSpanOutcome(span, err, tracing.OutcomeRetried)
				continue
			}
		}
		workers.EndSpanOutcome(span, err, workers.Outcome(bctx, err))
		if err != nil {
			fenced := fault.Has(err, fault.Fenced) || fault.Has(context.Cause(ctx), fault.Fenced)
			if !fenced && errors.Is(ctx.Err(), context.DeadlineExceeded) {
				// The job's Timeout cut the batch short: UNAVAILABLE, as a
				// statement timeout is, and retried.
				err = fault.Wrap(fault.Unavailable, err, "backfill %s: the batch timed out (the job's timeout is %s)", args.Name, w.timeout(ctx))
			}
			if !fenced && !errors.Is(ctx.Err(), context.Canceled) {
				w.recordError(ctx, job, err)
			}
			return err
		}
		if out.ran {
			ran, rows, size = ran+1, rows+int64(out.rows), out.next
		}
		if last || !out.carry {
			if rt := workers.RuntimeFrom(ctx); rt != nil && ran > 0 {
				log := rt.Log()
				log.Debug().Str("backfill", args.Name).Int64("job_id", job.ID).Int64("batches", ran).
					Int64("rows", rows).Int("next_batch_size", size).Dur("took", time.Since(began)).
					Msg("backfill job drained")
			}
			return nil
		}
		if out.wait > 0 {
			t := time.NewTimer(out.wait)
			select {
			case <-ctx.Done():
				t.Stop()
				// The job stays running and named in the row: River's retry, or
				// the shard's next holder, carries the backfill on.
				return context.Cause(ctx)
			case <-t.C:
			}
		}
	}
}

// BatchSpan is the name of a backfill batch's span.
const BatchSpan = "bettercompute.backfill.batch"

// batchSpan starts the span of one batch transaction of backfill name. An
// operator started the backfill: the span has no cause, and is a child of
// River's span of the job when there is one.
func batchSpan(ctx context.Context, name string) (context.Context, trace.Span) {
	rt := workers.RuntimeFrom(ctx)
	if rt == nil {
		return ctx, noop.Span{}
	}
	ctx, span := tracing.Start(ctx, rt.TracerProvider(), BatchSpan, nil)
	if span.IsRecording() {
		span.SetAttributes(tracing.Backfill.String(name))
	}
	return ctx, span
}

// timeout is the job's timeout: Timeout, or the runtime's job timeout.
func (w *worker) timeout(ctx context.Context) time.Duration {
	if w.b.Timeout > 0 {
		return w.b.Timeout
	}
	if rt := workers.RuntimeFrom(ctx); rt != nil && rt.Options().JobTimeout > 0 {
		return rt.Options().JobTimeout
	}
	return river.JobTimeoutDefault
}

// drainFor is how long this job may keep taking batches: DrainFor, at most
// half of what is left of the job's timeout.
func (w *worker) drainFor(ctx context.Context) time.Duration {
	d := drainFor
	if w.set.drain != 0 {
		d = w.set.drain
	}
	if dl, ok := ctx.Deadline(); ok {
		d = min(d, time.Until(dl)/2)
	}
	return d
}

// inFencedTx runs fn in a transaction fenced as workers.InTx fences it (the
// shard lease FOR KEY SHARE, the job's attempt FOR UPDATE), leaving it to fn
// to complete the job or not: a batch of the drain that may not be its last.
func (w *worker) inFencedTx(ctx context.Context, job *river.Job[jobs.BackfillBatch], fn func(ctx context.Context, tx pgx.Tx) error) error {
	rt := workers.RuntimeFrom(ctx)
	if rt == nil {
		return fault.New(fault.Internal, "backfill %s: no Runtime in the job's context", w.b.Name)
	}
	l, ok := rt.LeaseForQueue(job.Queue)
	if !ok {
		return fault.New(fault.Fenced, "job %d: this process holds no lease for queue %s", job.ID, job.Queue)
	}
	return pg.InTx(ctx, rt.Pool(), func(ctx context.Context, tx pgx.Tx) error {
		if err := workers.FenceTx(ctx, tx, l, job.JobRow); err != nil {
			return err
		}
		return fn(ctx, tx)
	})
}

// outcome is what one batch transaction did.
type outcome struct {
	ran   bool          // a batch ran and committed its progress
	rows  int           // the rows it handled
	next  int           // the size the next batch asks for
	carry bool          // this job still carries the backfill on: run the next batch
	wait  time.Duration // after this long (backfill.Pause, MaxRowsPerSecond)
}

// batchTx is one batch inside a fenced transaction of the job. last says the
// transaction completes the job (workers.InTx): then the batch always hands
// the backfill on, to a new job or to done. Otherwise, while the batch comes
// back full and the next one can start before deadline, the job keeps the
// backfill (the row names it) and out.carry asks for the next batch.
func (w *worker) batchTx(ctx context.Context, tx pgx.Tx, job *river.Job[jobs.BackfillBatch], last bool, deadline time.Time, out *outcome) error {
	args := job.Args
	// Decide before writing: lock the row only if it is running this job's
	// epoch and names this job as the one that carries it on. The guard is in
	// the WHERE clause, so a stale job (the backfill was paused, cancelled or
	// resumed, another job carries it on, or it is a duplicate) finds no row
	// without waiting for the lock; one that waited re-checks the guard on the
	// row the other transaction committed.
	var (
		batch       int64
		estimatedAt *time.Time
		chosen      *int32
		now         time.Time
	)
	// First the backfill's advisory lock, shared: an operator's verb takes it
	// exclusive (lockRow), and a request queues behind a waiting one, so the
	// drain's next batch cannot slip in ahead of a pause waiting for this one
	// (a row lock makes no such promise once the row has a new version). Both
	// statements go in one round trip.
	var pb pgx.Batch
	pb.Queue(backfill.AdvisoryLockSQL(true), args.Name)
	pb.Queue(`
SELECT batches, estimated_at, batch_size, compute_now() FROM compute_backfills
WHERE name = $1 AND state = 'running' AND epoch = $2 AND job_id = $3
FOR UPDATE`, args.Name, args.Epoch, job.ID)
	res := tx.SendBatch(ctx, &pb)
	_, err := res.Exec()
	if err == nil {
		err = res.QueryRow().Scan(&batch, &estimatedAt, &chosen, &now)
	}
	if cerr := res.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if errors.Is(err, pgx.ErrNoRows) {
		if rt := workers.RuntimeFrom(ctx); rt != nil {
			log := rt.Log()
			log.Debug().Str("backfill", args.Name).Int64("job_id", job.ID).Int64("epoch", args.Epoch).
				Int64("batch", args.Batch).Msg("stale backfill job: the backfill does not run it (any more); completed without a batch")
		}
		return nil // the job completes
	}
	if err != nil {
		return pg.Translate(fmt.Errorf("error locking backfill %s: %w", args.Name, err))
	}

	size := batchSize(w.b, chosen)
	start := time.Now()
	n, err, panicked := w.callBatch(ctx, tx, size)
	took := time.Since(start)
	if panicked {
		return fault.New(fault.Internal, "backfill %s batch %d: the batch function panicked: %v", args.Name, batch, err)
	}
	if err != nil {
		return fmt.Errorf("backfill %s batch %d: %w", args.Name, batch, err)
	}
	if n < 0 {
		return fault.New(fault.Internal, "backfill %s batch %d: the batch function returned %d rows", args.Name, batch, n)
	}
	next := size
	if !w.b.FixedBatchSize && n > 0 {
		next = nextBatchSize(size, took, w.b.BatchTime, maxBatch(w.b))
	}

	var (
		estimate *int64
		nextJob  *int64
		carry    bool
		delay    time.Duration
	)
	if n > 0 {
		if w.b.Estimate != nil && (estimatedAt == nil || now.Sub(*estimatedAt) >= w.b.EstimateEvery) {
			left, err := w.b.Estimate(ctx, tx)
			if err != nil {
				return fmt.Errorf("backfill %s: error estimating the rows left: %w", args.Name, err)
			}
			estimate = &left
		}
		delay = delayAfter(w.b, n, took)
		carry = !last && n >= size && ctx.Err() == nil && time.Now().Add(delay).Before(deadline)
		if carry {
			id := job.ID
			nextJob = &id
		} else {
			next := jobs.BackfillBatch{Name: args.Name, Epoch: args.Epoch, Batch: batch + 1}
			id, err := backfill.InsertJobTx(ctx, tx, next, delay)
			if err != nil {
				return err
			}
			nextJob = &id
		}
	}
	tag, err := tx.Exec(ctx, `
UPDATE compute_backfills SET
    batches = batches + 1,
    rows_done = rows_done + $4,
    last_batch_at = compute_now(),
    last_batch_rows = $4,
    last_batch_ms = $5,
    rate = CASE WHEN $4 = 0 THEN rate
                ELSE coalesce(0.7 * rate, 0) + CASE WHEN rate IS NULL THEN 1.0 ELSE 0.3 END
                     * ($4::float8 / greatest(extract(epoch FROM compute_now() - rate_at)::float8, 0.001))
           END,
    rate_at = compute_now(),
    rows_estimate = CASE WHEN $4 = 0 THEN rows_done
                         WHEN $6::bigint IS NULL THEN rows_estimate
                         ELSE rows_done + $4 + $6 END,
    estimated_at = CASE WHEN $4 = 0 OR $6::bigint IS NOT NULL THEN compute_now() ELSE estimated_at END,
    job_id = $7,
    batch_size = $9,
    state = CASE WHEN $4 = 0 THEN 'done' ELSE state END,
    finished_at = CASE WHEN $4 = 0 THEN compute_now() ELSE finished_at END,
    updated_at = compute_now()
WHERE name = $1 AND epoch = $2 AND batches = $3 AND job_id = $8 AND state = 'running'`,
		args.Name, args.Epoch, batch, n, took.Milliseconds(), estimate, nextJob, job.ID, next)
	if err != nil {
		return pg.Translate(fmt.Errorf("error recording backfill %s batch %d: %w", args.Name, batch, err))
	}
	if tag.RowsAffected() != 1 {
		// Unreachable while the row lock above holds; the guard says so anyway.
		return fault.New(fault.Fenced, "backfill %s batch %d: the progress row moved", args.Name, batch)
	}
	*out = outcome{ran: true, rows: n, next: next, carry: carry, wait: delay}
	if n == 0 {
		if rt := workers.RuntimeFrom(ctx); rt != nil {
			log := rt.Log()
			log.Info().Str("backfill", args.Name).Int64("batches", batch+1).Msg("backfill done: a batch found no rows")
		}
	}
	return nil
}

// callBatch calls the batch function; a panic in it is an INTERNAL_ERROR like
// any other unexpected failure: the batch rolls back, the error is the
// backfill's last_error, and River retries the job.
func (w *worker) callBatch(ctx context.Context, tx pgx.Tx, size int) (n int, err error, panicked bool) {
	defer func() {
		if r := recover(); r != nil {
			n, err, panicked = 0, fmt.Errorf("%v", r), true
		}
	}()
	n, err = w.b.Batch(ctx, tx, size)
	return n, err, false
}

// recordError stores a failed attempt's error as the backfill's last_error, in
// a short transaction of its own (the batch's rolled back), for the same run only.
func (w *worker) recordError(ctx context.Context, job *river.Job[jobs.BackfillBatch], jobErr error) {
	rt := workers.RuntimeFrom(ctx)
	if rt == nil {
		return
	}
	msg := fault.CleanText(jobErr.Error()) // a batch's error may hold bytes text refuses
	for _, s := range rt.Options().Secrets {
		if s != "" {
			msg = strings.ReplaceAll(msg, s, "xxxxx")
		}
	}
	msg = fmt.Sprintf("attempt %d: %s", job.Attempt, msg)
	msg = truncate(msg, maxErrorLen)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	err := pg.InTx(rctx, rt.Pool(), func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(rctx, `
UPDATE compute_backfills SET errors = errors + 1, last_error = $3, last_error_at = compute_now(),
    updated_at = compute_now()
WHERE name = $1 AND epoch = $2 AND state = 'running'`, job.Args.Name, job.Args.Epoch, msg)
		return err
	})
	if err != nil {
		log := rt.Log()
		log.Warn().Err(err).Str("backfill", job.Args.Name).Msg("cannot record the batch's error")
	}
}

// truncate cuts s to its first n characters.
func truncate(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	i := 0
	for j := range s {
		if i == n {
			return s[:j]
		}
		i++
	}
	return s
}
