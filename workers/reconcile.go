package workers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
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
	batch := rec.batch()
	err := w.work(ctx, job, rec, batch)
	if errors.Is(err, errBatchKey) {
		// A key taken into the batch failed: redo this job's own key alone; the
		// other key's job stays queued and fails (and retries) on its own.
		err = w.work(ctx, job, rec, 1)
	}
	return err
}

// errBatchKey marks a failure of a key taken into a batch, not of the job's own.
var errBatchKey = errors.New("a batched key failed")

// claimSQL takes up to $4 more due, waiting reconcile jobs of reconciler $3 in
// queue $1, locking their job rows so River's own fetch skips them.
const claimSQL = `
SELECT j.id, d.key, d.gen, d.dirtied_at
FROM river_job j JOIN compute_dirty d ON d.job_id = j.id
WHERE j.state = 'available' AND j.queue = $1 AND j.scheduled_at <= $2 AND j.kind = 'reconcile'
  AND d.kind = $3
ORDER BY j.priority, j.scheduled_at, j.id
LIMIT $4
FOR UPDATE OF j SKIP LOCKED`

func (w *reconcileWorker) work(ctx context.Context, job *river.Job[jobs.Reconcile], rec *Reconciler, batch int) error {
	rt := runtimeFrom(ctx)
	start := time.Now()
	kind := job.Args.Reconciler
	var dirtied []time.Time
	err := InTx(ctx, job, func(ctx context.Context, tx pgx.Tx) error {
		dirtied = dirtied[:0]
		type done struct {
			key string
			gen int64
			res Result
		}
		var finished []done
		var gen int64
		var at time.Time
		err := tx.QueryRow(ctx, `SELECT gen, dirtied_at FROM compute_dirty WHERE kind = $1 AND key = $2`,
			kind, job.Args.Key).Scan(&gen, &at)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			// Nothing is dirty (an operator re-ran a finished job): done.
		case err != nil:
			return fmt.Errorf("error reading the dirty row of %s/%s: %w", kind, job.Args.Key, err)
		default:
			res, err := rec.Reconcile(ctx, tx, job.Args.Key)
			if err != nil {
				return err
			}
			finished = append(finished, done{job.Args.Key, gen, res})
			dirtied = append(dirtied, at)
		}
		var ids []int64
		if batch > 1 {
			// Batching: more due keys of this reconciler and shard, in this same
			// fenced transaction, one commit for all.
			rows, err := tx.Query(ctx, claimSQL, job.Queue, time.Now(), kind, batch-1)
			if err != nil {
				return err
			}
			type claimed struct {
				id    int64
				key   string
				gen   int64
				dirty time.Time
			}
			var more []claimed
			for rows.Next() {
				var c claimed
				if err := rows.Scan(&c.id, &c.key, &c.gen, &c.dirty); err != nil {
					rows.Close()
					return err
				}
				more = append(more, c)
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return err
			}
			for _, c := range more {
				res, err := rec.Reconcile(ctx, tx, c.key)
				if err != nil {
					rt.log.Warn().Err(err).Str("reconciler", kind).Str("key", c.key).Msg("a batched key failed; its own job will retry it")
					return fmt.Errorf("%w: %s/%s: %w", errBatchKey, kind, c.key, err)
				}
				finished = append(finished, done{c.key, c.gen, res})
				ids = append(ids, c.id)
				dirtied = append(dirtied, c.dirty)
			}
		}
		// The dirty rows last, in key order: a writer locks its domain row before
		// the dirty row, so holding dirty rows only at the end keeps waits short
		// and one-directional.
		slices.SortFunc(finished, func(a, b done) int { return strings.Compare(a.key, b.key) })
		for _, f := range finished {
			if err := finish(ctx, tx, kind, f.key, f.gen, f.res); err != nil {
				return err
			}
		}
		if len(ids) == 0 {
			return nil
		}
		// The batched keys' jobs are done in this transaction too, attempted by
		// this process.
		_, err = tx.Exec(ctx, `UPDATE river_job SET state = 'completed', attempt = attempt + 1,
			attempted_at = $2, finalized_at = $2, attempted_by = array_append(attempted_by, $3)
			WHERE id = ANY($1) AND state = 'available'`, ids, time.Now(), rt.o.Owner)
		return err
	})
	if err == nil && rt != nil {
		took := time.Since(start)
		now := rt.anchor.Now()
		for _, at := range dirtied {
			rt.metrics.reconciled(kind, took, now.Sub(at))
		}
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
