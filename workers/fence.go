package workers

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/workers/internal/lease"
)

// InTx runs fn in the fenced job transaction of job, which must be in a shard
// queue of this process (see the package doc), and completes the job in it. It
// returns FENCED, having written nothing, when the shard lease is no longer this
// process's or the attempt is stale. If fn returns an error, nothing is written
// and the job is not completed.
//
//	func (w *MyWorker) Work(ctx context.Context, job *river.Job[MyArgs]) error {
//		return workers.InTx(ctx, job, func(ctx context.Context, tx pgx.Tx) error {
//			_, err := tx.Exec(ctx, `UPDATE …`)
//			return err
//		})
//	}
func InTx[T river.JobArgs](ctx context.Context, job *river.Job[T], fn func(ctx context.Context, tx pgx.Tx) error) error {
	rt := runtimeFrom(ctx)
	if rt == nil {
		return fault.New(fault.Internal, "workers.InTx: no Runtime in the job's context (is the job worked by a workers.Runtime?)")
	}
	if _, isShard := shardOfQueue(job.Queue); !isShard {
		// A programming error, not a lost lease: snoozing would loop for ever.
		return fault.New(fault.Internal, "workers.InTx: job %d is in queue %s, not a shard queue (insert it with jobs.ShardQueue, or fence it with InTxLease)", job.ID, job.Queue)
	}
	l, err := rt.jobLease(ctx, job.JobRow)
	if err != nil {
		return err
	}
	return InTxLease(ctx, job, l, fn)
}

// jobLease is the lease of job's shard queue that this process holds, or
// FENCED (reported) when it holds none.
func (rt *Runtime) jobLease(ctx context.Context, job *rivertype.JobRow) (lease.Lease, error) {
	l, ok := rt.leaseForQueue(job.Queue)
	if !ok {
		err := fault.New(fault.Fenced, "job %d: this process holds no lease for queue %s", job.ID, job.Queue)
		rt.fenced(ctx, job.Queue, 0, err)
		return lease.Lease{}, err
	}
	return l, nil
}

// holds reports whether this process still holds l, at l's epoch, as far as
// its keeper knows.
func (rt *Runtime) holds(l lease.Lease) bool {
	cur, ok := rt.keeper.Held(l.Name)
	return ok && cur.Epoch == l.Epoch
}

// Fence is the fence of a job's transaction: the shard lease it runs under
// and the job's attempt (see FenceTx).
type Fence struct {
	Lease lease.Lease
	Job   *rivertype.JobRow
}

// Args are the arguments of jobs.FenceSQL for f, for a caller that sends the
// fence in a batch with the statements that follow it (one round trip).
func (f Fence) Args() []any {
	return []any{f.Lease.Name, f.Lease.Owner, f.Lease.Epoch, f.Job.ID, f.Job.Attempt}
}

// Check is FenceTx's answer from the row of jobs.FenceSQL: nil, FENCED, or
// err.
func (f Fence) Check(got int, err error) error { return fenceResult(got, err, f.Lease, f.Job) }

// FencedTx is InTx for a worker that does several units of work in one job,
// each in a transaction of its own: fn runs the fence itself, first (FenceTx,
// or jobs.FenceSQL with Args in a batch, checked by Check), and
// completes the job in the transaction that ends the job's work
// (riverjob.CompleteJobSQL); a transaction that does not complete it leaves it
// running, for the next one. A FENCED error is reported as InTx reports it.
func FencedTx[T river.JobArgs](ctx context.Context, job *river.Job[T], fn func(ctx context.Context, tx pgx.Tx, f Fence) error) error {
	rt := runtimeFrom(ctx)
	if rt == nil {
		return fault.New(fault.Internal, "workers.FencedTx: no Runtime in the job's context")
	}
	l, err := rt.jobLease(ctx, job.JobRow)
	if err != nil {
		return err
	}
	f := Fence{Lease: l, Job: job.JobRow}
	err = inTxRetrying(ctx, rt, job.JobRow, l, func(ctx context.Context, tx pgx.Tx) error { return fn(ctx, tx, f) })
	if fault.Has(err, fault.Fenced) {
		rt.fenced(ctx, job.Queue, l.Epoch, err)
	}
	return err
}

// Holds reports whether this process still holds the lease of f, as far as it
// knows without the database (the fence of the next transaction decides).
func (f Fence) Holds(ctx context.Context) bool {
	rt := runtimeFrom(ctx)
	return rt != nil && rt.holds(f.Lease)
}

// InTxLease is InTx fenced by an explicit lease instead of the job's shard lease
// (outbox sinks fence on their own sink lease).
func InTxLease[T river.JobArgs](ctx context.Context, job *river.Job[T], l lease.Lease, fn func(ctx context.Context, tx pgx.Tx) error) error {
	rt := runtimeFrom(ctx)
	if rt == nil {
		return fault.New(fault.Internal, "workers.InTxLease: no Runtime in the job's context")
	}
	err := inTxRetrying(ctx, rt, job.JobRow, l, func(ctx context.Context, tx pgx.Tx) error {
		if err := FenceTx(ctx, tx, l, job.JobRow); err != nil {
			return err
		}
		if err := fn(ctx, tx); err != nil {
			return err
		}
		return CompleteTx(ctx, tx, job)
	})
	if fault.Has(err, fault.Fenced) {
		rt.fenced(ctx, job.Queue, l.Epoch, err)
	}
	return err
}

// inTxRetrying runs fn in a transaction, again and again while it fails because
// the connection was lost (the database restarted, a pooler dropped it) and the
// job's context and its shard lease are still this process's. Nothing of a
// failed transaction committed, unless its COMMIT reached the server before the
// connection died; then the job is complete and the next attempt's fence says
// so (FENCED, the job already done). Returning the error to River instead would
// leave the job running until River's completer, which cannot write either,
// gives up and retries: seconds after the database is back.
func inTxRetrying(ctx context.Context, rt *Runtime, job *rivertype.JobRow, l lease.Lease, fn func(ctx context.Context, tx pgx.Tx) error) error {
	wait := 50 * time.Millisecond
	for tries := 1; ; tries++ {
		err := pg.InTx(ctx, rt.pool, fn)
		if err == nil || !pg.Disconnected(err) || ctx.Err() != nil {
			return err
		}
		if strings.HasPrefix(l.Name, "shard/") && !rt.holds(l) {
			return err // the lease is gone: the middleware gives the job back
		}
		if tries == 1 {
			rt.log.Info().Err(err).Int64("job_id", job.ID).Str("queue", job.Queue).
				Msg("fenced transaction lost its connection; retrying it while the lease holds")
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

// FenceTx runs both fences as the first statement of tx (jobs.FenceSQL): the
// lease l FOR KEY SHARE, and job's row with its attempt FOR UPDATE. It returns
// FENCED when either finds nothing.
func FenceTx(ctx context.Context, tx pgx.Tx, l lease.Lease, job *rivertype.JobRow) error {
	var got int
	err := tx.QueryRow(ctx, jobs.FenceSQL, l.Name, l.Owner, l.Epoch, job.ID, job.Attempt).Scan(&got)
	return fenceResult(got, err, l, job)
}

// fenceResult is the outcome of jobs.FenceSQL: nil, FENCED, or its error.
func fenceResult(got int, err error, l lease.Lease, job *rivertype.JobRow) error {
	switch {
	case err != nil:
		return pg.Translate(fmt.Errorf("error fencing job %d and lease %s: %w", job.ID, l.Name, err))
	case got == jobs.FenceLeaseLost:
		return fault.New(fault.Fenced, "job %d: lease %s (owner %s, epoch %d) is no longer held", job.ID, l.Name, l.Owner, l.Epoch)
	case got == jobs.FenceJobStale:
		return fault.New(fault.Fenced, "job %d: attempt %d is stale (the job is no longer running this attempt)", job.ID, job.Attempt)
	case got != jobs.FenceHeld:
		return fault.New(fault.Internal, "job %d: compute_fence returned %d", job.ID, got)
	}
	return nil
}

// CompleteTx completes job in tx, as InTx does after its function: FENCED
// unless the job was still running this attempt (FenceTx's lock on its row
// makes sure it is, for the rest of tx).
func CompleteTx[T river.JobArgs](ctx context.Context, tx pgx.Tx, job *river.Job[T]) error {
	done, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job)
	if err != nil {
		return fmt.Errorf("error completing job %d: %w", job.ID, err)
	}
	if done.State != rivertype.JobStateCompleted {
		return fault.New(fault.Fenced, "job %d: completion found it %s, not running", job.ID, done.State)
	}
	return nil
}
