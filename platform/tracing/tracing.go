package tracing

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// TracerName is the instrumentation scope of every span of ours.
const TracerName = "github.com/bettercompute/bettercompute"

// MaxCauses is the most causes (span links) kept for one piece of work: a key
// dirtied by a thousand requests while it waited links the first MaxCauses.
const MaxCauses = 32

// Attribute keys of our spans (and of River's work spans, which our middleware
// adds them to).
const (
	Shard          = attribute.Key("bettercompute.shard")
	LeaseEpoch     = attribute.Key("bettercompute.lease.epoch")
	Lease          = attribute.Key("bettercompute.lease")
	Reconciler     = attribute.Key("bettercompute.reconciler")
	Key            = attribute.Key("bettercompute.key")
	Keys           = attribute.Key("bettercompute.keys")
	WorkflowID     = attribute.Key("bettercompute.workflow.id")
	WorkflowKind   = attribute.Key("bettercompute.workflow")
	WorkflowStep   = attribute.Key("bettercompute.workflow.step")
	Sink           = attribute.Key("bettercompute.sink")
	Backfill       = attribute.Key("bettercompute.backfill")
	Outcome        = attribute.Key("bettercompute.outcome")
	ErrorCode      = attribute.Key("bettercompute.error.code")
	CauseCount     = attribute.Key("bettercompute.causes")
	EventFenced    = "bettercompute.fenced"
	EventLease     = "bettercompute.lease"
	EventTakeover  = "bettercompute.lease.takeover"
	EventLeaseLost = "bettercompute.lease.lost"
)

// Outcomes, the values of Outcome.
const (
	OutcomeCompleted = "completed"
	OutcomeFenced    = "FENCED"
	OutcomeRetried   = "retried"
	OutcomeCancelled = "cancelled"
	OutcomeSnoozed   = "snoozed"
	// OutcomeDiscarded: failed on its last attempt; River discards the job.
	OutcomeDiscarded = "discarded"
)

// Cause returns the W3C traceparent of the span in ctx, or "" when ctx has no
// valid, sampled span (tracing off, or this request not sampled): the value
// to store beside the work ctx causes.
func Cause(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() || !sc.IsSampled() {
		return ""
	}
	c := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(context.Background(), sc), c)
	return c["traceparent"]
}

// CauseOrNil is Cause as a SQL argument: nil (NULL) instead of "".
func CauseOrNil(ctx context.Context) any {
	if c := Cause(ctx); c != "" {
		return c
	}
	return nil
}

// SpanContext decodes a stored cause; the zero SpanContext (not valid) for ""
// or a malformed one.
func SpanContext(cause string) trace.SpanContext {
	if cause == "" {
		return trace.SpanContext{}
	}
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": cause})
	return trace.SpanContextFromContext(ctx)
}

// Links are the span links to causes, the malformed and repeated ones left
// out, at most MaxCauses.
func Links(causes []string) []trace.Link {
	var out []trace.Link
	seen := map[trace.SpanID]bool{}
	for _, c := range causes {
		sc := SpanContext(c)
		if !sc.IsValid() || seen[sc.SpanID()] {
			continue
		}
		seen[sc.SpanID()] = true
		out = append(out, trace.Link{SpanContext: sc})
		if len(out) == MaxCauses {
			break
		}
	}
	return out
}

// CausedBy are the start options of the span of work caused by causes, and
// the context to start it in: the work joins its first valid cause's trace and
// links to every cause. Its parent is the span in ctx when that span is in the
// first cause's trace already (River's span of a job whose metadata carried
// the cause: the work nests under it); otherwise the first cause, and the span
// in ctx, if any (River's span of a job that carried no cause: a handed-back
// reconcile batch, a sink's delivery job), is linked instead. No valid cause:
// ctx unchanged, no options.
func CausedBy(ctx context.Context, causes []string) (context.Context, []trace.SpanStartOption) {
	links := Links(causes)
	if len(links) == 0 {
		return ctx, nil
	}
	n := len(links)
	first := links[0].SpanContext
	if cur := trace.SpanContextFromContext(ctx); cur.TraceID() != first.TraceID() {
		if cur.IsValid() {
			links = append(links, trace.Link{SpanContext: cur})
		}
		ctx = trace.ContextWithRemoteSpanContext(ctx, first)
	}
	return ctx, []trace.SpanStartOption{trace.WithLinks(links...), trace.WithAttributes(CauseCount.Int(n))}
}

// Start starts a span of ours named name with tp's tracer, caused by causes
// (see CausedBy). tp nil is a no-op provider: the span records nothing.
func Start(ctx context.Context, tp trace.TracerProvider, name string, causes []string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	ctx, causeOpts := CausedBy(ctx, causes)
	return tp.Tracer(TracerName).Start(ctx, name, append(causeOpts, opts...)...)
}

// EventCount is the number of events a span's work handled (an outbox
// delivery's batch).
const EventCount = attribute.Key("bettercompute.events")
