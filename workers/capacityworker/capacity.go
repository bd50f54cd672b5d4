// Package capacityworker is the capacity module's River workers: the fenced hold-expiry
// job and its periodic safety sweep. Register adds them to a worker registry (the
// built-in capacity module does, for every worker process).
//
// # Hold expiry
//
// domain/capacity.ReserveTx enqueues one jobs.CapacityHoldExpiry per reservation,
// in the reservation's transaction, scheduled for the hold's expiry, in the
// shard queue of its pool. The worker runs domain/capacity.ExpireHoldsTx in the
// fenced job transaction (workers.InTx), so a hold is expired, and its quota
// refunded, exactly once, by the current holder of the pool's shard:
//
//	job runs ──hold still due later (extended; sim clock behind)──▶ snoozed until then
//	job runs ──hold due by compute_now()──▶ expired, quota refunded, job completed (one transaction)
//	job runs ──confirmed, released or already expired──▶ job completed, nothing changed
//
// River schedules in real time and the hold expires by compute_now(), so the
// worker snoozes (never fails) while the hold is early: until it is due, or, while
// compute_now() is a sim clock (which jumps), for at most SimPoll.
//
// # Sweep
//
// A periodic riverjob.CapacityExpirySweep (River's leader enqueues it every
// SweepEvery, in the maintenance queue) re-enqueues the expiry job of every hold
// overdue by more than Grace, for a job an operator cancelled or River discarded.
// The expiry job is unique by args among live jobs, so the sweep never runs two
// for one hold.
package capacityworker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/bettercompute/bettercompute/domain/capacity"
	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/clock"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/internal/riverjob"
)

// Options configure Register.
type Options struct {
	// SweepEvery is the sweep's period: default one minute; negative disables it.
	SweepEvery time.Duration
	// Grace is how overdue a hold must be before the sweep re-enqueues its
	// expiry job: default 30 s.
	Grace time.Duration
	// MaxSnooze bounds one snooze of an early expiry job: default one hour.
	MaxSnooze time.Duration
	// SimPoll bounds one snooze while compute_now() is not the system clock (a
	// sim clock jumps: a hold due in an hour of sim time may be due in a
	// second): default one second.
	SimPoll time.Duration
}

// Register adds the hold-expiry worker and the sweep to reg. o may be nil.
func Register(reg *workers.Registry, o *Options) error {
	var opts Options
	if o != nil {
		opts = *o
	}
	if opts.SweepEvery == 0 {
		opts.SweepEvery = time.Minute
	}
	if opts.Grace <= 0 {
		opts.Grace = 30 * time.Second
	}
	if opts.MaxSnooze <= 0 {
		opts.MaxSnooze = time.Hour
	}
	if opts.SimPoll <= 0 {
		opts.SimPoll = time.Second
	}
	err := errors.Join(
		workers.AddWorker(reg, &holdExpiryWorker{maxSnooze: opts.MaxSnooze, simPoll: opts.SimPoll}),
		workers.AddMaintenanceWorker(reg, &sweepWorker{grace: opts.Grace}),
	)
	if err != nil || opts.SweepEvery <= 0 {
		return err
	}
	return workers.AddPeriodic(reg, river.NewPeriodicJob(river.PeriodicInterval(opts.SweepEvery),
		func() (river.JobArgs, *river.InsertOpts) {
			return riverjob.CapacityExpirySweep{}, &river.InsertOpts{Queue: jobs.MaintenanceQueue}
		}, &river.PeriodicJobOpts{ID: riverjob.CapacityExpirySweepKind}))
}

// holdExpiryWorker works jobs.CapacityHoldExpiry.
type holdExpiryWorker struct {
	river.WorkerDefaults[jobs.CapacityHoldExpiry]
	maxSnooze, simPoll time.Duration
}

// errNotDue rolls back the fenced transaction of a job that ran early.
var errNotDue = errors.New("hold not due yet")

// minSnooze keeps an early job from spinning.
const minSnooze = 50 * time.Millisecond

// Work expires the job's hold if it is due, in the fenced job transaction, and
// snoozes the job until it is due otherwise.
func (w *holdExpiryWorker) Work(ctx context.Context, job *river.Job[jobs.CapacityHoldExpiry]) error {
	var dueIn time.Duration
	err := workers.InTx(ctx, job, func(ctx context.Context, tx pgx.Tx) error {
		res, err := capacity.ExpireHoldsTx(ctx, tx, &capacity.ExpireParams{PoolID: job.Args.PoolID, ReservationID: job.Args.ReservationID})
		if fault.Has(err, fault.NotFound) {
			return nil // the reservation is gone (deleted by hand): nothing to expire
		}
		if err != nil {
			return err
		}
		if res.DueIn > 0 {
			dueIn = res.DueIn
			return errNotDue
		}
		return nil
	})
	if errors.Is(err, errNotDue) {
		return river.JobSnooze(snoozeFor(ctx, dueIn, w.maxSnooze, w.simPoll))
	}
	return err
}

// snoozeFor is how long a job that ran dueIn (by compute_now()) too early
// snoozes: dueIn, at least 50 ms, at most maxSnooze, and at most simPoll while
// the process's clock anchor says compute_now() is not the system clock.
func snoozeFor(ctx context.Context, dueIn, maxSnooze, simPoll time.Duration) time.Duration {
	d := min(max(dueIn, minSnooze), maxSnooze)
	if rt := workers.RuntimeFrom(ctx); rt != nil {
		if _, mode := rt.Anchor().Skew(); mode != clock.System {
			d = min(d, simPoll)
		}
	}
	return d
}

// sweepWorker works riverjob.CapacityExpirySweep.
type sweepWorker struct {
	river.WorkerDefaults[riverjob.CapacityExpirySweep]
	grace time.Duration
}

// sweepLimit bounds the expiry jobs one sweep enqueues.
const sweepLimit = 1000

// Work enqueues the expiry job of every hold overdue by more than the grace
// period (up to sweepLimit), unique by args: a hold whose job is alive gets no
// second one.
func (w *sweepWorker) Work(ctx context.Context, job *river.Job[riverjob.CapacityExpirySweep]) error {
	rt := workers.RuntimeFrom(ctx)
	if rt == nil {
		return fmt.Errorf("capacity sweep: no worker runtime in the job's context")
	}
	return pg.InTx(ctx, rt.Pool(), func(ctx context.Context, tx pgx.Tx) error {
		// FOR SHARE SKIP LOCKED: a hold its expiry job is expiring right now is
		// skipped, and one expired since this statement's snapshot is re-checked
		// (and dropped) under the lock, so a finished job is never followed by a
		// pointless new one. A hold whose expiry job is live is left out
		// without waiting on that job's row (see riverjob.OverdueHoldsSQL). A
		// stable order keeps two sweeps that overlap from waiting on each
		// other's unique job inserts in a cycle.
		rows, err := tx.Query(ctx, riverjob.OverdueHoldsSQL, w.grace.Seconds(), sweepLimit)
		if err != nil {
			return fmt.Errorf("error finding overdue holds: %w", err)
		}
		due, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (jobs.CapacityHoldExpiry, error) {
			var a jobs.CapacityHoldExpiry
			return a, row.Scan(&a.PoolID, &a.ReservationID)
		})
		if err != nil {
			return fmt.Errorf("error finding overdue holds: %w", err)
		}
		if len(due) == 0 {
			return nil
		}
		shards, err := jobs.ShardCountTx(ctx, tx)
		if err != nil {
			return err
		}
		inserted := 0
		for _, a := range due {
			res, err := jobs.InsertTx(ctx, tx, a, &river.InsertOpts{Queue: jobs.ShardQueue(jobs.ShardOf(a.PoolID, shards))})
			if err != nil {
				return fmt.Errorf("error re-enqueueing the expiry of reservation %d: %w", a.ReservationID, err)
			}
			if !res.UniqueSkippedAsDuplicate {
				inserted++
			}
		}
		if inserted > 0 {
			log := rt.Log()
			log.Warn().Int("holds", inserted).Msg("capacity sweep: re-enqueued the expiry of overdue holds whose job was gone")
		}
		return nil
	})
}
