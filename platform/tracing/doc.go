// Package tracing carries the OpenTelemetry trace context of an application's
// request to the work it causes, and names the attributes every span of ours
// carries. It is the light half of tracing (only the OpenTelemetry API, no SDK,
// no exporter), so package jobs and the domain packages, which applications
// import, can use it; platform/telemetry builds the SDK's provider from the
// OTEL_* variables.
//
// # What travels, and how
//
// A cause is the W3C traceparent of the span in the context of the call that
// caused work ("00-<trace id>-<span id>-<flags>"), stored beside the work in the
// same transaction:
//
//	application request ──Dirty/compute_mark_dirty──▶ compute_dirty.trace_links (every caller's, capped)
//	                     ──StartTx/SignalTx──────────▶ the step job's metadata, the signal's row
//	                     ──outbox AppendTx───────────▶ the event's row
//
// The span of the work that follows starts with CausedBy: its parent is the
// first cause (so the request and its work are one trace) and every cause is a
// span link (so coalesced callers are all there, not only the first).
//
// # Invariants
//
//   - No cause is stored when the caller's context has no valid, sampled span:
//     with tracing off a call costs one check and writes NULL.
//   - A cause is only a trace id, a span id and flags: never a payload, a key's
//     value or a secret (tracestate and baggage are not stored).
//   - At most MaxCauses causes are kept per piece of work; later ones are dropped.
//   - A malformed stored cause is ignored, never an error: tracing never fails work.
package tracing
