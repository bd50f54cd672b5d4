package workers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/platform/tracing"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

// traceSecret stands for the database password: the runtime is told to keep it
// out of everything it stores (Options.Secrets), and a failing job's error
// carries it, as a connection error would.
const traceSecret = "pw-7f3a9c1e-never-in-a-span"

// traceArgs is worked by traceWorker. Payload stands for an application's data:
// it must not reach a span.
type traceArgs struct {
	Mode    string `json:"mode"`
	Name    string `json:"name,omitempty"`
	Payload string `json:"payload"`
}

func (traceArgs) Kind() string { return "test_trace" }

// traceWorker's modes: ok (write in InTx), park (wait for the test's release,
// then InTx detached from the job's cancellation), unavailable (fail with an
// error that names the secret), invalid (INVALID_ARGUMENT).
type traceWorker struct {
	river.WorkerDefaults[traceArgs]
	mu     sync.Mutex
	parked map[string]*attemptCtl
}

func (w *traceWorker) Work(ctx context.Context, job *river.Job[traceArgs]) error {
	write := func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO trace_writes (job_id) VALUES ($1)`, job.ID)
		return err
	}
	switch job.Args.Mode {
	case "park":
		w.mu.Lock()
		ctl := w.parked[job.Args.Name]
		w.mu.Unlock()
		if job.Attempt > 1 || ctl == nil {
			return fault.New(fault.Fenced, "a later attempt of a parked job")
		}
		close(ctl.started)
		<-ctl.release
		err := workers.InTx(context.WithoutCancel(ctx), job, write)
		ctl.result <- err
		return err
	case "unavailable":
		return fault.New(fault.Unavailable, "cannot reach postgres://app:%s@db.internal/app", traceSecret)
	case "invalid":
		return fault.New(fault.InvalidArgument, "job %d cannot be worked", job.ID)
	}
	return workers.InTx(ctx, job, write)
}

func (w *traceWorker) park(name string) *attemptCtl {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.parked == nil {
		w.parked = map[string]*attemptCtl{}
	}
	ctl := &attemptCtl{started: make(chan struct{}), release: make(chan struct{}), result: make(chan error, 1)}
	w.parked[name] = ctl
	return ctl
}

// traced is a test's span recorder and the provider that feeds it.
type traced struct {
	rec *tracetest.SpanRecorder
	tp  *sdktrace.TracerProvider
}

func newTraced() traced {
	rec := tracetest.NewSpanRecorder()
	return traced{rec: rec, tp: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))}
}

// startTraced starts a runtime on shard 0 with traceWorker, tracing to tr
// (none when tr.tp is nil), with leases that expire only when the test makes
// them (10 s TTL), and waits for shard 0's lease.
func startTraced(t *testing.T, db *pgtest.DB, w *traceWorker, tr traced, identity string) *workers.Runtime {
	t.Helper()
	reg := workers.NewRegistry()
	require.NoError(t, workers.AddWorker(reg, w))
	o := &workers.Options{Shards: []int{0}, LeaseTTL: 10 * time.Second, LeaseRenew: 3 * time.Second,
		Secrets: []string{traceSecret}, Identity: identity}
	if tr.tp != nil {
		o.TracerProvider = tr.tp
	}
	rt := workertest.Start(t, db.Pool, reg, o)
	workertest.WaitFor(t, 30*time.Second, "shard 0's lease held", func() bool { _, ok := rt.LeaseForQueue(jobs.ShardQueue(0)); return ok })
	return rt
}

func newTraceDB(t *testing.T) *pgtest.DB {
	db := pgtest.New(t)
	db.MustExec(t, `CREATE TABLE trace_writes (job_id bigint NOT NULL)`)
	return db
}

func insertTrace(t *testing.T, db *pgtest.DB, args traceArgs) int64 {
	t.Helper()
	var id int64
	maxAttempts := 0 // River's default
	if args.Mode == "last-attempt" {
		args.Mode, maxAttempts = "unavailable", 1
	}
	require.NoError(t, pg.InTx(context.Background(), db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		res, err := jobs.InsertTx(ctx, tx, args, &river.InsertOpts{Queue: jobs.ShardQueue(0), MaxAttempts: maxAttempts})
		if err == nil {
			id = res.Job.ID
		}
		return err
	}))
	return id
}

// attrOf is the value of key among attrs, and whether it is there.
func attrOf(attrs []attribute.KeyValue, key attribute.Key) (attribute.Value, bool) {
	for _, kv := range attrs {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

// workSpan waits for the ended River work span of job id.
func workSpan(t *testing.T, rec *tracetest.SpanRecorder, id int64, what string) sdktrace.ReadOnlySpan {
	t.Helper()
	var found sdktrace.ReadOnlySpan
	workertest.WaitFor(t, 60*time.Second, fmt.Sprintf("the work span of job %d (%s)", id, what), func() bool {
		for _, s := range rec.Ended() {
			if v, ok := attrOf(s.Attributes(), "id"); ok && v.AsInt64() == id && strings.HasPrefix(s.Name(), "river.work") {
				found = s
				return true
			}
		}
		return false
	})
	return found
}

// requireNothingSecret: no attribute of any recorded span or of its events,
// and no status description, holds the secret or a job's payload.
func requireNothingSecret(t *testing.T, rec *tracetest.SpanRecorder, payloads ...string) {
	t.Helper()
	forbidden := append([]string{traceSecret}, payloads...)
	check := func(where string, s string) {
		for _, f := range forbidden {
			require.NotContains(t, s, f, "%s holds %q", where, f)
		}
	}
	spans := rec.Ended()
	require.NotEmpty(t, spans)
	for _, s := range spans {
		for _, kv := range s.Attributes() {
			check(s.Name()+" attribute "+string(kv.Key), kv.Value.Emit())
		}
		for _, e := range s.Events() {
			for _, kv := range e.Attributes {
				check(s.Name()+" event "+e.Name+" attribute "+string(kv.Key), kv.Value.Emit())
			}
		}
		check(s.Name()+" status", s.Status().Description)
	}
}

// TestJobSpanNamesShardEpochAndOutcome: every job a worker works is River's
// work span river.work/<kind>, with our attributes: its shard, the epoch of the
// shard lease it ran under, its outcome (completed, retried, cancelled,
// discarded on its last attempt) and,
// when it did not complete, its error's code. No span holds the database
// password or a job's arguments.
func TestJobSpanNamesShardEpochAndOutcome(t *testing.T) {
	t.Parallel()
	db := newTraceDB(t)
	tr := newTraced()
	rt := startTraced(t, db, &traceWorker{}, tr, "")
	l, _ := rt.LeaseForQueue(jobs.ShardQueue(0))

	cases := []struct {
		mode, outcome string
		code          fault.Code
	}{
		{"ok", tracing.OutcomeCompleted, ""},
		{"unavailable", tracing.OutcomeRetried, fault.Unavailable},
		{"invalid", tracing.OutcomeCancelled, fault.InvalidArgument},
		{"last-attempt", tracing.OutcomeDiscarded, fault.Unavailable},
	}
	var payloads []string
	for _, c := range cases {
		payload := "payload-of-" + c.mode + "-8d2e"
		payloads = append(payloads, payload)
		id := insertTrace(t, db, traceArgs{Mode: c.mode, Payload: payload})
		s := workSpan(t, tr.rec, id, c.mode)
		require.Equal(t, "river.work/test_trace", s.Name())
		shard, ok := attrOf(s.Attributes(), tracing.Shard)
		require.True(t, ok, "%s: shard attribute", c.mode)
		require.Equal(t, int64(0), shard.AsInt64())
		epoch, ok := attrOf(s.Attributes(), tracing.LeaseEpoch)
		require.True(t, ok, "%s: lease epoch attribute", c.mode)
		require.Equal(t, l.Epoch, epoch.AsInt64())
		outcome, _ := attrOf(s.Attributes(), tracing.Outcome)
		require.Equal(t, c.outcome, outcome.AsString(), c.mode)
		code, ok := attrOf(s.Attributes(), tracing.ErrorCode)
		if c.code == "" {
			require.False(t, ok, "%s: no error code on a completed job", c.mode)
		} else {
			require.Equal(t, string(c.code), code.AsString(), c.mode)
		}
	}
	requireNothingSecret(t, tr.rec, payloads...)
}

// TestLostLeaseIsAFencedSpanEvent: a job whose fenced transaction runs after
// another owner took the shard lease ends with outcome FENCED, and its span
// has a bettercompute.fenced event naming the queue and the epoch it was
// fenced by; the keeper's next round is a lease span with a lease-lost event.
func TestLostLeaseIsAFencedSpanEvent(t *testing.T) {
	t.Parallel()
	db := newTraceDB(t)
	tr := newTraced()
	w := &traceWorker{}
	ctl := w.park("a")
	rt := startTraced(t, db, w, tr, "")
	l, _ := rt.LeaseForQueue(jobs.ShardQueue(0))
	id := insertTrace(t, db, traceArgs{Mode: "park", Name: "a", Payload: "parked-payload-51c0"})
	<-ctl.started

	db.MustExec(t, `UPDATE compute_leases SET owner = 'thief', epoch = epoch + 1, expires_at = compute_now() + interval '1 hour' WHERE name = 'shard/0'`)
	close(ctl.release)
	require.Equal(t, fault.Fenced, fault.CodeOf(<-ctl.result))

	s := workSpan(t, tr.rec, id, "fenced")
	outcome, _ := attrOf(s.Attributes(), tracing.Outcome)
	require.Equal(t, tracing.OutcomeFenced, outcome.AsString())
	var fenced []sdktrace.Event
	for _, e := range s.Events() {
		if e.Name == tracing.EventFenced {
			fenced = append(fenced, e)
		}
	}
	require.Len(t, fenced, 1, "one fenced event: %v", s.Events())
	queue, _ := attrOf(fenced[0].Attributes, "bettercompute.queue")
	require.Equal(t, jobs.ShardQueue(0), queue.AsString())
	epoch, _ := attrOf(fenced[0].Attributes, tracing.LeaseEpoch)
	require.Equal(t, l.Epoch, epoch.AsInt64())
	reason, _ := attrOf(fenced[0].Attributes, "bettercompute.reason")
	require.Contains(t, reason.AsString(), "no longer held")

	ev := leaseEvent(t, tr.rec, tracing.EventLeaseLost, "", "the lease-lost event")
	epoch, _ = attrOf(ev.Attributes, tracing.LeaseEpoch)
	require.Equal(t, l.Epoch, epoch.AsInt64())
	shard, _ := attrOf(ev.Attributes, tracing.Shard)
	require.Equal(t, int64(0), shard.AsInt64())
	requireNothingSecret(t, tr.rec, "parked-payload-51c0")
}

// leaseEvent waits for an event named name (with lease action action, if not
// "") on an ended lease round span of rec, and returns it.
func leaseEvent(t *testing.T, rec *tracetest.SpanRecorder, name, action, what string) sdktrace.Event {
	t.Helper()
	var found sdktrace.Event
	workertest.WaitFor(t, 60*time.Second, what, func() bool {
		for _, s := range rec.Ended() {
			if s.Name() != workers.LeaseRoundSpan {
				continue
			}
			for _, e := range s.Events() {
				a, _ := attrOf(e.Attributes, "bettercompute.lease.action")
				if e.Name == name && (action == "" || a.AsString() == action) {
					found = e
					return true
				}
			}
		}
		return false
	})
	return found
}

// TestLeaseRoundsAreSpans: a worker's lease rounds are spans: its first round
// acquires the shard lease (an acquired event), later rounds renew it (a
// renewed event), and a second worker taking the shard over from the first,
// stopped, records a takeover event naming the previous owner, the new epoch
// and how many jobs it handed back.
func TestLeaseRoundsAreSpans(t *testing.T) {
	t.Parallel()
	db := newTraceDB(t)
	tr1, tr2 := newTraced(), newTraced()
	rt1 := startTraced(t, db, &traceWorker{}, tr1, "first")
	l1, _ := rt1.LeaseForQueue(jobs.ShardQueue(0))

	ev := leaseEvent(t, tr1.rec, tracing.EventLease, "acquired", "the first worker's acquired event")
	epoch, _ := attrOf(ev.Attributes, tracing.LeaseEpoch)
	require.Equal(t, l1.Epoch, epoch.AsInt64())
	name, _ := attrOf(ev.Attributes, tracing.Lease)
	require.Equal(t, "shard/0", name.AsString())
	shard, ok := attrOf(ev.Attributes, tracing.Shard)
	require.True(t, ok)
	require.Equal(t, int64(0), shard.AsInt64())
	for _, s := range tr1.rec.Ended() {
		if s.Name() == workers.LeaseRoundSpan {
			for _, e := range s.Events() {
				require.NotEqual(t, tracing.EventTakeover, e.Name, "a first acquisition is no takeover")
			}
		}
	}
	leaseEvent(t, tr1.rec, tracing.EventLease, "renewed", "the first worker's renewed event")

	require.NoError(t, rt1.Stop(context.Background()))
	// A job the first worker left running, as if it had died in the middle of
	// it: the takeover hands it back.
	var left int64
	require.NoError(t, db.QueryRow(context.Background(), `INSERT INTO river_job
		(args, kind, max_attempts, priority, queue, state, attempt, attempted_at, attempted_by, scheduled_at)
		VALUES ('{"mode":"ok"}', 'test_trace', 25, 1, $1, 'running', 1, $3, ARRAY[$2], $3) RETURNING id`,
		jobs.ShardQueue(0), rt1.Owner(), time.Now()).Scan(&left))
	rt2 := startTraced(t, db, &traceWorker{}, tr2, "second")
	l2, _ := rt2.LeaseForQueue(jobs.ShardQueue(0))
	require.Equal(t, l1.Epoch+1, l2.Epoch)

	ev = leaseEvent(t, tr2.rec, tracing.EventTakeover, "", "the second worker's takeover event")
	prev, _ := attrOf(ev.Attributes, "bettercompute.lease.previous_owner")
	require.Equal(t, rt1.Owner(), prev.AsString())
	epoch, _ = attrOf(ev.Attributes, tracing.LeaseEpoch)
	require.Equal(t, l2.Epoch, epoch.AsInt64())
	handed, ok := attrOf(ev.Attributes, "bettercompute.jobs.handed_back")
	require.True(t, ok, "the takeover says how many jobs it handed back")
	require.Equal(t, int64(1), handed.AsInt64(), "the job the first worker left running")
	ev = leaseEvent(t, tr2.rec, tracing.EventLease, "acquired", "the second worker's acquired event")
	epoch, _ = attrOf(ev.Attributes, tracing.LeaseEpoch)
	require.Equal(t, l2.Epoch, epoch.AsInt64())
}

// TestInsertedInASpanIsItsTrace: a job inserted through the runtime's River
// client inside a span is worked in that span's trace: River's work span's
// parent is the insert's span (a child of the inserting span), and it links
// to it.
func TestInsertedInASpanIsItsTrace(t *testing.T) {
	t.Parallel()
	db := newTraceDB(t)
	tr := newTraced()
	rt := startTraced(t, db, &traceWorker{}, tr, "")

	ctx, request := tr.tp.Tracer("test").Start(context.Background(), "request")
	var id int64
	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		res, err := rt.Client().InsertTx(ctx, tx, traceArgs{Mode: "ok", Payload: "inserted-payload-a1b2"}, &river.InsertOpts{Queue: jobs.ShardQueue(0)})
		if err == nil {
			id = res.Job.ID
		}
		return err
	}))
	request.End()

	s := workSpan(t, tr.rec, id, "inserted in a span")
	require.Equal(t, request.SpanContext().TraceID(), s.SpanContext().TraceID(), "the work is in the request's trace")
	require.True(t, s.Parent().IsValid() && s.Parent().IsRemote(), "the work span has the stored traceparent as its (remote) parent")
	var insert sdktrace.ReadOnlySpan
	for _, x := range tr.rec.Ended() {
		if x.SpanContext().SpanID() == s.Parent().SpanID() {
			insert = x
		}
	}
	require.NotNil(t, insert, "the parent is a span of this process")
	require.Equal(t, request.SpanContext().SpanID(), insert.Parent().SpanID(), "the parent (%s) is the inserting span's child", insert.Name())
	require.Len(t, s.Links(), 1)
	require.Equal(t, s.Parent().SpanID(), s.Links()[0].SpanContext.SpanID(), "and the work span links to it")
	outcome, _ := attrOf(s.Attributes(), tracing.Outcome)
	require.Equal(t, tracing.OutcomeCompleted, outcome.AsString())
	requireNothingSecret(t, tr.rec, "inserted-payload-a1b2")
}

// TestTracingOffInstallsNothing: with no TracerProvider, River's OpenTelemetry
// middleware is not installed: a job inserted through the runtime's client
// inside a sampled span carries no traceparent, and nothing of the runtime
// reaches any provider (the test's sees only its own span).
func TestTracingOffInstallsNothing(t *testing.T) {
	t.Parallel()
	db := newTraceDB(t)
	rt := startTraced(t, db, &traceWorker{}, traced{}, "")
	tr := newTraced()

	ctx, request := tr.tp.Tracer("test").Start(context.Background(), "request")
	require.True(t, request.SpanContext().IsSampled())
	var id int64
	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		res, err := rt.Client().InsertTx(ctx, tx, traceArgs{Mode: "ok"}, &river.InsertOpts{Queue: jobs.ShardQueue(0)})
		if err == nil {
			id = res.Job.ID
		}
		return err
	}))
	request.End()
	workertest.WaitFor(t, 60*time.Second, "the job completed", func() bool { return jobState(t, db, id) == "completed" })

	var meta []byte
	require.NoError(t, db.QueryRow(context.Background(), `SELECT metadata FROM river_job WHERE id = $1`, id).Scan(&meta))
	var m map[string]any
	require.NoError(t, json.Unmarshal(meta, &m))
	require.NotContains(t, m, "traceparent", "no insert middleware wrote the trace context: %s", meta)
	for _, s := range tr.rec.Ended() {
		require.Equal(t, "request", s.Name(), "only the test's own span")
	}
	_, span := rt.TracerProvider().Tracer("x").Start(context.Background(), "y")
	require.False(t, span.IsRecording(), "the runtime's provider is a no-op one")
}

// TestBadTraceparentIsIgnored: a job whose metadata carries a malformed
// traceparent is worked as any other (tracing never fails work): its work span
// starts a trace of its own, with no parent and no link.
func TestBadTraceparentIsIgnored(t *testing.T) {
	t.Parallel()
	db := newTraceDB(t)
	tr := newTraced()
	startTraced(t, db, &traceWorker{}, tr, "")
	var id int64
	require.NoError(t, pg.InTx(context.Background(), db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		res, err := jobs.InsertTx(ctx, tx, traceArgs{Mode: "ok"}, &river.InsertOpts{Queue: jobs.ShardQueue(0),
			Metadata: []byte(`{"traceparent": "00-not-a-trace-01"}`)})
		if err == nil {
			id = res.Job.ID
		}
		return err
	}))
	s := workSpan(t, tr.rec, id, "a malformed traceparent")
	require.False(t, s.Parent().IsValid(), "no parent")
	require.Empty(t, s.Links(), "no link")
	outcome, _ := attrOf(s.Attributes(), tracing.Outcome)
	require.Equal(t, tracing.OutcomeCompleted, outcome.AsString())
	require.Equal(t, "completed", jobState(t, db, id))
}
