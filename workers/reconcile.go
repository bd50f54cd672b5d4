package workers

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
)

// reconcileWorker works jobs.Reconcile: one key of one reconciler, in the fenced
// job transaction.
type reconcileWorker struct {
	river.WorkerDefaults[jobs.Reconcile]
	reg *Registry
}

func (w *reconcileWorker) Work(ctx context.Context, job *river.Job[jobs.Reconcile]) error {
	rec := w.reg.reconcilers[job.Args.Reconciler]
	if rec == nil {
		// Not cancelled: another version of the application may know the kind.
		return fault.New(fault.NotFound, "no reconciler %q is registered in this process", job.Args.Reconciler)
	}
	rt := runtimeFrom(ctx)
	start := time.Now()
	var dirtiedAt time.Time
	err := InTx(ctx, job, func(ctx context.Context, tx pgx.Tx) error {
		var gen int64
		err := tx.QueryRow(ctx, `SELECT gen, dirtied_at FROM compute_dirty WHERE kind = $1 AND key = $2`,
			job.Args.Reconciler, job.Args.Key).Scan(&gen, &dirtiedAt)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil // nothing is dirty: an operator re-ran a finished job
		}
		if err != nil {
			return fmt.Errorf("error reading the dirty row of %s/%s: %w", job.Args.Reconciler, job.Args.Key, err)
		}
		res, err := rec.Reconcile(ctx, tx, job.Args.Key)
		if err != nil {
			return err
		}
		return finish(ctx, tx, job.Args.Reconciler, job.Args.Key, gen, res)
	})
	if err == nil && rt != nil {
		var latency time.Duration
		if !dirtiedAt.IsZero() {
			latency = rt.anchor.Now().Sub(dirtiedAt)
		}
		rt.metrics.reconciled(job.Args.Reconciler, time.Since(start), latency)
	}
	return err
}

// finish ends a reconcile in its transaction: the dirty row goes only if its gen
// is the one the run read; otherwise (dirtied during the run) a follow-up job is
// scheduled at its not_before. A requested rerun is a Dirty with that delay.
func finish(ctx context.Context, tx pgx.Tx, kind, key string, gen int64, res Result) error {
	tag, err := tx.Exec(ctx, `DELETE FROM compute_dirty WHERE kind = $1 AND key = $2 AND gen = $3`, kind, key, gen)
	if err != nil {
		return fmt.Errorf("error clearing %s/%s: %w", kind, key, err)
	}
	if tag.RowsAffected() == 0 {
		if err := jobs.Requeue(ctx, tx, kind, key); err != nil {
			return err
		}
		if res.RequeueAfter <= 0 {
			return nil
		}
	}
	if res.RequeueAfter > 0 {
		return jobs.Dirty(ctx, tx, kind, key, &jobs.DirtyOpts{Delay: res.RequeueAfter})
	}
	return nil
}

// resyncWorker works jobs.Resync: it marks every key a reconciler lists dirty,
// a page per transaction. It is idempotent, so it needs no fence.
type resyncWorker struct {
	river.WorkerDefaults[jobs.Resync]
	reg *Registry
}

// ResyncPage is how many keys one resync transaction marks.
const ResyncPage = 500

func (w *resyncWorker) Work(ctx context.Context, job *river.Job[jobs.Resync]) error {
	rec := w.reg.reconcilers[job.Args.Reconciler]
	if rec == nil || rec.List == nil {
		return nil
	}
	rt := runtimeFrom(ctx)
	after, total := "", 0
	for {
		keys, err := rec.List(ctx, rt.pool, after, ResyncPage)
		if err != nil {
			return fmt.Errorf("error listing the keys of %s: %w", rec.Kind, err)
		}
		if len(keys) == 0 {
			break
		}
		err = pg.InTx(ctx, rt.pool, nil, func(tx pgx.Tx) error {
			for _, k := range keys {
				if err := jobs.Dirty(ctx, tx, rec.Kind, k, nil); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		total += len(keys)
		after = keys[len(keys)-1]
		if len(keys) < ResyncPage {
			break
		}
	}
	rt.log.Info().Str("reconciler", rec.Kind).Int("keys", total).Msg("resync marked keys dirty")
	return nil
}

// resyncJobs are the periodic resync jobs of the registered reconcilers that
// can list their keys.
func (rt *Runtime) resyncJobs() []*river.PeriodicJob {
	var out []*river.PeriodicJob
	for _, kind := range rt.o.Registry.order {
		rec := rt.o.Registry.reconcilers[kind]
		if rec.List == nil {
			continue
		}
		every := rec.ResyncEvery
		if every <= 0 {
			every = rt.o.ResyncEvery
		}
		k := kind
		out = append(out, river.NewPeriodicJob(river.PeriodicInterval(every),
			func() (river.JobArgs, *river.InsertOpts) {
				return jobs.Resync{Reconciler: k}, &river.InsertOpts{Queue: jobs.MaintenanceQueue,
					UniqueOpts: river.UniqueOpts{ByArgs: true, ByPeriod: every}}
			}, &river.PeriodicJobOpts{ID: "resync_" + k}))
	}
	return out
}
