package workers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"go.opentelemetry.io/otel/trace"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/workers/internal/lease"
	"github.com/bettercompute/bettercompute/workers/internal/riverjob"
)

// How reconciles run (see workers.DirtyTx for how keys are marked):
//
//	dirty row, job_id NULL ──the shard holder's batch takes it, in its transaction──▶ taken (no River job)
//	taken ──batch commits, gen unchanged──▶ no row
//	taken ──batch commits, gen moved (dirtied during the run)──▶ waiting again (job_id NULL)
//	taken ──batch rolls back (a crash, a lost lease, a lost connection)──▶ waiting, as it was
//	taken ──a key fails alone──▶ its own reconcile job, retryable (River's backoff)
//	own job ──succeeds──▶ no row (or waiting again) | ──fails──▶ River retries it
//
// A batch is one transaction, fenced by the shard lease from the statement
// that takes its keys (riverjob.TakeDirtySQL) to its commit: it takes the due
// keys of one reconciler, reconciles them, and deletes their rows at the gen it
// read (riverjob.FinishTakenSQL). It writes no River job, so a batch costs one
// transaction. The rows are read, not locked: a writer that dirties a key
// during its reconcile never waits for it; the gen it bumps keeps the row, and
// the key runs again. Two batches of this process never take one key (the
// keys in flight are skipped); a takeover waits for a batch's lease lock, so a
// stale holder commits nothing after it.
//
// A batch job claimed by an older binary (jobs.ClaimDirtySQL, kind
// ReconcileBatchKind) is worked by River as before (batchWorker): its run is
// one fenced transaction that completes the job.
//
// Every run touches only the rows that are waiting (a batch) or point at its
// job (a key's own job): a key has one live job at a time, so two reconciles
// of a key never both commit.
//
// Every run is the span bettercompute.reconcile (ReconcileSpan), caused by the
// dirties of its keys (jobs: "Trace context"): their first cause is its parent
// on the claimed path, where it is the root of the work (River's span is the
// parent of a batch River works), and each cause is a link, at most
// tracing.MaxCauses. The reconciles get its context, so an event they append or
// a key they dirty is caused by the reconcile in turn.

// reconcileWorker works riverjob.Reconcile: one key of one reconciler, on its own
// (a key whose reconcile failed in a batch, retried with River's backoff).
type reconcileWorker struct {
	river.WorkerDefaults[riverjob.Reconcile]
	reg *Registry
}

func (w *reconcileWorker) Work(ctx context.Context, job *river.Job[riverjob.Reconcile]) error {
	rt, l, rec, err := w.reg.reconcileJob(ctx, job.Args.Reconciler, job.JobRow)
	if err != nil {
		return err
	}
	var b batchRun
	err = b.tx(ctx, rt, l, job.JobRow, rec, job.Args.Key, true)
	var ke *keyError
	if errors.As(err, &ke) {
		return ke.err // River retries it with backoff
	}
	return err // completed in the run's transaction
}

// reconcileJob is what a reconcile job River runs needs: the runtime, the
// lease of its shard queue, and reconciler kind. NOT_FOUND if this process
// does not register the kind (not cancelled: another version of the
// application may know it); FENCED if it holds no lease for the queue.
func (reg *Registry) reconcileJob(ctx context.Context, kind string, row *rivertype.JobRow) (*Runtime, lease.Lease, *Reconciler, error) {
	rec := reg.reconcilers[kind]
	if rec == nil {
		return nil, lease.Lease{}, nil, fault.New(fault.NotFound, "no reconciler %q is registered in this process", kind)
	}
	rt := runtimeFrom(ctx)
	l, ok := rt.leaseForQueue(row.Queue)
	if !ok {
		err := fault.New(fault.Fenced, "job %d: this process holds no lease for queue %s", row.ID, row.Queue)
		rt.fenced(ctx, row.Queue, 0, err)
		return nil, lease.Lease{}, nil, err
	}
	return rt, l, rec, nil
}

// batchWorker works riverjob.ReconcileBatch when River runs it: a batch whose
// claimer died or lost its shard before it committed, handed back by the
// shard's next holder.
type batchWorker struct {
	river.WorkerDefaults[riverjob.ReconcileBatch]
	reg *Registry
}

func (w *batchWorker) Work(ctx context.Context, job *river.Job[riverjob.ReconcileBatch]) error {
	rt, l, rec, err := w.reg.reconcileJob(ctx, job.Args.Reconciler, job.JobRow)
	if err != nil {
		return err
	}
	return runBatch(ctx, rt, l, job.JobRow, rec)
}

// runBatch reconciles every key whose dirty row points at batch job row, in one
// fenced transaction that completes the job (redoKeys).
func runBatch(ctx context.Context, rt *Runtime, l lease.Lease, row *rivertype.JobRow, rec *Reconciler) error {
	_, err := redoKeys(ctx, rt, l, row, &batchRun{}, rec)
	return err
}

// redoKeys runs b's transaction (a batch job's keys, or with b.take the keys
// the batch takes, of the reconciler it finds, rec nil). If a key fails, that
// transaction is rolled back, the failing key leaves the batch for a River job
// of its own (retried with River's backoff), and the rest is redone, in one
// transaction again. It reports whether a transaction had keys of its own.
func redoKeys(ctx context.Context, rt *Runtime, l lease.Lease, row *rivertype.JobRow, b *batchRun, rec *Reconciler) (bool, error) {
	had := false
	for {
		err := b.tx(ctx, rt, l, row, rec, "", rec != nil)
		had = had || rec != nil || b.kind != ""
		var ke *keyError
		if !errors.As(err, &ke) || ctx.Err() != nil {
			// (A cancelled attempt, not the key: nothing committed, and the
			// batch goes back whole.)
			return had, err
		}
		failing := rec
		if failing == nil {
			failing = rt.o.Registry.reconcilers[b.kind]
		}
		if err := failKey(ctx, rt, l, row, failing, ke.key, ke.err); err != nil {
			return had, err
		}
	}
}

// failKey gives key, whose reconcile failed with cause on its own, a River job of
// its own, retryable after River's backoff for a first attempt, with cause
// (secrets removed) as that attempt's error. For a batch job's key it fences
// the lease and the job; for a key a batch took (row.ID < 0, no job), the
// lease alone, and the key's row must still be waiting.
func failKey(ctx context.Context, rt *Runtime, l lease.Lease, row *rivertype.JobRow, rec *Reconciler, key string, cause error) error {
	args, err := json.Marshal(riverjob.Reconcile{Reconciler: rec.Kind, Key: key})
	if err != nil {
		return err
	}
	now := time.Now()
	at := (&river.DefaultClientRetryPolicy{}).NextRetry(&rivertype.JobRow{Attempt: 1, AttemptedAt: &now})
	msg := rt.redactErr(cause).Error()
	rt.log.Warn().Str("reconciler", rec.Kind).Str("key", key).Str("error", msg).Time("retry_at", at).
		Msg("reconcile failed; the key retries as its own job")
	var batch any = row.ID
	if row.ID < 0 {
		batch = nil
	}
	return fencedTx(ctx, rt, l, row, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		if row.ID < 0 {
			err = lease.FenceTx(ctx, tx, l)
		} else {
			err = fenceJob(ctx, tx, l, row)
		}
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, riverjob.FailKeySQL, batch, rec.Kind, key, row.Queue, string(args), msg, at, now,
			rt.owner, at.Sub(now).Seconds())
		return err
	})
}

// keyError is a reconcile's own error (or panic) for one key: the run rolls
// back and the key is retried, alone.
type keyError struct {
	key string
	err error
}

func (e *keyError) Error() string { return fmt.Sprintf("reconcile of %s failed: %v", e.key, e.err) }
func (e *keyError) Unwrap() error { return e.err }

// claimedKey is a dirty row that points at a run's job.
type claimedKey struct {
	key     string
	gen     int64
	dirtied time.Time
	causes  []string // traceparents of its dirties (workers.DirtyTx)
}

func scanClaimed(row pgx.CollectableRow) (claimedKey, error) {
	var c claimedKey
	err := row.Scan(&c.key, &c.gen, &c.dirtied, &c.causes)
	return c, err
}

// fencedTx runs fn in a transaction, again while the connection is lost and the
// lease holds (inTxRetrying), counting a FENCED outcome.
func fencedTx(ctx context.Context, rt *Runtime, l lease.Lease, row *rivertype.JobRow, fn func(ctx context.Context, tx pgx.Tx) error) error {
	err := inTxRetrying(ctx, rt, row, l, fn)
	if fault.Has(err, fault.Fenced) {
		rt.fenced(ctx, row.Queue, l.Epoch, err) // the reconcile's span (if any) gets the event
	}
	return err
}

// fenceJob is FenceTx, the lease and the job's attempt, as the first statements
// of tx.
func fenceJob(ctx context.Context, tx pgx.Tx, l lease.Lease, row *rivertype.JobRow) error {
	return FenceTx(ctx, tx, l, row)
}

// batchRun is one reconcile transaction.
type batchRun struct {
	start   time.Time
	dirtied []time.Time
	span    trace.Span // the run's span, from the read of its rows to its commit
	take    *taking    // a batch that takes its keys (nil: the keys of a job)
	kind    string     // the reconciler of the keys taken
	again   []claimedKey
	delays  []time.Duration
}

// tx runs, in one fenced transaction, the reconciles of the keys that point at
// job row (only that one key unless only is ""): the fences and the read of
// the rows in one round trip, each reconcile, then one round trip that deletes
// the rows still at the gen read, returns the others to waiting and, if
// complete, completes the job. A reconcile's error is a *keyError.
func (b *batchRun) tx(ctx context.Context, rt *Runtime, l lease.Lease, row *rivertype.JobRow, rec *Reconciler, only string, complete bool) error {
	err := inTxRetrying(ctx, rt, row, l, func(ctx context.Context, tx pgx.Tx) error {
		if b.take != nil {
			return b.runTaken(ctx, rt, tx, l, row)
		}
		return b.run(ctx, rt, tx, l, row, rec, only, complete)
	})
	if fault.Has(err, fault.Fenced) {
		// The event goes on the reconcile's span: on the claimed path there is
		// no other (a paused holder's batch, refused when it wakes, shows here).
		ectx := ctx
		if b.span != nil {
			ectx = trace.ContextWithSpan(ctx, b.span)
		}
		rt.fenced(ectx, row.Queue, l.Epoch, err)
	}
	if b.span != nil {
		EndSpanOutcome(b.span, err, Outcome(ctx, err))
		b.span = nil
	}
	if err == nil {
		took := time.Since(b.start)
		now := rt.anchor.Now()
		kind := b.kind
		if rec != nil {
			kind = rec.Kind
		}
		for _, at := range b.dirtied {
			rt.metrics.reconciled(kind, took, now.Sub(at))
		}
	}
	return err
}

// restart readies b for a transaction, ending the span of one that lost its
// connection.
func (b *batchRun) restart() {
	b.start, b.dirtied = time.Now(), b.dirtied[:0]
	b.again, b.delays = b.again[:0], b.delays[:0]
	if b.span != nil {
		endSpan(b.span, errRetried) // the connection was lost: the run starts again
		b.span = nil
	}
}

func (b *batchRun) run(ctx context.Context, rt *Runtime, tx pgx.Tx, l lease.Lease, row *rivertype.JobRow, rec *Reconciler, only string, complete bool) error {
	b.restart()
	kind := rec.Kind

	// The fences and the rows, one round trip.
	fb := &pgx.Batch{}
	fb.Queue(jobs.FenceSQL, l.Name, l.Owner, l.Epoch, row.ID, row.Attempt)
	fb.Queue(riverjob.ReadClaimedSQL, kind, row.ID, only)
	res := tx.SendBatch(ctx, fb)
	var fenced int
	errFence := res.QueryRow().Scan(&fenced)
	var claimed []claimedKey
	rows, errRows := res.Query()
	if errRows == nil {
		claimed, errRows = pgx.CollectRows(rows, scanClaimed)
	}
	if err := res.Close(); err != nil && errFence == nil && errRows == nil {
		errRows = err
	}
	if err := fenceResult(fenced, errFence, l, row); err != nil {
		// A refused run is a reconcile span too (outcome FENCED, the event), its
		// keys unread.
		_, b.span = reconcileSpan(ctx, rt.TracerProvider(), l, row, kind, only, nil)
		return err
	}
	if errRows != nil {
		return pg.Translate(fmt.Errorf("error reading the dirty keys of job %d: %w", row.ID, errRows))
	}

	// The reconcile's span: caused by the dirties of its keys (the reconciles
	// get its context, so what they dirty or append records it in turn).
	ctx, b.span = reconcileSpan(ctx, rt.TracerProvider(), l, row, kind, only, claimed)

	keys, gens, err := b.reconcileAll(ctx, tx, rec, claimed)
	if err != nil {
		return err
	}

	// Done: rows still at the gen read go, the others wait again (a new
	// statement sees a dirty committed during the run), the job completes: one
	// call, one round trip.
	if len(keys) > 0 || complete {
		var attempt *int
		if complete {
			attempt = &row.Attempt
		}
		var n int64
		if err := tx.QueryRow(ctx, riverjob.FinishBatchSQL, kind, row.ID, keys, gens, attempt, time.Now()).Scan(&n); err != nil {
			return fmt.Errorf("error finishing the reconciles of %s: %w", kind, err)
		}
		want := int64(len(keys))
		if complete {
			want++
		}
		if n != want {
			// A row stopped pointing at this job during the run: only a job that
			// was no longer live may lose its key, so this attempt is stale.
			return fault.New(fault.Fenced, "job %d: %d of its %d keys are no longer its own", row.ID, want-n, want)
		}
	}
	return b.requeue(ctx, tx, kind)
}

// reconcileAll reconciles the claimed keys in tx, in order, and returns their
// keys and gens; a reconcile's error is a *keyError.
func (b *batchRun) reconcileAll(ctx context.Context, tx pgx.Tx, rec *Reconciler, claimed []claimedKey) (keys []string, gens []int64, err error) {
	keys, gens = make([]string, len(claimed)), make([]int64, len(claimed))
	for i, c := range claimed {
		res, err := reconcileOne(ctx, tx, rec, c.key)
		if err != nil {
			return nil, nil, &keyError{key: c.key, err: err}
		}
		keys[i], gens[i] = c.key, c.gen
		b.dirtied = append(b.dirtied, c.dirtied)
		if res.RequeueAfter > 0 {
			b.again, b.delays = append(b.again, c), append(b.delays, res.RequeueAfter)
		}
	}
	return keys, gens, nil
}

// requeue marks dirty again, after their delay, the keys whose reconcile asked
// to run again: after the finish, which deleted their rows.
func (b *batchRun) requeue(ctx context.Context, tx pgx.Tx, kind string) error {
	for i, c := range b.again {
		if err := DirtyTx(ctx, tx, kind, c.key, &DirtyOpts{Delay: b.delays[i]}); err != nil {
			return err
		}
	}
	return nil
}

// reconcileOne runs rec for key in tx, a panic becoming its error.
func reconcileOne(ctx context.Context, tx pgx.Tx, rec *Reconciler, key string) (res Result, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fault.New(fault.Internal, "reconcile of %s/%s panicked: %v", rec.Kind, key, p)
		}
	}()
	return rec.Reconcile(ctx, tx, key)
}

// --- The shard's claim loop ---

// claimLoop runs batches of due dirty keys of shard while this process holds
// its lease: up to WorkersPerShard batches at once, each taking its keys in
// its own transaction (takeBatch); a batch whose take comes back full is
// followed by the next at once (the drain), one that does not by a wait for
// the scout (scoutLoop) to find the shard due again. It returns when the lease
// is lost or the runtime stops claiming, after its batches in flight ended.
func (rt *Runtime) claimLoop(shard int, wake <-chan struct{}) {
	defer rt.claimWG.Done()
	var running sync.WaitGroup
	defer func() {
		running.Wait()
		rt.claimLoopDone(shard)
	}()
	kinds, sizes := rt.o.Registry.claimKinds()
	queue := jobs.ShardQueue(shard)
	name := ShardLease(shard)
	flight := &inFlight{keys: map[takeKey]struct{}{}}
	slots := make(chan struct{}, rt.o.WorkersPerShard)
	for first := true; ; first = false {
		if !first {
			select {
			case <-rt.claimStop:
				return
			case <-wake:
			}
		}
		for {
			l, ok := rt.keeper.Held(name)
			if !ok {
				return
			}
			select {
			case slots <- struct{}{}:
			case <-rt.claimStop:
				return
			}
			took := make(chan bool, 1)
			t := &taking{shard: shard, kinds: kinds, sizes: sizes, flight: flight, took: took}
			running.Add(1)
			go func() {
				defer func() { <-slots; running.Done() }()
				rt.takeBatch(l, queue, t)
			}()
			if full := <-took; !full {
				break
			}
		}
	}
}

// resyncWorker works riverjob.Resync: it marks every key a reconciler lists dirty,
// a page per transaction. It is idempotent, so it needs no fence.
type resyncWorker struct {
	river.WorkerDefaults[riverjob.Resync]
	reg *Registry
}

// resyncPage is how many keys one resync transaction marks.
const resyncPage = 500

func (w *resyncWorker) Work(ctx context.Context, job *river.Job[riverjob.Resync]) error {
	rec := w.reg.reconcilers[job.Args.Reconciler]
	if rec == nil || rec.List == nil {
		return nil
	}
	rt := runtimeFrom(ctx)
	after, total := "", 0
	for {
		keys, err := rec.List(ctx, rt.pool, after, resyncPage)
		if err != nil {
			return fmt.Errorf("error listing the keys of %s: %w", rec.Kind, err)
		}
		if len(keys) == 0 {
			break
		}
		err = pg.InTx(ctx, rt.pool, func(ctx context.Context, tx pgx.Tx) error {
			for _, k := range keys {
				if err := DirtyTx(ctx, tx, rec.Kind, k, nil); err != nil {
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
		if len(keys) < resyncPage {
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
				return riverjob.Resync{Reconciler: k}, &river.InsertOpts{Queue: jobs.MaintenanceQueue,
					UniqueOpts: river.UniqueOpts{ByArgs: true, ByPeriod: every}}
			}, &river.PeriodicJobOpts{ID: "resync_" + k}))
	}
	return out
}
