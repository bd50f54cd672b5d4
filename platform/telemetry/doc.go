// Package telemetry builds the process's OpenTelemetry tracer provider from the
// standard OTEL_* variables: the SDK, its exporters (OTLP over HTTP or gRPC, and
// a compact console exporter of ours for dev), the resource and the sampler.
// platform/tracing is the light half (causes, attribute keys) that any package
// may import; this package is the heavy half, and only the commands (cmd) use it.
//
// # Off by default, no cost when off
//
// FromEnv returns a nil provider unless tracing is asked for. A nil provider
// handed to workers.Options.TracerProvider installs nothing: no River
// middleware, no lease-round spans, and the hot paths (Dirty, reconcile, outbox
// append) pay one check of the context for a sampled span.
//
// # The variables
//
//	OTEL_SDK_DISABLED=true                  off, whatever else is set
//	OTEL_TRACES_EXPORTER                    otlp, console, or both (otlp,console); none: off.
//	                                        Unset: otlp if an OTLP endpoint is set, otherwise off
//	                                        (the spec's default is otlp; ours is off)
//	OTEL_EXPORTER_OTLP_ENDPOINT             the collector (http://host:4318 for http/protobuf,
//	OTEL_EXPORTER_OTLP_TRACES_ENDPOINT      host:4317 for grpc); setting either turns otlp on
//	OTEL_EXPORTER_OTLP_TRACES_PROTOCOL      http/protobuf (default) or grpc; the traces one wins
//	OTEL_EXPORTER_OTLP_PROTOCOL
//	OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT, _INSECURE, _CERTIFICATE, _COMPRESSION (and their
//	                                        _TRACES_ forms): read by the OTLP exporters themselves
//	OTEL_SERVICE_NAME                       service.name (default better-compute)
//	OTEL_RESOURCE_ATTRIBUTES                more resource attributes, key=value,key=value
//	OTEL_TRACES_SAMPLER, _ARG               read by the SDK itself (sdk/trace's sampler_env.go):
//	                                        always_on, always_off, traceidratio,
//	                                        parentbased_always_on (the default),
//	                                        parentbased_always_off, parentbased_traceidratio;
//	                                        an unknown one is reported through OpenTelemetry's
//	                                        error handler and the default is used
//	OTEL_BSP_*                              the batch span processor's queue and delays (SDK)
//
// FromEnv decides on and off, the exporters and the protocol from its getenv
// (the command line's environment); the variables the SDK and the OTLP
// exporters read themselves (sampler, endpoint details, resource, OTEL_BSP_*)
// come from the process environment, which is the same thing for the binary.
//
// An unknown exporter or protocol is INVALID_CONFIG naming the variable and
// the accepted values, as is a malformed OTEL_RESOURCE_ATTRIBUTES.
//
// # Exporters
//
// otlp sends through a batch span processor: spans leave in the background and
// the shutdown FromEnv returns flushes what is queued. console writes one line
// per span as it ends (a simple, synchronous processor): its name, duration,
// trace, span and parent ids, link count, status, the bettercompute.*
// attributes and its events with theirs. Only those attributes are printed,
// never a job's arguments, an error's text or a payload.
package telemetry
