package telemetry

import (
	"context"
	"io"
	"os"
	"slices"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/bettercompute/bettercompute/platform/fault"
)

// ServiceName is service.name when OTEL_SERVICE_NAME (or service.name in
// OTEL_RESOURCE_ATTRIBUTES) does not say otherwise.
const ServiceName = "better-compute"

// The variables FromEnv reads itself (the SDK and the exporters read the rest).
const (
	EnvSDKDisabled        = "OTEL_SDK_DISABLED"
	EnvTracesExporter     = "OTEL_TRACES_EXPORTER"
	EnvEndpoint           = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvTracesEndpoint     = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	EnvProtocol           = "OTEL_EXPORTER_OTLP_PROTOCOL"
	EnvTracesProtocol     = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	EnvResourceAttributes = "OTEL_RESOURCE_ATTRIBUTES"
)

// Exporter names of OTEL_TRACES_EXPORTER.
const (
	ExporterOTLP    = "otlp"
	ExporterConsole = "console"
	ExporterNone    = "none"
)

// OTLP protocols.
const (
	ProtocolHTTP = "http/protobuf"
	ProtocolGRPC = "grpc"
)

// FromEnv builds the tracer provider the OTEL_* variables ask for (see the
// package doc), reading them with getenv (os.Getenv when nil). With tracing
// off it returns a nil provider and a shutdown that does nothing. console is
// where the console exporter writes (os.Stderr when nil). shutdown flushes the
// spans still queued and stops the exporters; call it once, when the process
// ends, after the work it traced has stopped.
//
// It returns INVALID_CONFIG for an unknown exporter or protocol, or a
// malformed OTEL_RESOURCE_ATTRIBUTES.
func FromEnv(ctx context.Context, getenv func(string) string, console io.Writer) (tp trace.TracerProvider, shutdown func(context.Context) error, err error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	off := func(context.Context) error { return nil }
	exporters, err := exportersOf(getenv)
	if err != nil || len(exporters) == 0 {
		return nil, off, err
	}
	var opts []sdktrace.TracerProviderOption
	var closers []func(context.Context) error
	for _, name := range exporters {
		switch name {
		case ExporterConsole:
			if console == nil {
				console = os.Stderr
			}
			opts = append(opts, sdktrace.WithSyncer(NewConsoleExporter(console)))
		case ExporterOTLP:
			exp, err := otlpExporter(ctx, getenv)
			if err != nil {
				for _, c := range closers {
					_ = c(ctx)
				}
				return nil, off, err
			}
			closers = append(closers, exp.Shutdown)
			opts = append(opts, sdktrace.WithBatcher(exp))
		}
	}
	res, err := resource.New(ctx,
		resource.WithTelemetrySDK(),
		resource.WithAttributes(semconv.ServiceName(ServiceName)),
		resource.WithFromEnv(), // OTEL_RESOURCE_ATTRIBUTES, then OTEL_SERVICE_NAME, override the default
	)
	if err != nil {
		for _, c := range closers {
			_ = c(ctx)
		}
		return nil, off, fault.Wrap(fault.InvalidConfig, err, "%s=%q: want key=value pairs separated by commas", EnvResourceAttributes, os.Getenv(EnvResourceAttributes))
	}
	// The sampler is the SDK's: OTEL_TRACES_SAMPLER and _ARG, read by
	// NewTracerProvider, parentbased_always_on by default.
	sdk := sdktrace.NewTracerProvider(append(opts, sdktrace.WithResource(res))...)
	return sdk, func(ctx context.Context) error {
		if err := sdk.Shutdown(ctx); err != nil {
			return fault.Wrap(fault.Unavailable, err, "cannot flush the last spans")
		}
		return nil
	}, nil
}

// exportersOf are the exporters the variables ask for, each once, in order:
// none when tracing is off.
func exportersOf(getenv func(string) string) ([]string, error) {
	if strings.EqualFold(strings.TrimSpace(getenv(EnvSDKDisabled)), "true") {
		return nil, nil
	}
	list := strings.TrimSpace(getenv(EnvTracesExporter))
	if list == "" {
		if getenv(EnvEndpoint) != "" || getenv(EnvTracesEndpoint) != "" {
			return []string{ExporterOTLP}, nil
		}
		return nil, nil
	}
	var out []string
	for _, name := range strings.Split(list, ",") {
		name = strings.ToLower(strings.TrimSpace(name))
		switch name {
		case ExporterOTLP, ExporterConsole:
			if !slices.Contains(out, name) {
				out = append(out, name)
			}
		case ExporterNone, "":
		default:
			return nil, fault.New(fault.InvalidConfig, "%s=%q: unknown exporter %q; accepted: %s, %s, %s (a comma-separated list)",
				EnvTracesExporter, list, name, ExporterOTLP, ExporterConsole, ExporterNone)
		}
	}
	return out, nil
}

// otlpExporter is the OTLP exporter of the protocol the variables name. The
// exporters read the endpoint, headers, timeout, TLS and compression variables
// themselves.
func otlpExporter(ctx context.Context, getenv func(string) string) (sdktrace.SpanExporter, error) {
	variable, protocol := EnvTracesProtocol, strings.TrimSpace(getenv(EnvTracesProtocol))
	if protocol == "" {
		variable, protocol = EnvProtocol, strings.TrimSpace(getenv(EnvProtocol))
	}
	var (
		exp sdktrace.SpanExporter
		err error
	)
	switch strings.ToLower(protocol) {
	case "", ProtocolHTTP:
		exp, err = otlptracehttp.New(ctx)
	case ProtocolGRPC:
		exp, err = otlptracegrpc.New(ctx)
	default:
		return nil, fault.New(fault.InvalidConfig, "%s=%q: unsupported OTLP protocol; accepted: %s (the default), %s", variable, protocol, ProtocolHTTP, ProtocolGRPC)
	}
	if err != nil {
		return nil, fault.Wrap(fault.InvalidConfig, err, "cannot configure the OTLP trace exporter (%s)", protocol)
	}
	return exp, nil
}
