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

	"github.com/bettercompute/bettercompute/domain/lease"
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
	kind, b := job.Args.Reconciler, rec.batch()
	if b <= 1 {
		return w.work(ctx, job, rec, nil)
	}

	// The job's own key, with a first batch of due keys of the same reconciler
	// and shard, in the job's fenced transaction.
	more, err := claim(ctx, rt, job.Queue, kind, b-1)
	if err != nil {
		return err
	}
	err = w.work(ctx, job, rec, more)
	switch {
	case errors.Is(err, errBatchKey):
		// A batched key failed: the job's own key alone, then each batched key
		// alone, so only the failing one goes back to retry.
		if err := w.work(ctx, job, rec, nil); err != nil {
			giveBack(ctx, rt, more, err)
			return err
		}
		w.isolate(ctx, rt, job.Queue, rec, more)
	case err != nil:
		giveBack(ctx, rt, more, err)
		return err
	}

	// While batches come back full, keep draining for a moment: River fetches a
	// queue once per poll interval, so this is what lets a busy shard go faster
	// than one batch per poll.
	deadline := time.Now().Add(DrainFor)
	for len(more) == b-1 && time.Now().Before(deadline) && ctx.Err() == nil {
		if more, err = claim(ctx, rt, job.Queue, kind, b-1); err != nil || len(more) == 0 {
			break
		}
		err := w.workClaimed(ctx, rt, job.Queue, rec, more)
		switch {
		case errors.Is(err, errBatchKey):
			w.isolate(ctx, rt, job.Queue, rec, more)
		case err != nil:
			giveBack(ctx, rt, more, err)
			return nil // this job's own work is done; the others retry on their own
		}
	}
	return nil
}

// DrainFor is how long a reconcile job keeps taking full batches of its shard
// after its own.
const DrainFor = time.Second

// isolate reconciles claimed jobs one per transaction after their batch failed,
// giving back only the ones that fail again.
func (w *reconcileWorker) isolate(ctx context.Context, rt *Runtime, queue string, rec *Reconciler, cs []claimed) {
	for _, c := range cs {
		if err := w.workClaimed(ctx, rt, queue, rec, []claimed{c}); err != nil {
			giveBack(ctx, rt, []claimed{c}, err)
		}
	}
}

// errBatchKey marks a failure of a key taken into a batch, not of the job's own.
var errBatchKey = errors.New("a batched key failed")

// claimed is a waiting reconcile job of the same reconciler and shard that a
// running job took into its batch.
type claimed struct {
	id      int64
	attempt int
	key     string
}

// claim takes up to n more due jobs of reconciler kind in queue into a batch
// (jobs.ClaimReconcileSQL).
//
// A claim that finds nothing makes the next claims of that queue and reconciler
// skip for one poll interval: when keys trickle in, each job is its own batch,
// and an empty claim per job would only cost a transaction.
func claim(ctx context.Context, rt *Runtime, queue, kind string, n int) ([]claimed, error) {
	l, ok := rt.leaseForQueue(queue)
	if !ok {
		return nil, nil // the job's own fence reports it
	}
	idleKey := queue + "\x00" + kind
	if until, ok := rt.claimIdle.Load(idleKey); ok && time.Now().Before(until.(time.Time)) {
		return nil, nil
	}
	var out []claimed
	err := pg.InTx(ctx, rt.pool, func(ctx context.Context, tx pgx.Tx) error {
		rows, err := tx.Query(ctx, jobs.ClaimReconcileSQL, queue, time.Now(), kind, n, l.Name, l.Owner, l.Epoch)
		if err != nil {
			return err
		}
		out = out[:0]
		for rows.Next() {
			var c claimed
			if err := rows.Scan(&c.id, &c.attempt, &c.key); err != nil {
				rows.Close()
				return err
			}
			out = append(out, c)
		}
		rows.Close()
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("error claiming a batch of %s: %w", kind, err)
	}
	if len(out) == 0 {
		rt.claimIdle.Store(idleKey, time.Now().Add(rt.o.PollInterval))
	}
	return out, nil
}

// giveBack returns claimed jobs that were not completed to their queue, with
// why in their errors, as the takeover handback does.
func giveBack(ctx context.Context, rt *Runtime, cs []claimed, cause error) {
	ids := make([]int64, len(cs))
	attempts := make([]int, len(cs))
	for i, c := range cs {
		ids[i], attempts[i] = c.id, c.attempt
	}
	_, err := jobs.GiveBackClaimed(context.WithoutCancel(ctx), rt.pool, ids, attempts, time.Now(), rt.redactErr(cause).Error())
	if err != nil {
		// They stay running under this process; the next shard holder (or
		// River's rescuer) hands them back.
		rt.log.Warn().Err(err).Int("jobs", len(cs)).Msg("could not give back the jobs of a failed batch")
	}
}

// work runs the job's own key, and the claimed jobs' keys, in the job's fenced
// transaction, completing them all.
func (w *reconcileWorker) work(ctx context.Context, job *river.Job[jobs.Reconcile], rec *Reconciler, more []claimed) error {
	var b batchRun
	err := InTx(ctx, job, func(ctx context.Context, tx pgx.Tx) error {
		return b.run(ctx, tx, rec, job.Args.Key, more)
	})
	b.report(runtimeFrom(ctx), rec.Kind, err)
	return err
}

// workClaimed runs claimed jobs' keys in a transaction fenced by the shard lease
// (and each claimed job's attempt), completing them.
func (w *reconcileWorker) workClaimed(ctx context.Context, rt *Runtime, queue string, rec *Reconciler, more []claimed) error {
	l, ok := rt.leaseForQueue(queue)
	if !ok {
		return fault.New(fault.Fenced, "this process holds no lease for queue %s", queue)
	}
	var b batchRun
	err := pg.InTx(ctx, rt.pool, func(ctx context.Context, tx pgx.Tx) error {
		if err := lease.FenceTx(ctx, tx, l); err != nil {
			return err
		}
		return b.run(ctx, tx, rec, "", more)
	})
	if fault.Has(err, fault.Fenced) {
		rt.metrics.fenced(queue)
	}
	b.report(rt, rec.Kind, err)
	return err
}

// batchRun is one transaction's reconciles.
type batchRun struct {
	start   time.Time
	dirtied []time.Time
}

// run reconciles own (the fenced job's key; "" for none) and the claimed jobs'
// keys in tx, ends them, and completes the claimed jobs. A failing batched key
// returns errBatchKey; a failing own key its own error.
func (b *batchRun) run(ctx context.Context, tx pgx.Tx, rec *Reconciler, own string, more []claimed) error {
	b.start, b.dirtied = time.Now(), b.dirtied[:0]
	kind := rec.Kind
	var keys []string
	if own != "" {
		keys = append(keys, own)
	}
	var ids []int64
	var attempts []int
	if len(more) > 0 {
		// The claimed jobs are this process's now; fence each like a job's own.
		ids = make([]int64, 0, len(more))
		attempts = make([]int, 0, len(more))
		for _, c := range more {
			ids, attempts = append(ids, c.id), append(attempts, c.attempt)
		}
		fenced, err := jobs.FenceClaimedTx(ctx, tx, ids, attempts)
		if err != nil {
			return err
		}
		ok := make(map[int64]bool, len(fenced))
		for _, id := range fenced {
			ok[id] = true
		}
		for _, c := range more {
			if ok[c.id] {
				keys = append(keys, c.key)
			}
		}
	}
	// What each key's dirty row says now; a key with none is done already.
	type dirtyRow struct {
		gen int64
		at  time.Time
	}
	byKey := make(map[string]dirtyRow, len(keys))
	rows, err := tx.Query(ctx, `SELECT key, gen, dirtied_at FROM compute_dirty WHERE kind = $1 AND key = ANY($2)`, kind, keys)
	if err != nil {
		return fmt.Errorf("error reading the dirty rows of %s: %w", kind, err)
	}
	for rows.Next() {
		var k string
		var d dirtyRow
		if err := rows.Scan(&k, &d.gen, &d.at); err != nil {
			rows.Close()
			return err
		}
		byKey[k] = d
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}

	var done []finished
	for i, key := range keys {
		d, ok := byKey[key]
		if !ok {
			continue
		}
		res, err := rec.Reconcile(ctx, tx, key)
		if err != nil {
			if i == 0 && own != "" {
				return err
			}
			return fmt.Errorf("%w: %s/%s: %w", errBatchKey, kind, key, err)
		}
		done = append(done, finished{key: key, gen: d.gen, res: res})
		b.dirtied = append(b.dirtied, d.at)
	}
	if err := finishAll(ctx, tx, kind, done); err != nil {
		return err
	}
	if len(ids) > 0 {
		if _, err := jobs.CompleteClaimedTx(ctx, tx, ids, attempts, time.Now()); err != nil {
			return fmt.Errorf("error completing a batch of %s: %w", kind, err)
		}
	}
	return nil
}

func (b *batchRun) report(rt *Runtime, kind string, err error) {
	if err != nil || rt == nil {
		return
	}
	took := time.Since(b.start)
	now := rt.anchor.Now()
	for _, at := range b.dirtied {
		rt.metrics.reconciled(kind, took, now.Sub(at))
	}
}

// finished is a key reconciled in this transaction, with the gen the run read.
type finished struct {
	key string
	gen int64
	res Result
}

// finishAll ends the reconciles of done in their transaction, after every
// reconcile's own writes: a dirty row goes only if its gen is the one the run
// read; a key dirtied during the run gets a follow-up job at its not_before; a
// requested rerun is a DirtyTx with that delay. One statement for all, in key order.
func finishAll(ctx context.Context, tx pgx.Tx, kind string, done []finished) error {
	if len(done) == 0 {
		return nil
	}
	slices.SortFunc(done, func(a, b finished) int { return strings.Compare(a.key, b.key) })
	keys := make([]string, len(done))
	gens := make([]int64, len(done))
	for i, f := range done {
		keys[i], gens[i] = f.key, f.gen
	}
	rows, err := tx.Query(ctx, `
WITH del AS (
    DELETE FROM compute_dirty d
    WHERE d.kind = $1 AND d.key = ANY($2) AND d.gen = ($3::bigint[])[array_position($2::text[], d.key)]
    RETURNING d.key
)
SELECT f.key FROM unnest($2::text[]) AS f(key) WHERE f.key NOT IN (SELECT key FROM del)`, kind, keys, gens)
	if err != nil {
		return fmt.Errorf("error clearing the dirty rows of %s: %w", kind, err)
	}
	moved, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("error clearing the dirty rows of %s: %w", kind, err)
	}
	for _, key := range moved { // dirtied again during the run
		if err := jobs.RequeueTx(ctx, tx, kind, key); err != nil {
			return err
		}
	}
	for _, f := range done {
		if f.res.RequeueAfter > 0 {
			if err := jobs.DirtyTx(ctx, tx, kind, f.key, &jobs.DirtyOpts{Delay: f.res.RequeueAfter}); err != nil {
				return err
			}
		}
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
		err = pg.InTx(ctx, rt.pool, func(ctx context.Context, tx pgx.Tx) error {
			for _, k := range keys {
				if err := jobs.DirtyTx(ctx, tx, rec.Kind, k, nil); err != nil {
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
