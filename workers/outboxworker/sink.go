package outboxworker

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/bettercompute/bettercompute/domain/outbox"
	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/tracing"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/internal/lease"
	"github.com/bettercompute/bettercompute/workers/internal/riverjob"
)

// addSink is the outbox's OnAdd for workers.AddSink: it checks s and keeps it.
func (st *state) addSink(s workers.Sink) error {
	if err := outbox.ValidateSinkName(s.Name); err != nil {
		return err
	}
	switch {
	case s.Handle == nil && s.HandleTx == nil:
		return fault.New(fault.InvalidConfig, "sink %s has no Handle or HandleTx function: %s", s.Name, whichHandler)
	case s.Handle != nil && s.HandleTx != nil:
		return fault.New(fault.InvalidConfig, "sink %s sets both Handle and HandleTx, set one: %s", s.Name, whichHandler)
	}
	if s.BatchSize < 0 || s.Timeout < 0 {
		return fault.New(fault.InvalidConfig, "sink %s: BatchSize and Timeout must not be negative", s.Name)
	}
	if s.BatchSize == 0 {
		s.BatchSize = 1000
	}
	if s.Timeout == 0 {
		s.Timeout = time.Minute
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if _, dup := st.sinks[s.Name]; dup {
		return fault.New(fault.InvalidConfig, "sink %s is registered twice", s.Name)
	}
	st.sinks[s.Name] = &s
	return nil
}

// whichHandler tells a sink's author which handler to set.
const whichHandler = "Handle for an outside system (delivered at least once: make it idempotent by event ID), " +
	"HandleTx for writes into this database (applied exactly once, in the transaction that moves the cursor)"

func deliverOpts() *river.InsertOpts {
	// Failed deliveries are retried (practically) without end; a discarded job is
	// replaced by the next poll anyway.
	return &river.InsertOpts{Queue: jobs.MaintenanceQueue, MaxAttempts: 10000, Tags: []string{"outbox_sink"}}
}

// pump polls this process's sinks every PollEvery until the runtime stops: it
// starts the delivery job of each sink that has events and no live job, and
// hands back the delivery jobs of dead processes.
func (st *state) pump(rt *workers.Runtime) {
	ctx := rt.Context()
	log := rt.Log().With().Str("component", "outbox").Logger()
	var names []string
	for _, s := range st.sinkList() {
		names = append(names, s.Name)
	}
	ttl := rt.Options().LeaseTTL
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		due, err := outbox.DueSinks(ctx, rt.Pool(), names)
		if err != nil && ctx.Err() == nil {
			log.Warn().Err(err).Msg("outbox: polling sinks failed")
		}
		for _, d := range due {
			if err := st.startDelivery(ctx, rt, d); err != nil && ctx.Err() == nil {
				log.Warn().Err(err).Str("sink", d.Name).Msg("outbox: cannot start a delivery")
			}
		}
		n, err := outbox.HandBackStale(ctx, rt.Pool(), names, jobs.OutboxDeliverKind, time.Now().Add(-ttl))
		if err != nil && ctx.Err() == nil {
			log.Warn().Err(err).Msg("outbox: handing back stale deliveries failed")
		} else if n > 0 {
			log.Info().Int("jobs", n).Msg("outbox: handed back the deliveries of a dead process")
		}
		t.Reset(st.options().PollEvery)
	}
}

// startDelivery inserts sink d's next delivery job, unless another process did
// since d was read.
func (st *state) startDelivery(ctx context.Context, rt *workers.Runtime, d outbox.Due) error {
	return pg.InTx(ctx, rt.Pool(), func(ctx context.Context, tx pgx.Tx) error {
		ok, err := outbox.ClaimSinkStartTx(ctx, tx, d.Name, d.JobID)
		if err != nil || !ok {
			return err
		}
		res, err := jobs.InsertTx(ctx, tx, riverjob.OutboxDeliver{Sink: d.Name}, deliverOpts())
		if err != nil {
			return err
		}
		return outbox.SetSinkJobTx(ctx, tx, d.Name, res.Job.ID)
	})
}

// deliverWorker delivers the next batches of one sink: see riverjob.OutboxDeliver.
type deliverWorker struct {
	river.WorkerDefaults[riverjob.OutboxDeliver]
	st *state
}

// Timeout is the sink's own.
func (w *deliverWorker) Timeout(job *river.Job[riverjob.OutboxDeliver]) time.Duration {
	if s := w.st.sink(job.Args.Sink); s != nil {
		return s.Timeout + 5*time.Second
	}
	return 0
}

// NextRetry backs off 1 s, 2 s, 4 s … up to SinkMaxBackoff.
func (w *deliverWorker) NextRetry(job *river.Job[riverjob.OutboxDeliver]) time.Time {
	return time.Now().Add(sinkBackoff(job.Attempt, w.st.options().SinkMaxBackoff))
}

func sinkBackoff(attempt int, maxWait time.Duration) time.Duration {
	if attempt < 1 {
		attempt = 1
	}
	d := time.Duration(math.Pow(2, float64(min(attempt-1, 30)))) * time.Second
	return min(d, maxWait)
}

// Work delivers the sink's next batches:
//
//  1. take the sink's lease (FENCED, given back, while another process holds it)
//     and keep it renewed while the job runs;
//  2. read the batch after the cursor (nothing to do when paused or caught up);
//  3. call Handle, outside any transaction;
//  4. in a transaction fenced by the lease and the job's attempt, call HandleTx
//     (after the fence), then move the cursor (guarded by the position read in
//     2); while batches come back full, the job's budget lasts and the sink
//     was not paused meanwhile, go back to 2;
//  5. the last advance also releases the lease, starts the next job when more
//     is pending, and completes this one.
//
// A crash or a lost lease between 3 and 4 leaves the cursor where it was: the
// batch is delivered again to Handle. HandleTx's writes commit in 4 with the
// cursor, or not at all.
func (w *deliverWorker) Work(ctx context.Context, job *river.Job[riverjob.OutboxDeliver]) error {
	name := job.Args.Sink
	s := w.st.sink(name)
	if s == nil {
		return river.JobCancel(fault.New(fault.InvalidArgument, "sink %q is not registered in this worker process", name))
	}
	rt := workers.RuntimeFrom(ctx)
	if rt == nil {
		return fault.New(fault.Internal, "outbox: no worker runtime in the job's context")
	}
	// The next job of a chain may start before this process's previous one has
	// returned: wait for it (the lease and the cursor guard are the real fences).
	unlock, err := w.st.lockSink(ctx, name)
	if err != nil {
		return fault.Wrap(fault.Fenced, err, "sink %s: a delivery is still running in this process", name)
	}
	defer unlock()

	db, opts := rt.Pool(), rt.Options()
	l, err := lease.Acquire(ctx, db, outbox.SinkLease(name), rt.Owner(), opts.LeaseTTL)
	if fault.Has(err, fault.Conflict) {
		return fault.Wrap(fault.Fenced, err, "sink %s is being delivered by another process", name)
	}
	if err != nil {
		return err
	}
	ctx, stop := keepLease(ctx, rt, l)
	d := &delivery{st: w.st, s: s, job: job, db: db, l: l, tp: rt.TracerProvider(),
		log: rt.Log().With().Str("component", "outbox").Str("sink", name).Logger()}
	defer func() {
		stop()
		if !d.released {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_ = lease.Release(rctx, db, l)
			cancel()
		}
	}()
	return d.run(ctx)
}

// delivery is one delivery job's run, under the sink's lease l.
type delivery struct {
	st       *state
	s        *workers.Sink
	job      *river.Job[riverjob.OutboxDeliver]
	db       *pg.Pool
	l        lease.Lease
	tp       trace.TracerProvider
	log      zerolog.Logger
	released bool // the last advance released the lease
}

// run delivers batches from the cursor until the sink is caught up, a batch
// comes back short, or the job's budget is spent.
func (d *delivery) run(ctx context.Context) error {
	from, err := outbox.SinkCursor(ctx, d.db, d.s.Name)
	if err != nil {
		return d.fenced(ctx, err)
	}
	if from.Paused {
		return nil // resume starts a new delivery
	}
	budget := time.Now().Add(min(sinkJobBudget, d.s.Timeout/2))
	for {
		events, next, scanned, err := outbox.Read(ctx, d.db, outbox.ReadOptions{After: from.Cursor, Limit: d.s.BatchSize, Topics: d.s.Topics})
		if err != nil {
			return d.fenced(ctx, err)
		}
		if scanned == 0 {
			return nil // caught up: the next poll starts a new delivery
		}
		bctx, span := d.span(ctx, events)
		last, moved, err := d.deliver(bctx, from, next, events, scanned, budget)
		workers.EndSpanOutcome(span, err, workers.Outcome(bctx, err))
		if err != nil || last || !moved {
			return err
		}
		// A pause during the batch let it complete (the advance above) and
		// starts no further one: read the sink's state again.
		if from, err = outbox.SinkCursor(ctx, d.db, d.s.Name); err != nil {
			return d.fenced(ctx, err)
		}
		if from.Paused {
			return nil // resume starts a new delivery
		}
	}
}

// deliver delivers one batch read from from: the handler, then the cursor's
// advance (finish, the job's last, when last).
func (d *delivery) deliver(ctx context.Context, from outbox.SinkPosition, next outbox.Cursor, events []outbox.Event, scanned int,
	budget time.Time) (last, moved bool, err error) {
	if d.s.Handle != nil {
		if err := d.handle(ctx, from, events); err != nil {
			return true, false, err
		}
	}
	more := scanned == d.s.BatchSize
	if !more || !time.Now().Before(budget) {
		return true, false, d.finish(ctx, from, next, events, more)
	}
	moved, err = d.advance(ctx, from, next, events)
	return false, moved, err
}

// DeliverSpan is the name of the span of a sink's delivery of one batch.
const DeliverSpan = "bettercompute.outbox.deliver"

// span starts the span of the delivery of events: caused by the spans that
// appended them (Event.Cause), its parent the first cause. A batch of events
// comes from many requests, so the span belongs to the first one's trace rather
// than to the delivery job's (River's span, when there is one, is a link). A
// batch with no event of the sink's topics has no span.
func (d *delivery) span(ctx context.Context, events []outbox.Event) (context.Context, trace.Span) {
	if len(events) == 0 {
		return ctx, noop.Span{}
	}
	var causes []string
	for _, e := range events {
		if e.Cause != "" {
			causes = append(causes, e.Cause)
			if len(causes) == tracing.MaxCauses {
				break
			}
		}
	}
	// In the first event's trace, linked to River's span of the delivery job
	// (tracing.CausedBy).
	ctx, span := tracing.Start(ctx, d.tp, DeliverSpan, causes)
	if span.IsRecording() {
		span.SetAttributes(tracing.Sink.String(d.s.Name), tracing.EventCount.Int(len(events)))
	}
	return ctx, span
}

// fenced is err, FENCED when the lease was lost meanwhile.
func (d *delivery) fenced(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); ctx.Err() != nil && fault.Has(cause, fault.Fenced) {
		return fault.Wrap(fault.Fenced, err, "%v", cause)
	}
	return err
}

// handle calls the sink's Handle with one batch, outside any transaction, and
// records a failure on the sink (shown by sinks list).
func (d *delivery) handle(ctx context.Context, from outbox.SinkPosition, events []outbox.Event) error {
	if len(events) > 0 {
		if err := callHandler(ctx, d.s, events); err != nil {
			return d.failed(ctx, from, events, err)
		}
	}
	d.afterHandle(events)
	return nil
}

// failed is the delivery's error when the handler (Handle or HandleTx) returned
// err for events: FENCED when the lease was lost meanwhile; otherwise err,
// recorded on the sink (shown by sinks list) and logged.
func (d *delivery) failed(ctx context.Context, from outbox.SinkPosition, events []outbox.Event, err error) error {
	err = d.fenced(ctx, err)
	if !fault.Has(err, fault.Fenced) {
		if rerr := outbox.RecordSinkFailure(context.WithoutCancel(ctx), d.db, d.s.Name, err.Error()); rerr != nil {
			d.log.Warn().Err(rerr).Msg("outbox: cannot record the failure")
		}
		d.log.Warn().Err(err).Int("events", len(events)).Str("from", from.Cursor.String()).Int("attempt", d.job.Attempt).
			Msg("outbox sink delivery failed; retried with backoff")
	}
	return err
}

// applyTx is what moves the cursor past a batch, in tx, the delivery's
// transaction, already fenced: for a HandleTx sink the handler, then the
// cursor's advance (guarded by from). moved is false when the sink was reset
// meanwhile; then nothing of the handler's writes remains in tx.
//
// The handler and the advance run in a savepoint, rolled back when the advance
// does not move: the handler's writes go with it, and the rest of tx commits as
// it does for Handle (finish still releases the lease and completes the job).
// Rolling back the whole transaction instead would need a second one to
// complete the job. Advancing first and calling the handler only after a move
// would need neither, but would hold the sink's row locked while the handler
// runs, so an operator's reset or pause would wait for it.
//
// A handler's error comes back as a *handlerError; tx is then to be rolled
// back (the savepoint is already).
func (d *delivery) applyTx(ctx context.Context, tx pgx.Tx, from outbox.SinkPosition, next outbox.Cursor, events []outbox.Event) (moved bool, err error) {
	if d.s.HandleTx == nil {
		return outbox.AdvanceSinkTx(ctx, tx, d.s.Name, from, next, len(events))
	}
	err = pg.InTx(ctx, tx, func(ctx context.Context, tx pgx.Tx) error {
		if len(events) > 0 {
			if err := callHandlerTx(ctx, d.s, tx, events); err != nil {
				return &handlerError{err}
			}
		}
		d.afterHandle(events)
		var err error
		moved, err = outbox.AdvanceSinkTx(ctx, tx, d.s.Name, from, next, len(events))
		if err == nil && !moved {
			return errNotMoved
		}
		return err
	})
	if errors.Is(err, errNotMoved) {
		return false, nil
	}
	return moved, err
}

// errNotMoved rolls back applyTx's savepoint when the cursor did not move.
var errNotMoved = errors.New("the sink was reset during the delivery")

// handlerError is HandleTx's error, told apart from the fence's and the
// cursor's so that it is recorded on the sink as Handle's is.
type handlerError struct{ err error }

func (e *handlerError) Error() string { return e.err.Error() }
func (e *handlerError) Unwrap() error { return e.err }

// advance moves the cursor past an intermediate batch (calling HandleTx first)
// in a transaction fenced by the lease and the job's attempt. moved is false
// when the sink was reset meanwhile: the delivery stops without moving it.
func (d *delivery) advance(ctx context.Context, from outbox.SinkPosition, next outbox.Cursor, events []outbox.Event) (moved bool, err error) {
	err = pg.InTx(ctx, d.db, func(ctx context.Context, tx pgx.Tx) error {
		if err := workers.FenceTx(ctx, tx, d.l, d.job.JobRow); err != nil {
			return err
		}
		var err error
		moved, err = d.applyTx(ctx, tx, from, next, events)
		return err
	})
	if herr := (*handlerError)(nil); errors.As(err, &herr) {
		return false, d.failed(ctx, from, events, herr.err)
	}
	if err != nil {
		err = d.fenced(ctx, err)
		d.afterAdvance(err)
		return false, err
	}
	if !moved {
		d.log.Warn().Str("from", from.Cursor.String()).Msg("outbox: the sink was reset during the delivery; this delivery does not move the cursor")
	}
	return moved, nil
}

// finish is the last advance: in the fenced job transaction it calls HandleTx,
// moves the cursor, releases the lease, starts the next job when more is
// pending, and completes this one.
func (d *delivery) finish(ctx context.Context, from outbox.SinkPosition, next outbox.Cursor, events []outbox.Event, more bool) error {
	name := d.s.Name
	err := workers.InTxLease(ctx, d.job, d.l, func(ctx context.Context, tx pgx.Tx) error {
		moved, err := d.applyTx(ctx, tx, from, next, events)
		if err != nil {
			return err
		}
		if !moved {
			d.log.Warn().Str("from", from.Cursor.String()).Str("to", next.String()).Msg("outbox: the sink was reset during the delivery; this delivery does not move the cursor")
		}
		if err := lease.Release(ctx, tx, d.l); err != nil {
			return err
		}
		if more && moved {
			res, err := jobs.InsertTx(ctx, tx, riverjob.OutboxDeliver{Sink: name}, deliverOpts())
			if err != nil {
				return err
			}
			return outbox.SetSinkJobTx(ctx, tx, name, res.Job.ID)
		}
		return nil
	})
	if herr := (*handlerError)(nil); errors.As(err, &herr) {
		return d.failed(ctx, from, events, herr.err)
	}
	if err != nil {
		err = d.fenced(ctx, err)
	}
	d.afterAdvance(err)
	if err != nil {
		return err
	}
	d.released = true
	return nil
}

func (d *delivery) afterHandle(events []outbox.Event) {
	if d.st.afterHandle != nil {
		d.st.afterHandle(d.s.Name, events)
	}
}

func (d *delivery) afterAdvance(err error) {
	if d.st.afterAdvance != nil {
		d.st.afterAdvance(d.s.Name, err)
	}
}

// sinkJobBudget bounds how long one delivery job goes on delivering full
// batches before it hands over to a fresh job (so a busy sink does not hold a
// maintenance worker for ever).
const sinkJobBudget = 2 * time.Second

func callHandler(ctx context.Context, s *workers.Sink, events []outbox.Event) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("sink %s: handler panicked: %v", s.Name, p)
		}
	}()
	return s.Handle(ctx, events)
}

func callHandlerTx(ctx context.Context, s *workers.Sink, tx pgx.Tx, events []outbox.Event) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("sink %s: handler panicked: %v", s.Name, p)
		}
	}()
	return s.HandleTx(ctx, tx, events)
}

// lockSink serializes this process's deliveries of one sink, waiting for the
// one running (if any) until ctx is done.
func (st *state) lockSink(ctx context.Context, name string) (func(), error) {
	st.mu.Lock()
	ch := st.busy[name]
	if ch == nil {
		ch = make(chan struct{}, 1)
		st.busy[name] = ch
	}
	st.mu.Unlock()
	select {
	case ch <- struct{}{}:
		return func() { <-ch }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// keepLease renews l every LeaseRenew until stop is called. When the lease is
// lost (another owner holds it) or cannot be renewed before it expires by this
// process's clock, the returned context is cancelled with a FENCED cause: the
// handler should stop, and the fenced transaction would refuse anyway.
func keepLease(ctx context.Context, rt *workers.Runtime, l lease.Lease) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	opts := rt.Options()
	margin := min(time.Second, opts.LeaseTTL/10)
	go func() {
		deadline := time.Now().Add(opts.LeaseTTL - margin)
		t := time.NewTicker(opts.LeaseRenew)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			start := time.Now()
			got, err := lease.Acquire(ctx, rt.Pool(), l.Name, l.Owner, opts.LeaseTTL)
			switch {
			case err == nil && got.Epoch == l.Epoch:
				deadline = start.Add(opts.LeaseTTL - margin)
			case err == nil || fault.Has(err, fault.Conflict):
				cancel(fault.New(fault.Fenced, "lease %s lost (now owner %s, epoch %d)", l.Name, got.Owner, got.Epoch))
				return
			case time.Now().After(deadline):
				cancel(fault.Wrap(fault.Fenced, err, "lease %s expired without renewal", l.Name))
				return
			}
		}
	}()
	var once bool
	return ctx, func() {
		if !once {
			once = true
			close(done)
			cancel(nil)
		}
	}
}
