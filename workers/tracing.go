package workers

import (
	"context"
	"encoding/json"
	"sync"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/riverqueue/rivercontrib/otelriver"
	"go.opentelemetry.io/otel/attribute"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"

	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/tracing"
	"github.com/bettercompute/bettercompute/workers/internal/lease"
)

// Tracing of a worker process (Options.TracerProvider set; nothing of this
// runs, and nothing is installed, when it is nil):
//
//	River work span   river.work/<kind>, River's own middleware (otelriver): its
//	                  parent is the traceparent the job's metadata carries (the
//	                  inserting span), linked too; our attributes shard, lease
//	                  epoch, outcome and error code set by jobMiddleware
//	fenced event      bettercompute.fenced on the span of the work whose fenced
//	                  transaction was refused (reason, queue, lease epoch)
//	lease round span  bettercompute.lease.round: one per keeper round that
//	                  acquired, renewed or lost a lease, with an event each
//
// More attribute keys of ours, beside platform/tracing's.
const (
	attrReason        = attribute.Key("bettercompute.reason")
	attrQueue         = attribute.Key("bettercompute.queue")
	attrLeaseAction   = attribute.Key("bettercompute.lease.action")
	attrLeaseOwner    = attribute.Key("bettercompute.lease.owner")
	attrPreviousOwner = attribute.Key("bettercompute.lease.previous_owner")
	attrHandedBack    = attribute.Key("bettercompute.jobs.handed_back")
)

// LeaseRoundSpan is the name of a lease round's span.
const LeaseRoundSpan = "bettercompute.lease.round"

// maxReason caps a fenced event's reason.
const maxReason = 200

// tracingMiddleware is the River middleware that goes before jobMiddleware
// when the process traces: causeMiddleware, then River's otelriver (outer to
// inner). None when Options.TracerProvider is nil.
func (rt *Runtime) tracingMiddleware() []rivertype.Middleware {
	if rt.o.TracerProvider == nil {
		return nil
	}
	return []rivertype.Middleware{
		&causeMiddleware{},
		otelriver.NewMiddleware(&otelriver.MiddlewareConfig{
			TracerProvider:              rt.o.TracerProvider,
			EnableTracePropagation:      true,
			EnableWorkSpanJobKindSuffix: true,
			// We export our own Prometheus metrics (Metrics); not twice.
			MeterProvider: metricnoop.NewMeterProvider(),
		}),
	}
}

// causeMiddleware makes the traceparent in a job's metadata (written by
// otelriver at insert, or by our inserts) the remote parent of the job's work
// span, so the work is in the request's trace; otelriver alone only links it.
// A missing or malformed traceparent changes nothing.
type causeMiddleware struct {
	river.MiddlewareDefaults
}

func (*causeMiddleware) Work(ctx context.Context, job *rivertype.JobRow, doInner func(ctx context.Context) error) error {
	if len(job.Metadata) == 0 || trace.SpanContextFromContext(ctx).IsValid() {
		return doInner(ctx)
	}
	var meta struct {
		Traceparent string `json:"traceparent"`
	}
	if json.Unmarshal(job.Metadata, &meta) == nil && meta.Traceparent != "" {
		ctx, _ = tracing.CausedBy(ctx, []string{meta.Traceparent})
	}
	return doInner(ctx)
}

// traceJob sets our attributes on the job's span (River's work span): its
// shard, the epoch of the shard lease it ran under, its outcome, and the error
// code of a job that did not complete. Nothing without a recording span.
func traceJob(ctx context.Context, job *rivertype.JobRow, l lease.Lease, held bool, out, err error) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	attrs := make([]attribute.KeyValue, 0, 4)
	if shard, ok := shardOfQueue(job.Queue); ok {
		attrs = append(attrs, tracing.Shard.Int(shard))
	}
	if held {
		attrs = append(attrs, tracing.LeaseEpoch.Int64(l.Epoch))
	}
	outcome := traceOutcome(out, err)
	if outcome == tracing.OutcomeRetried && job.MaxAttempts > 0 && job.Attempt >= job.MaxAttempts {
		outcome = tracing.OutcomeDiscarded // its last attempt: River discards it
	}
	attrs = append(attrs, tracing.Outcome.String(outcome))
	if err != nil && outcome != tracing.OutcomeSnoozed {
		attrs = append(attrs, tracing.ErrorCode.String(string(fault.CodeOf(err))))
	}
	span.SetAttributes(attrs...)
}

// traceOutcome is the Outcome of a job whose worker returned err, which
// jobMiddleware turned into out (outcomeName's cases, as tracing names them).
func traceOutcome(out, err error) string {
	switch outcomeName(out, err) {
	case "completed":
		return tracing.OutcomeCompleted
	case "fenced":
		return tracing.OutcomeFenced
	case "cancelled":
		return tracing.OutcomeCancelled
	case "snoozed":
		return tracing.OutcomeSnoozed
	default:
		return tracing.OutcomeRetried
	}
}

// fenced counts a fenced transaction refused for a job of queue (or a job
// not started because its lease is gone) and records it as an event on the
// span in ctx (the job's, or a reconcile's): its reason (err, secrets
// removed), the queue and the epoch of the lease it was fenced by (0: none
// held).
func (rt *Runtime) fenced(ctx context.Context, queue string, epoch int64, err error) {
	rt.metrics.fenced(queue)
	fencedEvent(ctx, rt, queue, epoch, err)
}

// fencedEvent is fenced's event alone (the metric counted elsewhere).
func fencedEvent(ctx context.Context, rt *Runtime, queue string, epoch int64, err error) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	reason := "fenced"
	if err != nil {
		reason = rt.redactErr(err).Error()
		if len(reason) > maxReason {
			reason = reason[:maxReason]
		}
	}
	span.AddEvent(tracing.EventFenced, trace.WithAttributes(
		attrReason.String(reason), attrQueue.String(queue), tracing.LeaseEpoch.Int64(epoch)))
}

// leaseTrace is what the lease keeper's rounds need for their spans: how many
// jobs each takeover handed back (set by the keeper's Taken hook, inside the
// round that reports it).
type leaseTrace struct {
	mu     sync.Mutex
	handed map[string]int // lease name -> jobs handed back at its takeover
}

// noteTakeover remembers that the takeover of lease name handed back n jobs.
func (lt *leaseTrace) noteTakeover(name string, n int) {
	lt.mu.Lock()
	if lt.handed == nil {
		lt.handed = map[string]int{}
	}
	lt.handed[name] = n
	lt.mu.Unlock()
}

func (lt *leaseTrace) takeHanded(name string) int {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	n := lt.handed[name]
	delete(lt.handed, name)
	return n
}

// leaseRoundHook is the keeper's OnRound when the process traces (nil
// otherwise: no span, nothing collected): one short span per round that
// acquired, renewed or lost a lease, started at the round's start, with an
// event per lease.
func (rt *Runtime) leaseRoundHook() func(lease.Round) {
	if rt.o.TracerProvider == nil {
		return nil
	}
	tracer := rt.o.TracerProvider.Tracer(tracing.TracerName)
	return func(r lease.Round) {
		_, span := tracer.Start(context.Background(), LeaseRoundSpan,
			trace.WithTimestamp(r.Start), trace.WithAttributes(attrLeaseOwner.String(rt.owner)))
		defer span.End()
		if !span.IsRecording() {
			for _, a := range r.Acquired {
				rt.leaseTrace.takeHanded(a.Name)
			}
			return
		}
		for _, l := range r.Lost {
			span.AddEvent(tracing.EventLeaseLost, trace.WithAttributes(
				append(leaseAttrs(l.Lease), attrReason.String(l.Why))...))
		}
		for _, a := range r.Acquired {
			span.AddEvent(tracing.EventLease, trace.WithAttributes(
				append(leaseAttrs(a.Lease), attrLeaseAction.String("acquired"))...))
			handed := rt.leaseTrace.takeHanded(a.Name)
			if a.Previous != "" && a.Previous != rt.owner {
				span.AddEvent(tracing.EventTakeover, trace.WithAttributes(
					append(leaseAttrs(a.Lease), attrPreviousOwner.String(a.Previous), attrHandedBack.Int(handed))...))
			}
		}
		for _, l := range r.Renewed {
			span.AddEvent(tracing.EventLease, trace.WithAttributes(
				append(leaseAttrs(l), attrLeaseAction.String("renewed"))...))
		}
	}
}

// leaseAttrs are a lease's attributes: its name, epoch and, for a shard
// lease, the shard.
func leaseAttrs(l lease.Lease) []attribute.KeyValue {
	attrs := make([]attribute.KeyValue, 0, 5)
	attrs = append(attrs, tracing.Lease.String(l.Name), tracing.LeaseEpoch.Int64(l.Epoch))
	if shard, ok := shardOfLease(l.Name); ok {
		attrs = append(attrs, tracing.Shard.Int(shard))
	}
	return attrs
}
