package workers

import (
	"context"
	"errors"
	"reflect"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/domain/outbox"
	"github.com/bettercompute/bettercompute/domain/workflow"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
)

// An application registers everything its worker processes run in this package
// (AddWorker, AddReconciler, AddPeriodic, AddSink, AddBackfill, AddWorkflow),
// whichever built-in module runs it: the module takes what is added with OnAdd.
// A value added before its module's OnAdd waits for it; one whose module never
// came is INVALID_CONFIG at migrate and at worker start (Record).

// Sink is a named consumer of the outbox's event log (outbox.AppendTx), with
// its own cursor and its own lease (sink/<name>). It has one handler: Handle
// for an outside system (at least once), or HandleTx for writes into this
// database (exactly once). The built-in outbox module runs it.
type Sink struct {
	// Name: a lowercase letter, then up to 62 of [a-z0-9_.-].
	Name string
	// Handle receives the next batch, in (txid, seq) order, outside any
	// transaction. The cursor moves past the batch only after Handle returned
	// nil, so a batch is delivered at least once: after a crash, a lost lease or
	// an error it is delivered again, whole. Use it for outside systems (a
	// webhook, a broker, a search index) and make it idempotent with each
	// event's ID. An error (or a panic) is retried with backoff (1 s, 2 s, 4 s …
	// up to the outbox's SinkMaxBackoff) without holding back other sinks. ctx is
	// cancelled when the sink's lease is lost or Timeout passes. It may reach the
	// worker's pool with RuntimeFrom(ctx).Pool().
	Handle func(ctx context.Context, events []outbox.Event) error
	// HandleTx receives the next batch inside the fenced transaction that moves the
	// cursor past it: its writes and the cursor commit together or not at all, so a
	// sink writing to this database applies every event exactly once. Use it for
	// projections, read models and counters kept in this database.
	//
	// The transaction is fenced (the sink's lease, the job's attempt) before
	// HandleTx is called, and the fence holds a takeover back until it ends: a
	// process that lost the lease gets FENCED and commits nothing. An error or a
	// panic rolls the whole transaction back (none of the handler's writes, the
	// cursor where it was), is recorded on the sink, and the batch is retried as
	// Handle's is. If an operator resets the sink during the call, the handler's
	// writes are rolled back (they run in a savepoint) and delivery goes on from
	// the new cursor.
	//
	// Write through tx only (a write on another connection is outside the
	// guarantee, back to at least once), and do not commit or roll it back. Keep
	// it short: while the transaction is open it holds every reader of the log
	// (every sink, the SSE stream) at its txid, and the sink's lease and job rows
	// locked. Set either Handle or HandleTx, not both.
	HandleTx func(ctx context.Context, tx pgx.Tx, events []outbox.Event) error
	// Topics keeps only events of these topics (default: all). Others are moved
	// past without a call.
	Topics []string
	// BatchSize is the most events one delivery reads (default 1,000).
	BatchSize int
	// From is where a new sink's cursor starts: outbox.Start (every retained
	// event, the default) or outbox.End. An existing sink keeps its cursor.
	From outbox.Position
	// Timeout bounds one delivery job, which may deliver several batches
	// (default 1 min).
	Timeout time.Duration
}

// AddSink registers a sink, for every worker process built from r: each
// process creates the sink's state at start and polls it; deliveries run as
// River jobs (kind outbox_deliver) in the maintenance queue. It returns
// INVALID_CONFIG for a bad or duplicate name, or unless exactly one of Handle
// and HandleTx is set.
//
//	err := workers.AddSink(r, workers.Sink{
//		Name:   "order_totals",
//		Topics: []string{"order.placed"},
//		HandleTx: func(ctx context.Context, tx pgx.Tx, events []outbox.Event) error {
//			return totals.ApplyTx(ctx, tx, events) // commits with the cursor
//		},
//	})
func AddSink(r *Registry, s Sink) error { return add(r, s) }

// Backfill is work that grows with data: a name and a batch function, run
// batch by batch in fenced transactions until a batch handles no row, with
// options that keep it gentle with the live system. An operator starts it
// (`backfill start NAME`); the built-in backfill module runs it.
type Backfill struct {
	// Name identifies the backfill in the CLI, in compute_backfills and in River
	// (its jobs' kind is backfill_<Name>): [a-z][a-z0-9_]{0,62}.
	Name string

	// Batch handles at most batchSize unfinished rows inside tx, the batch's
	// fenced transaction, and returns how many it handled. It must select only
	// unfinished rows (WHERE new_column IS NULL) and write with upserts or guarded
	// updates, so that a retry reaches the same final state. The backfill is done
	// when a batch returns 0. An error rolls the batch back and is retried with
	// backoff (INVALID_ARGUMENT cancels the job instead: the backfill stalls); so
	// does a panic, as INTERNAL_ERROR.
	//
	// Give its selection an index (a partial index WHERE new_column IS NULL, or a
	// cursor of its own kept in a table of its own, in tx): otherwise each batch
	// scans past every row already done and the backfill slows down as it goes.
	Batch func(ctx context.Context, tx pgx.Tx, batchSize int) (rows int, err error)

	// Estimate, optional, returns how many rows are left, for the progress bar's
	// total and the ETA. It runs in the batch's transaction at most every
	// EstimateEvery, and at start; keep it cheap (a count over a partial index, or
	// the planner's estimate).
	Estimate func(ctx context.Context, db pg.DBTX) (rowsLeft int64, err error)

	// BatchSize is the most rows one batch handles (1 to 100,000; default
	// 1000). Batches are sized by time up to it (see BatchTime); a run's first
	// batch asks for min(BatchSize, 1000) rows.
	BatchSize int
	// BatchTime is how long a batch should take; default 25 ms. After each
	// batch the next one asks for size × BatchTime / took rows, at least half
	// and at most twice the size, between 1 and BatchSize (and, with
	// MaxRowsPerSecond, at most MaxRowsPerSecond × BatchTime): short
	// transactions that hold their rows briefly, as many rows as that allows.
	BatchTime time.Duration
	// FixedBatchSize turns the sizing off: every batch asks for BatchSize rows.
	FixedBatchSize bool
	// Pause is the least time between the end of a batch and the start of the
	// next; default 0 (the worker's poll interval still separates them).
	Pause time.Duration
	// MaxRowsPerSecond caps the average rate: after a batch of n rows the next
	// waits until n/MaxRowsPerSecond has passed since this one began. 0: no cap.
	MaxRowsPerSecond float64
	// EstimateEvery is how often a batch refreshes the estimate; default 10 s.
	EstimateEvery time.Duration
	// Timeout bounds one batch job; default the worker's job timeout (1 min).
	// A batch still running then is cancelled (its context ends), rolls back
	// and fails with UNAVAILABLE; River retries it.
	Timeout time.Duration
}

// AddBackfill registers a backfill: a River worker for its kind in every worker
// process built from r, and the backfill among those the CLI knows. It returns
// INVALID_CONFIG for a bad option or a name registered twice.
func AddBackfill(r *Registry, b Backfill) error { return add(r, b) }

// AddWorkflow registers a workflow definition (a *workflow.Workflow[In, S,
// Out]): its steps run as fenced jobs in the shard queue of the instance's id,
// and migrate and every worker start record its kind and steps. It returns
// INVALID_CONFIG for an invalid definition or a kind registered twice.
func AddWorkflow(r *Registry, d workflow.Definition) error { return add(r, d) }

// OnAdd makes take receive every value of type T added to r (a Sink, a
// Backfill, a workflow.Definition), those added before this call first: a
// built-in module calls it from its Part's Install. It returns the joined
// errors of the values handed over now.
func OnAdd[T any](r *Registry, take func(T) error) error {
	key := reflect.TypeFor[T]()
	if r.takers == nil {
		r.takers = map[reflect.Type]func(any) error{}
	}
	if _, dup := r.takers[key]; dup {
		return fault.New(fault.InvalidConfig, "%s already has a module that takes it", key)
	}
	r.takers[key] = func(v any) error { return take(v.(T)) }
	waiting := r.waiting[key]
	delete(r.waiting, key)
	var errs []error
	for _, v := range waiting {
		errs = append(errs, take(v.(T)))
	}
	return errors.Join(errs...)
}

// add hands v to the module that takes values of type T, or keeps it until
// that module's OnAdd.
func add[T any](r *Registry, v T) error {
	key := reflect.TypeFor[T]()
	if take, ok := r.takers[key]; ok {
		return take(v)
	}
	if r.waiting == nil {
		r.waiting = map[reflect.Type][]any{}
	}
	r.waiting[key] = append(r.waiting[key], v)
	return nil
}

// unclaimed is INVALID_CONFIG if a value was added whose module was never
// registered in r (a sink without the outbox module, say).
func (r *Registry) unclaimed() error {
	for key, vs := range r.waiting {
		if len(vs) > 0 {
			return fault.New(fault.InvalidConfig, "%d %s added, but the built-in module that runs it is not registered (cli.App registers them all)", len(vs), key)
		}
	}
	return nil
}
