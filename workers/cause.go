package workers

import (
	"context"
	"errors"

	"github.com/riverqueue/river/rivertype"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/tracing"
	"github.com/bettercompute/bettercompute/workers/internal/lease"
)

// The spans of the work that application requests cause (platform/tracing):
// a reconcile, a workflow step, an outbox delivery. Each starts with
// tracing.Start from the causes stored beside its work, so its parent is the
// first cause (unless River's own span of the job is already its parent) and
// every cause is a link. A span's attributes name the work (kinds, keys, ids),
// never a payload.

// ReconcileSpan is the name of a reconcile's span.
const ReconcileSpan = "bettercompute.reconcile"

// errRetried ends the span of a run that starts again.
var errRetried = errors.New("retried")

// reconcileSpan starts the span of a reconcile run of job row: the batch's
// keys (or only's), caused by their dirties.
func reconcileSpan(ctx context.Context, tp trace.TracerProvider, l lease.Lease, row *rivertype.JobRow, kind, only string,
	claimed []claimedKey) (context.Context, trace.Span) {
	var causes []string
	for _, c := range claimed {
		if len(causes) >= tracing.MaxCauses {
			break
		}
		causes = append(causes, c.causes...)
	}
	ctx, span := tracing.Start(ctx, tp, ReconcileSpan, causes)
	if !span.IsRecording() {
		return ctx, span // tracing off (or not sampled): no attributes built
	}
	attrs := []attribute.KeyValue{tracing.Reconciler.String(kind), tracing.LeaseEpoch.Int64(l.Epoch)}
	if shard, ok := ShardOfQueue(row.Queue); ok {
		attrs = append(attrs, tracing.Shard.Int(shard))
	}
	switch {
	case only != "":
		attrs = append(attrs, tracing.Key.String(only))
	case len(claimed) == 1:
		attrs = append(attrs, tracing.Key.String(claimed[0].key))
	case len(claimed) > 1:
		keys := make([]string, 0, min(len(claimed), tracing.MaxCauses))
		for _, c := range claimed[:min(len(claimed), tracing.MaxCauses)] {
			keys = append(keys, c.key)
		}
		attrs = append(attrs, tracing.Keys.StringSlice(keys))
	}
	span.SetAttributes(attrs...)
	return ctx, span
}

// ShardOfQueue is the shard of shard queue q (jobs.ShardQueue), false for
// another queue.
func ShardOfQueue(q string) (int, bool) { return shardOfQueue(q) }

// Outcome is the tracing outcome of work that ended with err: completed,
// FENCED, cancelled (its context was cancelled: a stop, a lost lease) or
// retried (anything else: the work is tried again).
func Outcome(ctx context.Context, err error) string {
	switch {
	case err == nil:
		return tracing.OutcomeCompleted
	case fault.Has(err, fault.Fenced) || fault.Has(context.Cause(ctx), fault.Fenced):
		return tracing.OutcomeFenced
	case ctx != nil && ctx.Err() != nil:
		return tracing.OutcomeCancelled
	}
	return tracing.OutcomeRetried
}

// endSpan ends span with the outcome of err (Outcome, without a context) and,
// for an error, its fault code as status: never the error's message, which may
// quote the work's data.
func endSpan(span trace.Span, err error) {
	EndSpanOutcome(span, err, Outcome(context.Background(), err))
}

// EndSpanOutcome ends span with outcome and, for an error, its fault code.
func EndSpanOutcome(span trace.Span, err error, outcome string) {
	if !span.IsRecording() {
		span.End()
		return
	}
	span.SetAttributes(tracing.Outcome.String(outcome))
	if err != nil {
		code := fault.CodeOf(err)
		span.SetAttributes(tracing.ErrorCode.String(string(code)))
		span.SetStatus(codes.Error, string(code))
	}
	span.End()
}
