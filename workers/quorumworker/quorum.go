// Package quorumworker is the quorum module's River workers: the fenced apply job of
// a committed batch and the expiry job of its deadline, plus the registration
// of appliers, one per batch kind.
//
// An application registers its appliers through its module's Register
// function, which receives the worker registry:
//
//	cli.Module{Name: "deploys", Register: func(r *workers.Registry) error {
//		return quorumworker.AddApplier(r, "deploy", func(ctx context.Context, tx pgx.Tx, b *quorum.Batch) error {
//			for _, item := range b.Items { … write the change in tx … }
//			return nil
//		})
//	}}
//
// # Applying
//
// The committing vote enqueues jobs.QuorumApply in its transaction. The worker
// runs domain/quorum.ApplyTx in the fenced job transaction (workers.InTx): it
// locks the batch, calls the kind's applier with the transaction, marks the
// batch applied and completes the job, all or nothing. A process killed mid-apply
// leaves nothing: the next holder of the shard takes the job back at takeover
// and applies from scratch, so the applier's writes land exactly once. A job
// retried after success finds the batch applied and does nothing.
//
//	committed ──apply job: applier(tx) + applied + job completed (one transaction)──▶ applied
//	committed ──no applier for the kind in this process──▶ retried with backoff (UNAVAILABLE)
//	no such batch ──▶ cancelled
//
// # Expiry
//
// ProposeTx schedules jobs.QuorumExpiry for the deadline (River schedules in real
// time). The worker expires the batch if it is still open by compute_now(), and
// snoozes while the deadline is ahead (at most SimPoll at a time under a sim
// clock, which jumps).
package quorumworker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/bettercompute/bettercompute/domain/quorum"
	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/clock"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/internal/riverjob"
)

// Applier applies a committed batch's items (b.Items, in order) inside tx, the
// fenced apply transaction: whatever it writes commits together with the batch
// marked applied, or not at all. It must not commit tx or start work outside it.
type Applier func(ctx context.Context, tx pgx.Tx, b *quorum.Batch) error

// Options configure Register.
type Options struct {
	// MaxSnooze bounds one snooze of an early expiry job: default one hour.
	MaxSnooze time.Duration
	// SimPoll bounds one snooze while compute_now() is not the system clock:
	// default one second.
	SimPoll time.Duration
}

// appliers are one registry's quorum machinery (its workers.Part): the
// options and the appliers per batch kind, which the apply worker reads.
type appliers struct {
	opts Options
	mu   sync.RWMutex
	m    map[string]Applier
}

func (a *appliers) get(kind string) Applier {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.m[kind]
}

// Install implements workers.Part: the apply and expiry workers.
func (a *appliers) Install(reg *workers.Registry) error {
	return errors.Join(
		workers.AddWorker(reg, &applyWorker{appliers: a}),
		workers.AddWorker(reg, &expiryWorker{maxSnooze: a.opts.MaxSnooze, simPoll: a.opts.SimPoll}),
	)
}

// partOf returns reg's quorum machinery, installing it with o (nil for the
// defaults) the first time.
func partOf(reg *workers.Registry, o *Options) (*appliers, error) {
	return workers.Use(reg, func() *appliers {
		var opts Options
		if o != nil {
			opts = *o
		}
		if opts.MaxSnooze <= 0 {
			opts.MaxSnooze = time.Hour
		}
		if opts.SimPoll <= 0 {
			opts.SimPoll = time.Second
		}
		return &appliers{opts: opts, m: map[string]Applier{}}
	})
}

// Register adds the apply and expiry workers to reg (once: later calls, and
// Handle, reuse them; the options of the first call stand). o may be nil.
func Register(reg *workers.Registry, o *Options) error {
	_, err := partOf(reg, o)
	return err
}

// Handle registers the applier of batches of kind on reg (adding the quorum
// workers if they are not there yet). It returns INVALID_CONFIG for a bad kind,
// a nil applier, or a kind that already has one.
func AddApplier(reg *workers.Registry, kind string, fn Applier) error {
	if err := riverjob.ValidateKind(kind); err != nil {
		return fault.Wrap(fault.InvalidConfig, err, "quorum applier")
	}
	if fn == nil {
		return fault.New(fault.InvalidConfig, "quorum applier for %s is nil", kind)
	}
	a, err := partOf(reg, nil)
	if err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, dup := a.m[kind]; dup {
		return fault.New(fault.InvalidConfig, "quorum batches of kind %s already have an applier", kind)
	}
	a.m[kind] = fn
	return nil
}

// applyWorker works jobs.QuorumApply.
type applyWorker struct {
	river.WorkerDefaults[jobs.QuorumApply]
	appliers *appliers
}

// Work applies the batch in the fenced job transaction.
func (w *applyWorker) Work(ctx context.Context, job *river.Job[jobs.QuorumApply]) error {
	return workers.InTx(ctx, job, func(ctx context.Context, tx pgx.Tx) error {
		_, err := quorum.ApplyTx(ctx, tx, job.Args.BatchID, func(ctx context.Context, tx pgx.Tx, b *quorum.Batch) error {
			fn := w.appliers.get(b.Kind)
			if fn == nil {
				// Retried with backoff, not cancelled: a process of a newer
				// release may know the kind.
				return fault.New(fault.Unavailable, "no quorum applier for kind %s is registered in this process (batch %d)", b.Kind, b.ID)
			}
			if err := fn(ctx, tx, b); err != nil {
				return fmt.Errorf("error applying batch %d (%s): %w", b.ID, b.Kind, err)
			}
			return nil
		})
		if fault.Has(err, fault.NotFound) {
			// The batch is gone: nothing will ever apply it; the job is cancelled.
			return fault.Wrap(fault.InvalidArgument, err, "apply job %d", job.ID)
		}
		return err
	})
}

// expiryWorker works jobs.QuorumExpiry.
type expiryWorker struct {
	river.WorkerDefaults[jobs.QuorumExpiry]
	maxSnooze, simPoll time.Duration
}

var errEarly = errors.New("deadline not reached")

// Work expires the batch if it is open at its deadline, in the fenced job
// transaction, and snoozes the job while the deadline is ahead.
func (w *expiryWorker) Work(ctx context.Context, job *river.Job[jobs.QuorumExpiry]) error {
	var dueIn time.Duration
	err := workers.InTx(ctx, job, func(ctx context.Context, tx pgx.Tx) error {
		res, err := quorum.ExpireTx(ctx, tx, job.Args.BatchID)
		if fault.Has(err, fault.NotFound) {
			return nil // the batch is gone: nothing to expire
		}
		if err != nil {
			return err
		}
		if res.DueIn > 0 {
			dueIn = res.DueIn
			return errEarly
		}
		return nil
	})
	if errors.Is(err, errEarly) {
		return river.JobSnooze(snoozeFor(ctx, dueIn, w.maxSnooze, w.simPoll))
	}
	return err
}

// snoozeFor is how long a job that ran dueIn (by compute_now()) too early
// snoozes: dueIn, at least 50 ms, at most maxSnooze, and at most simPoll while
// the process's clock anchor says compute_now() is not the system clock.
func snoozeFor(ctx context.Context, dueIn, maxSnooze, simPoll time.Duration) time.Duration {
	d := min(max(dueIn, 50*time.Millisecond), maxSnooze)
	if rt := workers.RuntimeFrom(ctx); rt != nil {
		if _, mode := rt.Anchor().Skew(); mode != clock.System {
			d = min(d, simPoll)
		}
	}
	return d
}
