package workers

import (
	"context"
	"reflect"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/workers/internal/riverjob"
)

// Reconciler reconciles keys of one kind: see workers.DirtyTx for how keys are marked.
type Reconciler struct {
	// Kind names the reconciler: [a-z][a-z0-9_]{0,62}.
	Kind string
	// Reconcile brings key to its desired state inside tx, the fenced job
	// transaction: read, write what follows, and return. It may ask to run again
	// after a delay. An error rolls everything back and is retried with backoff.
	Reconcile func(ctx context.Context, tx pgx.Tx, key string) (Result, error)
	// List, optional, returns up to limit keys the reconciler owns that sort after
	// after (ascending). Every resync interval, every listed key is marked dirty.
	List func(ctx context.Context, db pg.DBTX, after string, limit int) ([]string, error)
	// ResyncEvery overrides the configured resync interval for this reconciler.
	ResyncEvery time.Duration
	// Batch is how many due keys of this reconciler and one shard one fenced
	// transaction may reconcile, claimed together and committed together.
	// Default 32; 1 reconciles one key per transaction. If a key fails, the
	// transaction is rolled back, the failing key leaves the batch to retry as
	// its own River job, and the rest is redone in one transaction.
	Batch int
}

// defaultBatch is Reconciler.Batch's default.
const defaultBatch = 32

func (r *Reconciler) batch() int {
	if r.Batch <= 0 {
		return defaultBatch
	}
	return r.Batch
}

// Result is what a reconcile asks for next.
type Result struct {
	// RequeueAfter > 0 runs the key again after this delay.
	RequeueAfter time.Duration
}

// Registry collects what modules contribute to a worker process. It is filled
// before the Runtime starts and read-only after.
//
// Every registration has one shape: a function of the registry and the thing
// registered, returning an error (INVALID_CONFIG for a bad or duplicate one),
// so that a module's Register reads as one errors.Join:
//
//	Register: func(r *workers.Registry) error {
//		return errors.Join(
//			workers.AddReconciler(r, workers.Reconciler{Kind: "item", Reconcile: reconcileItem}),
//			workers.AddWorker(r, &ShipWorker{}),
//			workers.AddSink(r, workers.Sink{Name: "audit", HandleTx: recordAudit}),
//			workers.AddBackfill(r, normalizeNames),
//		)
//	}
type Registry struct {
	workers     *river.Workers
	periodic    []*river.PeriodicJob
	reconcilers map[string]*Reconciler
	order       []string
	onStart     []func(ctx context.Context, rt *Runtime) error
	onRecord    []func(ctx context.Context, db pg.DBTX) error
	onCheck     []func(ctx context.Context, db pg.DBTX) error
	kinds       map[string]bool                  // every kind with a worker
	fenced      []string                         // kinds worked in shard queues, in registration order
	parts       map[reflect.Type]any             // Use
	takers      map[reflect.Type]func(any) error // OnAdd
	waiting     map[reflect.Type][]any           // added before their OnAdd
}

// NewRegistry returns an empty registry with the built-in workers.
func NewRegistry() *Registry {
	r := &Registry{workers: river.NewWorkers(), reconcilers: map[string]*Reconciler{}, kinds: map[string]bool{}}
	must(AddWorker(r, &reconcileWorker{reg: r}))
	must(AddWorker(r, &batchWorker{reg: r}))
	must(AddMaintenanceWorker(r, &resyncWorker{reg: r}))
	return r
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}

// AddWorker registers w, the River worker of an application's job kind, in
// every worker process built from r. A job of this kind runs in a shard queue,
// fenced by the shard's lease (w writes through InTx): insert it with
// workers.InsertForKeyTx, whose key picks the shard. The kind is recorded as
// fenced (at migrate and at every worker start), and an insert of it into any
// other queue, which no worker works, is refused with INVALID_ARGUMENT. It
// returns INVALID_CONFIG for a bad kind or a kind registered twice.
func AddWorker[T river.JobArgs](r *Registry, w river.Worker[T]) error {
	var args T
	return AddWorkerArgs(r, args, w)
}

// AddWorkerArgs is AddWorker for a kind read from args instead of T's zero
// value, so that one args type can serve several kinds (a kind per backfill).
func AddWorkerArgs[T river.JobArgs](r *Registry, args T, w river.Worker[T]) error {
	if err := r.addKind(args.Kind(), w != nil); err != nil {
		return err
	}
	r.fenced = append(r.fenced, args.Kind())
	river.AddWorkerArgs(r.workers, args, w)
	return nil
}

// AddMaintenanceWorker registers w for a kind of jobs.MaintenanceQueue, which
// every worker process works whatever shards it holds: the built-in modules'
// own jobs that are not fenced by a shard lease (outbox deliveries and
// retention, sweeps, resyncs), which fence themselves. An application's job
// belongs to a shard: use AddWorker.
func AddMaintenanceWorker[T river.JobArgs](r *Registry, w river.Worker[T]) error {
	var args T
	if err := r.addKind(args.Kind(), w != nil); err != nil {
		return err
	}
	river.AddWorker(r.workers, w)
	return nil
}

func (r *Registry) addKind(kind string, haveWorker bool) error {
	if kind == "" {
		return fault.New(fault.InvalidConfig, "a job kind is empty")
	}
	if !haveWorker {
		return fault.New(fault.InvalidConfig, "the worker for job kind %q is nil", kind)
	}
	if r.kinds[kind] {
		return fault.New(fault.InvalidConfig, "a worker for job kind %q is registered twice", kind)
	}
	r.kinds[kind] = true
	return nil
}

// FencedKinds returns the job kinds worked in shard queues (AddWorker), in
// registration order.
func (r *Registry) FencedKinds() []string { return append([]string(nil), r.fenced...) }

// Part is a module's machinery in a registry: a value holding the module's
// options and what applications registered with it (the outbox's sinks and
// dispatchers, the backfills, the quorum appliers). Install registers the
// workers, periodic jobs and start hooks that work it; each carries the part
// itself, the way a River worker carries its dependencies into river.AddWorker.
// It is the one way a module keeps state per registry: no package variables.
type Part interface {
	Install(r *Registry) error
}

// Use returns r's part of type P, made by newP and installed the first time it
// is asked for: every later call, from any module, gets the same value. It
// returns Install's error (and keeps nothing) if the install fails.
func Use[P Part](r *Registry, newP func() P) (P, error) {
	key := reflect.TypeFor[P]()
	if p, ok := r.parts[key]; ok {
		return p.(P), nil
	}
	p := newP()
	if err := p.Install(r); err != nil {
		var zero P
		return zero, err
	}
	if r.parts == nil {
		r.parts = map[reflect.Type]any{}
	}
	r.parts[key] = p
	return p, nil
}

// AddPeriodic registers a periodic job; River's elected leader enqueues it.
func AddPeriodic(r *Registry, job *river.PeriodicJob) error {
	if job == nil {
		return fault.New(fault.InvalidConfig, "AddPeriodic: nil periodic job")
	}
	r.periodic = append(r.periodic, job)
	return nil
}

// OnStart registers a function run when a worker Runtime has started (for
// example, a module's own lease keeper). It runs once per start.
func (r *Registry) OnStart(f func(ctx context.Context, rt *Runtime) error) {
	r.onStart = append(r.onStart, f)
}

// OnRecord registers a function that records what the registry defines in the
// database (as the fenced kinds are): Record runs it at migrate and at every
// worker start, before River starts.
func (r *Registry) OnRecord(f func(ctx context.Context, db pg.DBTX) error) {
	r.onRecord = append(r.onRecord, f)
}

// OnCheck registers a check a worker runs at start, after Record and before it
// works anything: an error (INVALID_CONFIG) refuses the start.
func (r *Registry) OnCheck(f func(ctx context.Context, db pg.DBTX) error) {
	r.onCheck = append(r.onCheck, f)
}

// Record records in db what the registry defines: its fenced job kinds
// (riverjob.RecordFencedKinds) and what modules record with OnRecord (the
// workflow definitions). migrate and every worker start call it.
func (r *Registry) Record(ctx context.Context, db pg.DBTX) error {
	if err := r.unclaimed(); err != nil {
		return err
	}
	if err := riverjob.RecordFencedKinds(ctx, db, r.FencedKinds()); err != nil {
		return err
	}
	for _, f := range r.onRecord {
		if err := f(ctx, db); err != nil {
			return err
		}
	}
	return nil
}

// Check runs the registry's start checks (OnCheck).
func (r *Registry) Check(ctx context.Context, db pg.DBTX) error {
	for _, f := range r.onCheck {
		if err := f(ctx, db); err != nil {
			return err
		}
	}
	return nil
}

// AddReconciler registers a reconciler. It returns INVALID_CONFIG for a bad or
// duplicate kind or a missing Reconcile.
func AddReconciler(r *Registry, rec Reconciler) error {
	if err := riverjob.ValidateKind(rec.Kind); err != nil {
		return fault.Wrap(fault.InvalidConfig, err, "bad reconciler")
	}
	if rec.Reconcile == nil {
		return fault.New(fault.InvalidConfig, "reconciler %s has no Reconcile function", rec.Kind)
	}
	if _, dup := r.reconcilers[rec.Kind]; dup {
		return fault.New(fault.InvalidConfig, "reconciler %s is registered twice", rec.Kind)
	}
	if rec.Batch < 0 {
		return fault.New(fault.InvalidConfig, "reconciler %s: Batch %d is negative", rec.Kind, rec.Batch)
	}
	if rec.ResyncEvery < 0 {
		return fault.New(fault.InvalidConfig, "reconciler %s: ResyncEvery %s is negative", rec.Kind, rec.ResyncEvery)
	}
	r.reconcilers[rec.Kind] = &rec
	r.order = append(r.order, rec.Kind)
	return nil
}

// claimKinds are the registered reconciler kinds with their batch sizes
// (aligned): what a shard's batches take.
func (r *Registry) claimKinds() (kinds []string, sizes []int) {
	for _, k := range r.order {
		kinds = append(kinds, k)
		sizes = append(sizes, r.reconcilers[k].batch())
	}
	return kinds, sizes
}

// Reconcilers returns the registered reconciler kinds in registration order.
func (r *Registry) Reconcilers() []string { return append([]string(nil), r.order...) }
