package backfillworker

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/bettercompute/bettercompute/domain/backfill"
	"github.com/bettercompute/bettercompute/platform/tracing"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

// TestEachBatchIsASpan: with tracing on, every batch transaction of a backfill
// is a span bettercompute.backfill.batch naming the backfill, with its outcome,
// and no cause (an operator started it): its parent is River's span of the
// backfill's job.
func TestEachBatchIsASpan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newDB(t)
	makeTable(t, db, "traced_items", 250)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	b := fillBackfill("traced_fill", "traced_items", nil, nil)
	startWorker(t, db, registry(t, b), &workers.Options{TracerProvider: tp})
	_, err := startBackfill(ctx, db.Pool, b)
	require.NoError(t, err)
	waitState(t, db, b.Name, backfill.Done, 60*time.Second)
	p := mustGet(t, db.Pool, b.Name)

	// A batch's span ends once its transaction has committed.
	var spans []sdktrace.ReadOnlySpan
	workertest.WaitFor(t, 30*time.Second, "a span per batch", func() bool {
		spans = spans[:0]
		for _, s := range rec.Ended() {
			if s.Name() == BatchSpan {
				spans = append(spans, s)
			}
		}
		return int64(len(spans)) >= p.Batches
	})
	require.EqualValues(t, p.Batches, len(spans), "one span per batch")
	names := map[trace.SpanID]string{}
	for _, s := range rec.Ended() {
		names[s.SpanContext().SpanID()] = s.Name()
	}
	for _, s := range spans {
		got := map[string]string{}
		for _, a := range s.Attributes() {
			got[string(a.Key)] = a.Value.Emit()
		}
		require.Equal(t, b.Name, got[string(tracing.Backfill)])
		require.Equal(t, tracing.OutcomeCompleted, got[string(tracing.Outcome)])
		require.Equal(t, "river.work/"+kindOf(b), names[s.Parent().SpanID()], "no cause: the parent is River's span of the backfill's job")
		require.Empty(t, s.Links())
	}
}
