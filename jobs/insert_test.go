package jobs_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/platform/tracing"
	"github.com/bettercompute/bettercompute/workers"
)

type shipArgs struct {
	OrderID string `json:"order_id"`
}

func (shipArgs) Kind() string { return "ship_order" }

type noteArgs struct{}

func (noteArgs) Kind() string { return "note" }

// TestInsertTxRecordsTheRequestsTrace: a job inserted while the request's span
// is sampled carries it as metadata "traceparent" (the key River's
// OpenTelemetry middleware reads), beside the metadata the caller gave; without
// a sampled span nothing is added; metadata that is not a JSON object is
// INVALID_ARGUMENT.
func TestInsertTxRecordsTheRequestsTrace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tp.Shutdown(ctx) })

	insert := func(ctx context.Context, key string, md []byte) error {
		return pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
			_, err := workers.InsertForKeyTx(ctx, tx, key, shipArgs{OrderID: key}, &river.InsertOpts{Metadata: md})
			return err
		})
	}
	metadata := func(key string) map[string]any {
		var m map[string]any
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT metadata FROM river_job WHERE args->>'order_id' = $1`, key).Scan(&m))
		return m
	}

	reqCtx, span := tp.Tracer("test").Start(ctx, "request")
	require.NoError(t, insert(reqCtx, "traced", []byte(`{"tenant":"acme"}`)))
	span.End()
	m := metadata("traced")
	require.Equal(t, tracing.Cause(reqCtx), m["traceparent"], "the request's span is the job's cause")
	require.Equal(t, "acme", m["tenant"], "the caller's metadata is kept")

	require.NoError(t, insert(ctx, "untraced", nil))
	require.NotContains(t, metadata("untraced"), "traceparent", "no span, no cause")

	unsampled := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
	uctx, uspan := unsampled.Tracer("test").Start(ctx, "request")
	require.NoError(t, insert(uctx, "unsampled", nil))
	uspan.End()
	require.NotContains(t, metadata("unsampled"), "traceparent", "an unsampled request stores no cause")

	err := insert(reqCtx, "bad", []byte(`[1]`))
	require.True(t, fault.Has(err, fault.InvalidArgument), "%v", err)
}
