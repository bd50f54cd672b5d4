package backfill

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/workers"
)

// worker runs the batches of one backfill (its kind is backfill_<name>).
type worker struct {
	river.WorkerDefaults[jobs.Backfill]
	b Backfill
}

// Timeout is the backfill's Timeout (0: the runtime's job timeout).
func (w *worker) Timeout(*river.Job[jobs.Backfill]) time.Duration { return w.b.Timeout }

// maxErrorLen is how much of a batch error last_error keeps.
const maxErrorLen = 1000

// Work runs one batch: see the package doc.
func (w *worker) Work(ctx context.Context, job *river.Job[jobs.Backfill]) error {
	args := job.Args
	if args.Name != w.b.Name {
		return fault.New(fault.InvalidArgument, "job %d of kind %s names backfill %q", job.ID, job.Kind, args.Name)
	}
	err := workers.InTx(ctx, job, func(ctx context.Context, tx pgx.Tx) error {
		return w.batchTx(ctx, tx, job)
	})
	if err != nil && !fault.Has(err, fault.Fenced) && !fault.Has(context.Cause(ctx), fault.Fenced) &&
		!errors.Is(ctx.Err(), context.Canceled) {
		w.recordError(ctx, job, err)
	}
	return err
}

// batchTx is the batch inside the fenced job transaction.
func (w *worker) batchTx(ctx context.Context, tx pgx.Tx, job *river.Job[jobs.Backfill]) error {
	args := job.Args
	// Decide before writing: lock the row only if it is running this job's epoch
	// and batch. The guard is in the WHERE clause, so a stale job (the backfill
	// was paused, cancelled or resumed, or another job committed this batch)
	// finds no row without waiting for the lock; one that waited re-checks the
	// guard on the row the other transaction committed.
	var (
		estimatedAt *time.Time
		now         time.Time
	)
	err := tx.QueryRow(ctx, `
SELECT estimated_at, compute_now() FROM compute_backfills
WHERE name = $1 AND state = 'running' AND epoch = $2 AND batches = $3
FOR UPDATE`, args.Name, args.Epoch, args.Batch).Scan(&estimatedAt, &now)
	if errors.Is(err, pgx.ErrNoRows) {
		if rt := workers.RuntimeFrom(ctx); rt != nil {
			log := rt.Log()
			log.Debug().Str("backfill", args.Name).Int64("job_id", job.ID).Int64("epoch", args.Epoch).
				Int64("batch", args.Batch).Msg("stale backfill job: completed without a batch")
		}
		return nil // InTx completes the job
	}
	if err != nil {
		return pg.Translate(fmt.Errorf("error locking backfill %s: %w", args.Name, err))
	}

	start := time.Now()
	n, err := w.b.Batch(ctx, tx, w.b.BatchSize)
	took := time.Since(start)
	if err != nil {
		return fmt.Errorf("backfill %s batch %d: %w", args.Name, args.Batch, err)
	}
	if n < 0 {
		return fault.New(fault.Internal, "backfill %s batch %d: the batch function returned %d rows", args.Name, args.Batch, n)
	}

	var (
		estimate *int64
		nextJob  *int64
	)
	if n > 0 {
		if w.b.Estimate != nil && (estimatedAt == nil || now.Sub(*estimatedAt) >= w.b.EstimateEvery) {
			left, err := w.b.Estimate(ctx, tx)
			if err != nil {
				return fmt.Errorf("backfill %s: error estimating the rows left: %w", args.Name, err)
			}
			estimate = &left
		}
		next := jobs.Backfill{Name: args.Name, Epoch: args.Epoch, Batch: args.Batch + 1}
		id, err := insertJobTx(ctx, tx, next, w.b.Delay(n, took))
		if err != nil {
			return err
		}
		nextJob = &id
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
    state = CASE WHEN $4 = 0 THEN 'done' ELSE state END,
    finished_at = CASE WHEN $4 = 0 THEN compute_now() ELSE finished_at END,
    updated_at = compute_now()
WHERE name = $1 AND epoch = $2 AND batches = $3 AND state = 'running'`,
		args.Name, args.Epoch, args.Batch, n, took.Milliseconds(), estimate, nextJob)
	if err != nil {
		return pg.Translate(fmt.Errorf("error recording backfill %s batch %d: %w", args.Name, args.Batch, err))
	}
	if tag.RowsAffected() != 1 {
		// Unreachable while the row lock above holds; the guard says so anyway.
		return fault.New(fault.Fenced, "backfill %s batch %d: the progress row moved", args.Name, args.Batch)
	}
	if n == 0 {
		if rt := workers.RuntimeFrom(ctx); rt != nil {
			log := rt.Log()
			log.Info().Str("backfill", args.Name).Int64("batches", args.Batch+1).Msg("backfill done: a batch found no rows")
		}
	}
	return nil
}

// recordError stores a failed attempt's error as the backfill's last_error, in
// a short transaction of its own (the batch's rolled back), for the same run only.
func (w *worker) recordError(ctx context.Context, job *river.Job[jobs.Backfill], jobErr error) {
	rt := workers.RuntimeFrom(ctx)
	if rt == nil {
		return
	}
	msg := jobErr.Error()
	if errors.Is(jobErr, context.DeadlineExceeded) {
		msg = "the batch timed out: " + msg
	}
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

// truncate cuts s to at most n bytes without splitting a character.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}
