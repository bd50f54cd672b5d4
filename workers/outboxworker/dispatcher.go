package outboxworker

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/rs/zerolog"

	"github.com/bettercompute/bettercompute/domain/outbox"
	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/internal/riverjob"
)

// DispatcherOptions define a table dispatcher (seed 003, "Deliver an outbox"):
// an application-owned outbox table, how to walk it, and what publishing a row
// means. See domain/outbox.Table for the table's required columns and indexes.
type DispatcherOptions[T any] struct {
	// Name identifies the dispatcher in logs, jobs and River UI:
	// [a-z][a-z0-9_.:-]{0,62}.
	Name string
	// Table, OrderBy, Sequence and Where: see domain/outbox.Table. Names are
	// validated before any query.
	Table    string
	OrderBy  string
	Sequence string
	Where    map[string]any
	// BatchSize is the most rows one claim takes (default 100).
	BatchSize int
	// ClaimTimeout: a claim's rows are reclaimable after it, a stalled claim
	// gives up its turn after it, and a batch that outlives it starts no further
	// publish (default 30 s). Keep a batch within it: bound Publish with a
	// deadline (its ctx has one) and lower BatchSize for a slow receiver.
	ClaimTimeout time.Duration
	// ReconcileInterval: a pass also runs this often (default 10 s).
	ReconcileInterval time.Duration
	// Concurrency is how many keys of a batch are published at once (default 16).
	Concurrency int
	// Publish delivers one row, decoded from its JSON (to_jsonb of the whole
	// row) into T. nil means published: the row is deleted when its batch ends.
	// An error keeps the row and its place; it is retried after 2, 4, 8 … 256 s,
	// without end, holding back later rows of its key only. Pass the row's id to
	// the receiver as the idempotency key: a row may be published again.
	Publish func(ctx context.Context, row T) error
	// Log receives the failures ("outbox delivery failed") of passes run through
	// Reconcile; passes run as River jobs log to the worker's logger.
	Log zerolog.Logger
}

// Dispatcher publishes the rows of an application's outbox table: every
// worker process runs its passes (River jobs), together delivering each row at
// least once, in sequence order per key, different keys in parallel. Its
// guarantees are in the package doc.
type Dispatcher[T any] struct {
	o DispatcherOptions[T]
	c *outbox.Compiled

	mu  sync.Mutex
	cur *passRun // the pass running in this process, if any

	// beforeFinish, a test hook (nil outside tests), runs after a batch was
	// published, before its end is written.
	beforeFinish func(o outbox.Outcome)
}

type passRun struct {
	done  chan struct{}
	again bool // a caller joined: claim once more before ending
	n     int
	err   error
}

var dispatcherNameRe = regexp.MustCompile(`^[a-z][a-z0-9_.:-]{0,62}$`)

// NewDispatcher validates o and returns the dispatcher; nothing runs until it is
// registered (AddDispatcher) in a worker registry or Reconcile is called.
// It sends no query: a bad table or column name fails here with INVALID_CONFIG
// "invalid outbox table …" or "invalid outbox … column …".
func NewDispatcher[T any](o DispatcherOptions[T]) (*Dispatcher[T], error) {
	if !dispatcherNameRe.MatchString(o.Name) {
		return nil, fault.New(fault.InvalidConfig, "invalid outbox dispatcher name %q: want [a-z][a-z0-9_.:-]{0,62}", o.Name)
	}
	if o.Publish == nil {
		return nil, fault.New(fault.InvalidConfig, "outbox dispatcher %s has no Publish function", o.Name)
	}
	if o.ReconcileInterval < 0 || o.ReconcileInterval > 0 && o.ReconcileInterval < time.Second {
		return nil, fault.New(fault.InvalidConfig, "outbox dispatcher %s: reconcile interval %s is too short (at least 1s)", o.Name, o.ReconcileInterval)
	}
	if o.Concurrency < 0 {
		return nil, fault.New(fault.InvalidConfig, "outbox dispatcher %s: concurrency %d is negative", o.Name, o.Concurrency)
	}
	c, err := outbox.Compile(outbox.Table{Table: o.Table, OrderBy: o.OrderBy, Sequence: o.Sequence, Where: o.Where,
		BatchSize: o.BatchSize, ClaimTimeout: o.ClaimTimeout})
	if err != nil {
		return nil, err
	}
	if o.ReconcileInterval == 0 {
		o.ReconcileInterval = 10 * time.Second
	}
	if o.Concurrency == 0 {
		o.Concurrency = 16
	}
	return &Dispatcher[T]{o: o, c: c}, nil
}

// Name is the dispatcher's name.
func (d *Dispatcher[T]) Name() string { return d.o.Name }

// passer is a dispatcher of any row type, as the registry holds it.
type passer interface {
	Name() string
	pass(ctx context.Context, db pg.DBTX, log zerolog.Logger, budget time.Duration) (n int, more bool, err error)
	interval() time.Duration
	timeout() time.Duration
	stats(ctx context.Context, db pg.DBTX) (outbox.TableStats, error)
}

func (d *Dispatcher[T]) stats(ctx context.Context, db pg.DBTX) (outbox.TableStats, error) {
	return d.c.Stats(ctx, db)
}

func (d *Dispatcher[T]) interval() time.Duration { return d.o.ReconcileInterval }

func (d *Dispatcher[T]) timeout() time.Duration {
	return passBudget + 2*d.c.Table().ClaimTimeout + 10*time.Second
}

// passBudget bounds one pass run as a River job: after it, the pass starts no
// new batch and enqueues a follow-up pass, so a busy table never holds a
// maintenance worker for ever.
const passBudget = 30 * time.Second

// AddDispatcher registers d in reg: every worker process runs its passes as
// River jobs (kind outbox_dispatch, maintenance queue), on Notify and every
// ReconcileInterval. It returns INVALID_CONFIG for a name registered twice.
func AddDispatcher[T any](reg *workers.Registry, d *Dispatcher[T]) error {
	if d == nil {
		return fault.New(fault.InvalidConfig, "AddDispatcher: nil dispatcher")
	}
	st, err := stateOf(reg)
	if err != nil {
		return err
	}
	st.mu.Lock()
	if _, dup := st.dispatchers[d.o.Name]; dup {
		st.mu.Unlock()
		return fault.New(fault.InvalidConfig, "outbox dispatcher %s is registered twice", d.o.Name)
	}
	st.dispatchers[d.o.Name] = d
	st.mu.Unlock()
	name := d.o.Name
	return workers.AddPeriodic(reg, river.NewPeriodicJob(river.PeriodicInterval(d.o.ReconcileInterval),
		func() (river.JobArgs, *river.InsertOpts) {
			return riverjob.OutboxDispatch{Dispatcher: name}, dispatchOpts()
		}, &river.PeriodicJobOpts{RunOnStart: true}))
}

func dispatchOpts() *river.InsertOpts {
	return &river.InsertOpts{Queue: jobs.MaintenanceQueue, MaxAttempts: 5, Tags: []string{"outbox_dispatch"}}
}

// Notify runs a pass soon, on some worker process: it enqueues a pass job (the
// River poll interval away) unless one is already waiting to start. Call it
// after the commit that wrote rows, or with the writing transaction itself as
// db, so the job commits with the rows. Without it, rows wait for the next
// ReconcileInterval.
func (d *Dispatcher[T]) Notify(ctx context.Context, db pg.DBTX) error {
	return notify(ctx, db, d.o.Name)
}

func notify(ctx context.Context, db pg.DBTX, name string) error {
	return pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		waiting, err := riverjob.OutboxDispatchWaitingTx(ctx, tx, name)
		if err != nil || waiting {
			return err
		}
		_, err = jobs.InsertTx(ctx, tx, riverjob.OutboxDispatch{Dispatcher: name}, dispatchOpts())
		return err
	})
}

// Reconcile runs a pass in this process now and returns the number of rows it
// handled (published or failed). A pass claims and publishes batches until no
// row is due. A call while a pass of d runs in this process joins that pass
// (which then claims once more before ending) and returns its count. db must be
// a pool: claims and batch ends commit their own transactions.
func (d *Dispatcher[T]) Reconcile(ctx context.Context, db pg.DBTX) (int, error) {
	n, _, err := d.pass(ctx, db, d.o.Log, 0)
	return n, err
}

func (d *Dispatcher[T]) pass(ctx context.Context, db pg.DBTX, log zerolog.Logger, budget time.Duration) (int, bool, error) {
	d.mu.Lock()
	if p := d.cur; p != nil {
		p.again = true
		d.mu.Unlock()
		select {
		case <-p.done:
			return p.n, false, p.err
		case <-ctx.Done():
			return 0, false, ctx.Err()
		}
	}
	p := &passRun{done: make(chan struct{})}
	d.cur = p
	d.mu.Unlock()

	n, more, err := d.run(ctx, db, log, budget, p)

	d.mu.Lock()
	d.cur = nil
	p.n, p.err = n, err
	close(p.done)
	d.mu.Unlock()
	return n, more, err
}

func (d *Dispatcher[T]) run(ctx context.Context, db pg.DBTX, log zerolog.Logger, budget time.Duration, p *passRun) (int, bool, error) {
	log = log.With().Str("outbox", d.o.Name).Logger()
	start := time.Now()
	total := 0
	for {
		if budget > 0 && time.Since(start) > budget {
			return total, true, nil
		}
		b, err := d.c.Claim(ctx, db)
		if err != nil {
			return total, false, err
		}
		if len(b.Rows) == 0 {
			d.mu.Lock()
			again := p.again
			p.again = false
			d.mu.Unlock()
			if again {
				continue
			}
			return total, false, nil
		}
		n, err := d.publishBatch(ctx, db, log, b)
		total += n
		if err != nil {
			return total, false, err
		}
	}
}

// publishBatch publishes b: each key's rows in sequence order, up to
// Concurrency keys at once. A failure holds back the rest of its key; the batch
// deadline stops every key from starting another publish. Then it ends the batch.
func (d *Dispatcher[T]) publishBatch(ctx context.Context, db pg.DBTX, log zerolog.Logger, b *outbox.Batch) (int, error) {
	var order []string
	groups := map[string][]outbox.Claimed{}
	for _, r := range b.Rows {
		if _, ok := groups[r.Key]; !ok {
			order = append(order, r.Key)
		}
		groups[r.Key] = append(groups[r.Key], r)
	}
	pctx, cancel := context.WithDeadline(ctx, b.Deadline)
	defer cancel()

	var (
		mu  sync.Mutex
		out outbox.Outcome
		wg  sync.WaitGroup
	)
	sem := make(chan struct{}, d.o.Concurrency)
	for _, key := range order {
		rows := groups[key]
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			for i, r := range rows {
				if pctx.Err() != nil || !time.Now().Before(b.Deadline) {
					mu.Lock()
					for _, rest := range rows[i:] {
						out.Released = append(out.Released, rest.Seq)
					}
					mu.Unlock()
					return
				}
				err := d.publishOne(pctx, r)
				mu.Lock()
				if err == nil {
					out.Published = append(out.Published, r.Seq)
					mu.Unlock()
					continue
				}
				out.Failed = append(out.Failed, outbox.Failure{Seq: r.Seq, Err: err.Error()})
				for _, rest := range rows[i+1:] {
					out.Released = append(out.Released, rest.Seq)
				}
				mu.Unlock()
				log.Warn().Err(err).Str("key", r.Key).Int64("seq", r.Seq).Int("attempts", r.Attempts+1).
					Dur("retry_in", outbox.Backoff(r.Attempts+1)).Msg("outbox delivery failed")
				return
			}
		}()
	}
	wg.Wait()
	if d.beforeFinish != nil {
		d.beforeFinish(out)
	}
	// End the batch even if ctx was cancelled (a stopping worker): published
	// rows are deleted rather than published again.
	fctx, fcancel := context.WithTimeout(context.WithoutCancel(ctx), d.c.Table().ClaimTimeout)
	defer fcancel()
	if err := d.c.Finish(fctx, db, b, out); err != nil {
		log.Error().Err(err).Int("rows", len(b.Rows)).Msg("outbox: cannot end a batch; its rows are published again after the claim timeout")
		return len(out.Published) + len(out.Failed), err
	}
	return len(out.Published) + len(out.Failed), nil
}

func (d *Dispatcher[T]) publishOne(ctx context.Context, r outbox.Claimed) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("publish panicked: %v", p)
		}
	}()
	var row T
	if err := json.Unmarshal(r.Row, &row); err != nil {
		return fmt.Errorf("row %d does not decode into %T: %w", r.Seq, row, err)
	}
	return d.o.Publish(ctx, row)
}

// dispatchWorker runs one pass of a dispatcher: see riverjob.OutboxDispatch.
type dispatchWorker struct {
	river.WorkerDefaults[riverjob.OutboxDispatch]
	st *state
}

// Timeout bounds a pass: its budget plus two claim timeouts.
func (w *dispatchWorker) Timeout(job *river.Job[riverjob.OutboxDispatch]) time.Duration {
	if d := w.st.dispatcher(job.Args.Dispatcher); d != nil {
		return d.timeout()
	}
	return 0
}

// Work runs a pass until no row is due (or the pass budget is spent: then it
// enqueues a follow-up pass) and records the count in the job's output.
func (w *dispatchWorker) Work(ctx context.Context, job *river.Job[riverjob.OutboxDispatch]) error {
	d := w.st.dispatcher(job.Args.Dispatcher)
	if d == nil {
		return river.JobCancel(fault.New(fault.InvalidArgument, "outbox dispatcher %q is not registered in this worker process", job.Args.Dispatcher))
	}
	rt := workers.RuntimeFrom(ctx)
	if rt == nil {
		return fault.New(fault.Internal, "outbox: no worker runtime in the job's context")
	}
	n, more, err := d.pass(ctx, rt.Pool(), rt.Log(), passBudget)
	_ = river.RecordOutput(ctx, map[string]any{"handled": n, "more": more})
	if more && err == nil {
		err = notify(ctx, rt.Pool(), d.Name())
	}
	return err
}
