package telemetry_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	common "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/telemetry"
	"github.com/bettercompute/bettercompute/platform/tracing"
)

// env is a getenv over m.
func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// TestOffByDefault: with no OTEL_* variable, with OTEL_TRACES_EXPORTER=none,
// and with OTEL_SDK_DISABLED=true (whatever else is set), there is no
// provider, and its shutdown does nothing.
func TestOffByDefault(t *testing.T) {
	t.Parallel()
	for name, vars := range map[string]map[string]string{
		"nothing set": {},
		"none":        {telemetry.EnvTracesExporter: "none", telemetry.EnvEndpoint: "http://127.0.0.1:1"},
		"sdk disabled": {telemetry.EnvSDKDisabled: "TRUE", telemetry.EnvTracesExporter: "console,otlp",
			telemetry.EnvEndpoint: "http://127.0.0.1:1"},
		"other variables only": {"OTEL_SERVICE_NAME": "shop", "OTEL_TRACES_SAMPLER": "always_on"},
	} {
		var out bytes.Buffer
		tp, shutdown, err := telemetry.FromEnv(context.Background(), env(vars), &out)
		require.NoError(t, err, name)
		require.Nil(t, tp, "%s: tracing is off", name)
		require.NoError(t, shutdown(context.Background()), name)
		require.Empty(t, out.String(), name)
	}
}

// TestConsoleWritesALinePerSpan: OTEL_TRACES_EXPORTER=console writes one line
// per span as it ends (no flush needed), with its name, ids, parent, link
// count, status and our attributes and events, and nothing else of it.
func TestConsoleWritesALinePerSpan(t *testing.T) {
	t.Parallel()
	var out syncBuffer
	tp, shutdown, err := telemetry.FromEnv(context.Background(), env(map[string]string{telemetry.EnvTracesExporter: " Console "}), &out)
	require.NoError(t, err)
	require.NotNil(t, tp)
	defer func() { require.NoError(t, shutdown(context.Background())) }()

	ctx, parent := tp.Tracer("test").Start(context.Background(), "request")
	_, span := tracing.Start(ctx, tp, "bettercompute.test", []string{tracing.Cause(ctx)})
	span.SetAttributes(tracing.Shard.Int(3), tracing.Outcome.String(tracing.OutcomeCompleted),
		attribute.String("args", "a payload that must not be printed"))
	span.AddEvent(tracing.EventFenced, trace.WithAttributes(attribute.String("bettercompute.reason", "lease lost"), attribute.String("payload", "hidden")))
	span.End()

	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	require.Len(t, lines, 1, "the span's line is written as it ends: %q", out.String())
	line := lines[0]
	sc := span.SpanContext()
	for _, want := range []string{
		"span bettercompute.test ", "trace=" + sc.TraceID().String(), "span=" + sc.SpanID().String(),
		"parent=" + parent.SpanContext().SpanID().String(), "links=1", "status=unset",
		"shard=3", "outcome=completed", "causes=1", `| fenced{reason="lease lost"}`,
	} {
		require.Contains(t, line, want)
	}
	require.NotContains(t, line, "payload")

	parent.End()
	require.Contains(t, out.String(), "span request ")
	require.Contains(t, out.String(), "parent=- links=0")
}

// TestUnknownExporterIsInvalidConfig: an exporter name FromEnv does not know,
// or an OTLP protocol it does not speak, is INVALID_CONFIG naming the variable
// and what it accepts.
func TestUnknownExporterIsInvalidConfig(t *testing.T) {
	t.Parallel()
	_, _, err := telemetry.FromEnv(context.Background(), env(map[string]string{telemetry.EnvTracesExporter: "otlp,zipkin"}), io.Discard)
	require.Equal(t, fault.InvalidConfig, fault.CodeOf(err), "%v", err)
	for _, want := range []string{"OTEL_TRACES_EXPORTER", `"zipkin"`, "otlp", "console", "none"} {
		require.Contains(t, err.Error(), want)
	}

	_, _, err = telemetry.FromEnv(context.Background(), env(map[string]string{
		telemetry.EnvEndpoint: "http://127.0.0.1:1", telemetry.EnvProtocol: "http/json",
	}), io.Discard)
	require.Equal(t, fault.InvalidConfig, fault.CodeOf(err), "%v", err)
	for _, want := range []string{"OTEL_EXPORTER_OTLP_PROTOCOL", "http/json", "http/protobuf", "grpc"} {
		require.Contains(t, err.Error(), want)
	}
}

// TestSamplerAlwaysOffSamplesNothing: the SDK reads OTEL_TRACES_SAMPLER from
// the process environment; always_off records no span, and the console prints
// nothing.
func TestSamplerAlwaysOffSamplesNothing(t *testing.T) {
	t.Setenv("OTEL_TRACES_SAMPLER", "always_off")
	var out syncBuffer
	tp, shutdown, err := telemetry.FromEnv(context.Background(), env(map[string]string{telemetry.EnvTracesExporter: "console"}), &out)
	require.NoError(t, err)
	ctx, span := tp.Tracer("test").Start(context.Background(), "request")
	require.False(t, span.SpanContext().IsSampled())
	require.False(t, span.IsRecording())
	require.Empty(t, tracing.Cause(ctx), "an unsampled span is no cause")
	span.End()
	require.NoError(t, shutdown(context.Background()))
	require.Empty(t, out.String())
}

// TestOTLPHTTPExportsToTheEndpoint: OTEL_EXPORTER_OTLP_ENDPOINT alone turns
// OTLP over HTTP on; a span that ended is POSTed to the endpoint's /v1/traces
// when shutdown flushes, with service.name better-compute.
func TestOTLPHTTPExportsToTheEndpoint(t *testing.T) {
	var mu sync.Mutex
	var got []*coltrace.ExportTraceServiceRequest
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
			http.Error(w, "unexpected "+r.Method+" "+r.URL.Path, http.StatusBadRequest)
			return
		}
		req := &coltrace.ExportTraceServiceRequest{}
		if err := proto.Unmarshal(body, req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		got = append(got, req)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		b, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
		_, _ = w.Write(b)
	}))
	defer srv.Close()
	t.Setenv(telemetry.EnvEndpoint, srv.URL)
	t.Setenv("OTEL_SERVICE_NAME", "")
	t.Setenv(telemetry.EnvResourceAttributes, "")

	tp, shutdown, err := telemetry.FromEnv(context.Background(), nil, nil)
	require.NoError(t, err)
	require.NotNil(t, tp)
	_, span := tp.Tracer("test").Start(context.Background(), "bettercompute.test")
	span.SetAttributes(tracing.Shard.Int(1))
	span.End()
	require.NoError(t, shutdown(context.Background()), "shutdown flushes the batch")

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, got, 1, "one export request")
	rs := got[0].GetResourceSpans()
	require.Len(t, rs, 1)
	require.Equal(t, telemetry.ServiceName, resourceAttr(rs[0].GetResource().GetAttributes(), "service.name"))
	spans := rs[0].GetScopeSpans()[0].GetSpans()
	require.Len(t, spans, 1)
	require.Equal(t, "bettercompute.test", spans[0].GetName())
	require.Equal(t, span.SpanContext().TraceID().String(), hexOf(spans[0].GetTraceId()))
}

// TestOTLPGRPCExportsToTheEndpoint: OTEL_TRACES_EXPORTER=otlp with
// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=grpc sends over gRPC to the traces
// endpoint; OTEL_SERVICE_NAME names the service.
func TestOTLPGRPCExportsToTheEndpoint(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	col := &collector{}
	gs := grpc.NewServer()
	coltrace.RegisterTraceServiceServer(gs, col)
	go func() { _ = gs.Serve(ln) }()
	defer gs.Stop()
	t.Setenv(telemetry.EnvTracesEndpoint, "http://"+ln.Addr().String())
	t.Setenv(telemetry.EnvTracesExporter, "otlp")
	t.Setenv(telemetry.EnvTracesProtocol, "grpc")
	t.Setenv("OTEL_SERVICE_NAME", "shop")

	tp, shutdown, err := telemetry.FromEnv(context.Background(), nil, nil)
	require.NoError(t, err)
	_, span := tp.Tracer("test").Start(context.Background(), "bettercompute.test")
	span.End()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, shutdown(ctx), "shutdown flushes the batch")

	col.mu.Lock()
	defer col.mu.Unlock()
	require.Len(t, col.got, 1, "one export request")
	rs := col.got[0].GetResourceSpans()[0]
	require.Equal(t, "shop", resourceAttr(rs.GetResource().GetAttributes(), "service.name"))
	require.Equal(t, "bettercompute.test", rs.GetScopeSpans()[0].GetSpans()[0].GetName())
}

// TestBothExporters: otlp,console prints each span and sends it.
func TestBothExporters(t *testing.T) {
	var posts syncBuffer
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = posts.Write([]byte("post\n"))
	}))
	defer srv.Close()
	t.Setenv(telemetry.EnvEndpoint, srv.URL)
	var out syncBuffer
	tp, shutdown, err := telemetry.FromEnv(context.Background(), env(map[string]string{
		telemetry.EnvTracesExporter: "otlp,console,otlp", telemetry.EnvEndpoint: srv.URL,
	}), &out)
	require.NoError(t, err)
	_, span := tp.Tracer("test").Start(context.Background(), "bettercompute.test")
	span.End()
	require.Contains(t, out.String(), "span bettercompute.test ")
	require.NoError(t, shutdown(context.Background()))
	require.Equal(t, "post\n", posts.String(), "one exporter per name, however often it is listed")
}

type collector struct {
	coltrace.UnimplementedTraceServiceServer
	mu  sync.Mutex
	got []*coltrace.ExportTraceServiceRequest
}

func (c *collector) Export(_ context.Context, req *coltrace.ExportTraceServiceRequest) (*coltrace.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	c.got = append(c.got, req)
	c.mu.Unlock()
	return &coltrace.ExportTraceServiceResponse{}, nil
}

// syncBuffer is a bytes.Buffer safe for the exporters' goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func resourceAttr(attrs []*common.KeyValue, key string) string {
	for _, kv := range attrs {
		if kv.GetKey() == key {
			return kv.GetValue().GetStringValue()
		}
	}
	return ""
}

func hexOf(b []byte) string { return hex.EncodeToString(b) }

// TestMalformedResourceAttributesIsInvalidConfig: OTEL_RESOURCE_ATTRIBUTES
// that are not key=value pairs are INVALID_CONFIG naming the variable.
func TestMalformedResourceAttributesIsInvalidConfig(t *testing.T) {
	t.Setenv(telemetry.EnvResourceAttributes, "team=compute,no-equals-sign")
	tp, _, err := telemetry.FromEnv(context.Background(), env(map[string]string{telemetry.EnvTracesExporter: "console"}), io.Discard)
	require.Nil(t, tp)
	require.Equal(t, fault.InvalidConfig, fault.CodeOf(err), "%v", err)
	require.Contains(t, err.Error(), "OTEL_RESOURCE_ATTRIBUTES")
}
