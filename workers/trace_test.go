package workers_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/bettercompute/bettercompute/domain/outbox"
	"github.com/bettercompute/bettercompute/domain/workflow"
	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/platform/tracing"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/internal/riverjob"
	"github.com/bettercompute/bettercompute/workers/outboxworker"
	"github.com/bettercompute/bettercompute/workers/workertest"
	"github.com/bettercompute/bettercompute/workers/workflowworker"
)

// What the chain's work carries that no span may show: the event's payload,
// the workflow's input, the signal's payload, and the database password.
const (
	payloadMarker = "PAYLOAD-MARKER-7f3a"
	inputMarker   = "INPUT-MARKER-91c2"
	signalMarker  = "SIGNAL-MARKER-44d0"
	dbPassword    = "s3cret-PASSWORD-5e1b"
)

// chain is one run of the chain: an application's requests, and a
// worker runtime whose spans a span recorder keeps.
type chain struct {
	db        *pgtest.DB
	pool      *pg.Pool // the runtime's and the requests' pool, its URL with dbPassword
	rec       *tracetest.SpanRecorder
	tp        *sdktrace.TracerProvider
	delivered chan outbox.Event
}

// startChain starts a runtime (recording its spans unless off) with a reconciler "chain"
// that appends an outbox event for its key, a sink "chain" that delivers it,
// and the workflow "trip": one ─goto─▶ two ─await signal "go"─▶ three.
func startChain(t *testing.T, off bool) *chain {
	t.Helper()
	db := pgtest.New(t)
	u, err := url.Parse(db.URL)
	require.NoError(t, err)
	u.User = url.UserPassword(u.User.Username(), dbPassword) // the test cluster trusts its users: the password is only carried
	pool, err := pg.Open(context.Background(), pg.Options{URL: u.String()})
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	c := &chain{db: db, pool: pool, rec: tracetest.NewSpanRecorder(), delivered: make(chan outbox.Event, 16)}
	c.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(c.rec))
	t.Cleanup(func() { _ = c.tp.Shutdown(context.Background()) })

	reg := workers.NewRegistry()
	require.NoError(t, workers.AddReconciler(reg, workers.Reconciler{Kind: "chain",
		Reconcile: func(ctx context.Context, tx pgx.Tx, key string) (workers.Result, error) {
			return workers.Result{}, outbox.AppendTx(ctx, tx, outbox.Message{Topic: "chain.reconciled", Key: key,
				Payload: map[string]string{"secret": payloadMarker}})
		}}))
	require.NoError(t, outboxworker.Register(reg, &outboxworker.Options{PollEvery: 20 * time.Millisecond}))
	require.NoError(t, workers.AddSink(reg, workers.Sink{Name: "chain", Handle: func(_ context.Context, events []outbox.Event) error {
		for _, e := range events {
			c.delivered <- e
		}
		return nil
	}}))
	require.NoError(t, workflowworker.Register(reg, &workflowworker.Options{WakeEvery: 50 * time.Millisecond}))
	require.NoError(t, addWorkflow(reg, tripWorkflow()))
	o := &workers.Options{TracerProvider: c.tp}
	if off {
		o.TracerProvider = nil // tracing off: a no-op provider
	}
	workertest.Start(t, pool, reg, o)
	return c
}

type tripIn struct {
	Secret string `json:"secret"`
}

type tripState struct{}

func tripWorkflow() *workflow.Workflow[tripIn, tripState, string] {
	return &workflow.Workflow[tripIn, tripState, string]{
		Kind: "trip",
		Init: func(tripIn) (tripState, error) { return tripState{}, nil },
		Steps: []workflow.Step[tripState]{
			{Name: "one", Tx: func(context.Context, pgx.Tx, *workflow.Call[tripState]) (workflow.Next, error) {
				return workflow.Goto("two"), nil
			}},
			{Name: "two", Tx: func(context.Context, pgx.Tx, *workflow.Call[tripState]) (workflow.Next, error) {
				return workflow.AwaitSignal("go", time.Hour, "three", "late"), nil
			}},
			{Name: "three", Tx: func(_ context.Context, _ pgx.Tx, c *workflow.Call[tripState]) (workflow.Next, error) {
				if c.Signal == nil {
					return workflow.Next{}, fmt.Errorf("step three without its signal")
				}
				return workflow.Finish("done"), nil
			}},
			{Name: "late", Tx: func(context.Context, pgx.Tx, *workflow.Call[tripState]) (workflow.Next, error) {
				return workflow.Fail("no signal"), nil
			}},
		},
		Signals: []string{"go"},
	}
}

// request runs fn in a transaction of the chain's pool with ctx, an
// application request's context.
func (c *chain) request(t *testing.T, ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) {
	t.Helper()
	require.NoError(t, pg.InTx(ctx, c.pool, fn))
}

// causesOf is the trace_links of key's dirty row, read in tx.
func causesOf(t *testing.T, ctx context.Context, tx pgx.Tx, key string) []string {
	t.Helper()
	var links []string
	require.NoError(t, tx.QueryRow(ctx, `SELECT trace_links FROM compute_dirty WHERE kind = 'chain' AND key = $1`, key).Scan(&links))
	return links
}

// awaitDelivery waits for the delivery of the event of key.
func (c *chain) awaitDelivery(t *testing.T, key string) outbox.Event {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		select {
		case e := <-c.delivered:
			if e.Key == key {
				return e
			}
		case <-deadline:
			t.Fatalf("the sink never delivered the event of key %s", key)
		}
	}
}

// spans are the ended spans recorded so far named name.
func (c *chain) spans(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range c.rec.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// awaitSpan waits for an ended span named name that match accepts.
func (c *chain) awaitSpan(t *testing.T, what, name string, match func(sdktrace.ReadOnlySpan) bool) sdktrace.ReadOnlySpan {
	t.Helper()
	var found sdktrace.ReadOnlySpan
	workertest.WaitFor(t, 60*time.Second, what, func() bool {
		for _, s := range c.spans(name) {
			if match(s) {
				found = s
				return true
			}
		}
		return false
	})
	return found
}

func attr(s sdktrace.ReadOnlySpan, k attribute.Key) (attribute.Value, bool) {
	for _, a := range s.Attributes() {
		if a.Key == k {
			return a.Value, true
		}
	}
	return attribute.Value{}, false
}

func hasAttr(k attribute.Key, want string) func(sdktrace.ReadOnlySpan) bool {
	return func(s sdktrace.ReadOnlySpan) bool {
		v, ok := attr(s, k)
		return ok && v.AsString() == want
	}
}

func links(s sdktrace.ReadOnlySpan) []trace.SpanID {
	var out []trace.SpanID
	for _, l := range s.Links() {
		out = append(out, l.SpanContext.SpanID())
	}
	return out
}

// TestOneTraceFromTheRequestToTheDelivery is the chain: request 1 marks
// a key dirty and starts a workflow in one transaction; request 2 dirties the
// same key before its reconcile (coalesced) and signals the workflow. The
// reconcile is in request 1's trace, a child of its span, linked to both
// requests; the event it appends is delivered in a span whose parent is the
// reconcile's; the workflow's steps are in request 1's trace, each the parent
// of the next, and the step that consumes the signal links to its sender. No
// span holds a payload, the workflow's input or the database password.
func TestOneTraceFromTheRequestToTheDelivery(t *testing.T) {
	t.Parallel()
	c := startChain(t, false)
	app := c.tp.Tracer("the application")
	const key, wf = "sku-1", "trip-1"

	// The reconcile waits 2 s, so request 2 comes before it.
	ctx1, req1 := app.Start(context.Background(), "request 1")
	c.request(t, ctx1, func(ctx context.Context, tx pgx.Tx) error {
		if err := workers.DirtyTx(ctx, tx, "chain", key, &workers.DirtyOpts{Delay: 2 * time.Second}); err != nil {
			return err
		}
		_, err := startKind(ctx, tx, "trip", tripIn{Secret: inputMarker}, &workflow.StartOpts{ID: wf})
		return err
	})
	req1.End()
	ctx2, req2 := app.Start(context.Background(), "request 2")
	c.request(t, ctx2, func(ctx context.Context, tx pgx.Tx) error {
		if err := workers.DirtyTx(ctx, tx, "chain", key, &workers.DirtyOpts{Delay: 2 * time.Second}); err != nil {
			return err
		}
		require.Equal(t, []string{tracing.Cause(ctx1), tracing.Cause(ctx2)}, causesOf(t, ctx, tx, key),
			"the coalesced dirty keeps both callers' causes, in order")
		_, err := workflow.SignalTx(ctx, tx, wf, "go", map[string]string{"secret": signalMarker}, nil)
		return err
	})
	req2.End()
	sc1, sc2 := req1.SpanContext(), req2.SpanContext()

	// The reconcile: request 1's trace, request 1's span its parent, both linked.
	ev := c.awaitDelivery(t, key)
	require.Equal(t, json.RawMessage(`{"secret": "`+payloadMarker+`"}`), ev.Payload)
	rs := c.awaitSpan(t, "the reconcile's span", workers.ReconcileSpan, hasAttr(tracing.Key, key))
	require.Equal(t, sc1.TraceID(), rs.SpanContext().TraceID(), "the reconcile is in request 1's trace")
	require.Equal(t, sc1.SpanID(), rs.Parent().SpanID(), "request 1's span is the reconcile's parent")
	require.ElementsMatch(t, []trace.SpanID{sc1.SpanID(), sc2.SpanID()}, links(rs), "both requests are linked")
	for k, want := range map[attribute.Key]string{tracing.Reconciler: "chain", tracing.Outcome: tracing.OutcomeCompleted} {
		v, ok := attr(rs, k)
		require.True(t, ok, "reconcile span attribute %s", k)
		require.Equal(t, want, v.Emit(), "reconcile span attribute %s", k)
	}
	for _, k := range []attribute.Key{tracing.Shard, tracing.LeaseEpoch} {
		_, ok := attr(rs, k)
		require.True(t, ok, "reconcile span attribute %s", k)
	}

	// The event carries the reconcile's span as its cause; its delivery's span
	// has the reconcile's as parent, in the same trace.
	require.Equal(t, rs.SpanContext().SpanID(), tracing.SpanContext(ev.Cause).SpanID(), "the event's cause is the reconcile")
	ds := c.awaitSpan(t, "the delivery's span", outboxworker.DeliverSpan, func(s sdktrace.ReadOnlySpan) bool {
		return s.Parent().SpanID() == rs.SpanContext().SpanID()
	})
	require.Equal(t, sc1.TraceID(), ds.SpanContext().TraceID(), "the delivery is in request 1's trace")
	v, _ := attr(ds, tracing.Sink)
	require.Equal(t, "chain", v.AsString())

	// The workflow's steps: request 1's trace, each the parent of the next;
	// the one that consumed the signal links to request 2, its sender.
	_ = waitWorkflow(t, c.pool, wf, workflow.Completed)
	step := func(name string) sdktrace.ReadOnlySpan {
		return c.awaitSpan(t, "the span of step "+name, workflowworker.StepSpan, func(s sdktrace.ReadOnlySpan) bool {
			return hasAttr(tracing.WorkflowID, wf)(s) && hasAttr(tracing.WorkflowStep, name)(s) &&
				hasAttr(tracing.Outcome, tracing.OutcomeCompleted)(s)
		})
	}
	one, two, three := step("one"), step("two"), step("three")
	for _, s := range []sdktrace.ReadOnlySpan{one, two, three} {
		require.Equal(t, sc1.TraceID(), s.SpanContext().TraceID(), "step %v is in request 1's trace", attrOr(s, tracing.WorkflowStep))
	}
	// Each step nests in River's span of its job, whose parent is what inserted
	// the job: the start's request, then the step before.
	require.Equal(t, sc1.SpanID(), c.causeOf(t, one), "request 1 (the start) is step one's cause")
	require.Equal(t, one.SpanContext().SpanID(), c.causeOf(t, two), "step one is step two's cause")
	require.Equal(t, two.SpanContext().SpanID(), c.causeOf(t, three), "step two is step three's cause")
	require.Contains(t, links(three), sc2.SpanID(), "the step that consumed the signal links to its sender")

	assertNoSecrets(t, c.rec.Ended())
}

// causeOf is the parent of s, or, when that is River's work span of s's job,
// River's span's parent (the span that inserted the job): every span of the
// chain is recorded, so it waits for the parent to end.
func (c *chain) causeOf(t *testing.T, s sdktrace.ReadOnlySpan) trace.SpanID {
	t.Helper()
	p := s.Parent().SpanID()
	var parent sdktrace.ReadOnlySpan
	workertest.WaitFor(t, 30*time.Second, "the parent span of "+s.Name(), func() bool {
		for _, r := range c.rec.Ended() {
			if r.SpanContext().SpanID() == p {
				parent = r
				return true
			}
		}
		return false
	})
	if strings.HasPrefix(parent.Name(), "river.work/") {
		require.Equal(t, s.SpanContext().TraceID(), parent.SpanContext().TraceID())
		return parent.Parent().SpanID()
	}
	return p
}

func attrOr(s sdktrace.ReadOnlySpan, k attribute.Key) string {
	v, _ := attr(s, k)
	return v.Emit()
}

func waitWorkflow(t *testing.T, db *pg.Pool, id string, want workflow.Status) *workflow.Info {
	t.Helper()
	var i *workflow.Info
	workertest.WaitFor(t, 60*time.Second, fmt.Sprintf("workflow %s %s", id, want), func() bool {
		var err error
		i, err = workflow.Get(context.Background(), db, id)
		require.NoError(t, err)
		return i.Status == want
	})
	return i
}

// assertNoSecrets fails if any recorded span's name, attributes, events or
// status holds a payload, the workflow's input or the database password.
func assertNoSecrets(t *testing.T, spans []sdktrace.ReadOnlySpan) {
	t.Helper()
	require.NotEmpty(t, spans)
	check := func(s sdktrace.ReadOnlySpan, where, text string) {
		for _, bad := range []string{payloadMarker, inputMarker, signalMarker, dbPassword} {
			require.NotContains(t, text, bad, "span %s: %s", s.Name(), where)
		}
	}
	checkAttrs := func(s sdktrace.ReadOnlySpan, where string, kvs []attribute.KeyValue) {
		for _, kv := range kvs {
			check(s, where+" "+string(kv.Key), kv.Value.Emit())
		}
	}
	for _, s := range spans {
		check(s, "name", s.Name())
		check(s, "status", s.Status().Description)
		checkAttrs(s, "attribute", s.Attributes())
		for _, e := range s.Events() {
			check(s, "event", e.Name)
			checkAttrs(s, "event "+e.Name, e.Attributes)
		}
		for _, l := range s.Links() {
			checkAttrs(s, "link", l.Attributes)
		}
	}
}

// TestNoCauseIsStoredWithoutASampledSpan: with tracing off in the worker,
// requests whose span is not sampled (and requests with no span) store no
// cause: the dirty row's trace_links, the event's cause and the signal's are
// NULL, the step jobs' metadata has no traceparent; and the work is done all
// the same.
func TestNoCauseIsStoredWithoutASampledSpan(t *testing.T) {
	t.Parallel()
	c := startChain(t, true)
	unsampled := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample())).Tracer("the application")
	const key, wf = "sku-2", "trip-2"

	ctx1, req1 := unsampled.Start(context.Background(), "request 1")
	require.True(t, req1.SpanContext().IsValid())
	require.False(t, req1.SpanContext().IsSampled())
	c.request(t, ctx1, func(ctx context.Context, tx pgx.Tx) error {
		if err := jobs.TraceTx(ctx, tx); err != nil {
			return err
		}
		if err := workers.DirtyTx(ctx, tx, "chain", key, &workers.DirtyOpts{Delay: time.Second}); err != nil {
			return err
		}
		_, err := startKind(ctx, tx, "trip", tripIn{Secret: inputMarker}, &workflow.StartOpts{ID: wf})
		return err
	})
	req1.End()
	c.request(t, context.Background(), func(ctx context.Context, tx pgx.Tx) error {
		if err := workers.DirtyTx(ctx, tx, "chain", key, &workers.DirtyOpts{Delay: time.Second}); err != nil {
			return err
		}
		require.Nil(t, causesOf(t, ctx, tx, key), "no cause without a sampled span")
		var setting string
		require.NoError(t, tx.QueryRow(ctx, `SELECT coalesce(current_setting($1, true), '')`, jobs.TraceSetting).Scan(&setting))
		require.Empty(t, setting, "TraceTx set nothing")
		_, err := workflow.SignalTx(ctx, tx, wf, "go", nil, nil)
		return err
	})

	ev := c.awaitDelivery(t, key)
	require.Empty(t, ev.Cause)
	_ = waitWorkflow(t, c.pool, wf, workflow.Completed)
	require.Equal(t, 1, c.db.MustCount(t, `SELECT count(*) FROM compute_events WHERE key = $1 AND cause IS NULL`, key))
	require.Equal(t, 1, c.db.MustCount(t, `SELECT count(*) FROM compute_workflow_signals WHERE workflow_id = $1 AND cause IS NULL`, wf))
	// Two jobs ran the three steps: one and two (inline, at once), then three
	// after the signal.
	require.Equal(t, 2, c.db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = $1 AND args->>'workflow_id' = $2
		AND NOT metadata ? $3 AND state = 'completed'`, jobs.WorkflowStepKind, wf, jobs.TraceparentKey),
		"the steps' jobs, no traceparent in their metadata")
	require.Empty(t, c.rec.Ended(), "the worker's tracing is off")
}

// TestReconcilesRiverWorksKeepTheirCauses: the causes of a batch claimed by a
// holder that died reach the reconcile River runs when the batch is handed
// back, and a key that failed in a batch keeps its causes for its own job:
// each reconcile's parent is the dirtying request's span, and it links to it.
func TestReconcilesRiverWorksKeepTheirCauses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	db.MustExec(t, `UPDATE compute_settings SET shard_count = 1`) // every key in shard 0
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	app := tp.Tracer("the application")
	dirtyIn := func(key string) trace.SpanContext {
		t.Helper()
		ctx, span := app.Start(ctx, "request "+key)
		defer span.End()
		require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
			return workers.DirtyTx(ctx, tx, "thing", key, nil)
		}))
		return span.SpanContext()
	}
	handed, failing := dirtyIn("handed"), dirtyIn("failing")
	// A dead holder's claim of both keys, handed back when the runtime starts.
	db.MustExec(t, `INSERT INTO compute_leases (name, owner, epoch, expires_at) VALUES ('shard/0', 'ghost#1', 4, compute_now() + interval '1 hour')`)
	rows, err := db.Query(ctx, jobs.ClaimDirtySQL, 0, "shard/0", "ghost#1", int64(4), []string{"thing"}, []int{32}, 32, time.Now(), "shard_0")
	require.NoError(t, err)
	rows.Close()
	require.NoError(t, rows.Err())
	db.MustExec(t, `UPDATE compute_leases SET expires_at = compute_now() - interval '1 second' WHERE name = 'shard/0'`)

	var failed atomic.Bool
	reg := workers.NewRegistry()
	require.NoError(t, workers.AddReconciler(reg, workers.Reconciler{Kind: "thing",
		Reconcile: func(ctx context.Context, tx pgx.Tx, key string) (workers.Result, error) {
			if key == "failing" && failed.CompareAndSwap(false, true) {
				return workers.Result{}, errors.New("fails once")
			}
			return workers.Result{}, nil
		}}))
	workertest.Start(t, db.Pool, reg, &workers.Options{Shards: []int{0}, TracerProvider: tp})
	workertest.WaitFor(t, 60*time.Second, "both keys reconciled", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM compute_dirty`) == 0
	})
	for key, cause := range map[string]trace.SpanContext{"handed": handed, "failing": failing} {
		var done []sdktrace.ReadOnlySpan
		workertest.WaitFor(t, 10*time.Second, "the completed reconcile span of "+key, func() bool {
			done = done[:0]
			for _, s := range rec.Ended() {
				if s.Name() == workers.ReconcileSpan && hasAttr(tracing.Outcome, tracing.OutcomeCompleted)(s) &&
					(hasAttr(tracing.Key, key)(s) || keysHold(s, key)) {
					done = append(done, s)
				}
			}
			return len(done) > 0
		})
		for _, s := range done {
			require.Equal(t, cause.TraceID(), s.SpanContext().TraceID(), "the reconcile of %s is in its request's trace", key)
			require.Equal(t, cause.SpanID(), s.Parent().SpanID(), "the request is the parent of the reconcile of %s", key)
			require.Contains(t, links(s), cause.SpanID(), "the reconcile of %s links to its request", key)
		}
	}
	require.True(t, failed.Load())
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = $1 AND state = 'completed'`, riverjob.ReconcileKind),
		"the failing key was reconciled by its own job")
}

// keysHold reports whether s's bettercompute.keys holds key.
func keysHold(s sdktrace.ReadOnlySpan, key string) bool {
	v, ok := attr(s, tracing.Keys)
	if !ok {
		return false
	}
	for _, k := range v.AsStringSlice() {
		if k == key {
			return true
		}
	}
	return false
}

// TestRefusedReconcileIsAFencedSpan: a batch the shard's holder took itself
// (no River span around it) whose transaction is refused as stale (one of its
// keys stopped waiting during the run) is a reconcile span with outcome FENCED and a bettercompute.fenced
// event, still caused by its request; the key's next reconcile completes.
func TestRefusedReconcileIsAFencedSpan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	entered, release := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	reg := workers.NewRegistry()
	require.NoError(t, workers.AddReconciler(reg, workers.Reconciler{Kind: "thing",
		Reconcile: func(ctx context.Context, tx pgx.Tx, key string) (workers.Result, error) {
			if first.CompareAndSwap(false, true) {
				close(entered)
				<-release
			}
			return workers.Result{}, nil
		}}))
	workertest.Start(t, db.Pool, reg, &workers.Options{TracerProvider: tp})

	rctx, request := tp.Tracer("the application").Start(ctx, "request")
	require.NoError(t, pg.InTx(rctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		return workers.DirtyTx(ctx, tx, "thing", "k", nil)
	}))
	request.End()
	<-entered
	// The key stops waiting (its row is not locked by the run): the run's
	// finish finds it gone and commits nothing.
	db.MustExec(t, `DELETE FROM compute_dirty WHERE key = 'k'`)
	close(release)

	var refused sdktrace.ReadOnlySpan
	workertest.WaitFor(t, 30*time.Second, "the refused reconcile's span", func() bool {
		for _, s := range rec.Ended() {
			if s.Name() == workers.ReconcileSpan && hasAttr(tracing.Outcome, tracing.OutcomeFenced)(s) {
				refused = s
				return true
			}
		}
		return false
	})
	var events int
	for _, e := range refused.Events() {
		if e.Name == tracing.EventFenced {
			events++
		}
	}
	require.Equal(t, 1, events, "one fenced event on the refused reconcile: %v", refused.Events())
	require.Equal(t, request.SpanContext().TraceID(), refused.SpanContext().TraceID(), "still in the request's trace")
	require.Contains(t, links(refused), request.SpanContext().SpanID())
	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		return workers.DirtyTx(ctx, tx, "thing", "k", nil)
	}))
	workertest.WaitFor(t, 30*time.Second, "the key reconciled again", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM compute_dirty`) == 0
	})
}
