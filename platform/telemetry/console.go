package telemetry

import (
	"context"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// attrPrefix is the prefix of the attributes the console prints (ours); it
// prints them without it.
const attrPrefix = "bettercompute."

// ConsoleExporter writes one line per span, as it ends:
//
//	span bettercompute.reconcile 4.1ms trace=4bf9… span=00f0… parent=53995c… links=1 status=ok shard=3 lease.epoch=2 outcome=completed
//	span bettercompute.lease.round 2.3ms trace=… span=… parent=- links=0 status=unset lease.owner=host/0#4 | lease{lease=shard/0 lease.action=renewed lease.epoch=2 shard=0}
//
// Of the attributes it prints only ours (bettercompute.*, the prefix left out),
// then the span's events after a |, each with its own: never a job's
// arguments, an error's text or a payload, which none of them hold.
type ConsoleExporter struct {
	mu      sync.Mutex
	w       io.Writer
	stopped bool
}

// NewConsoleExporter returns a ConsoleExporter writing to w.
func NewConsoleExporter(w io.Writer) *ConsoleExporter { return &ConsoleExporter{w: w} }

// ExportSpans implements sdktrace.SpanExporter: one line (one Write) per span.
func (e *ConsoleExporter) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stopped {
		return nil
	}
	for _, s := range spans {
		if _, err := io.WriteString(e.w, consoleLine(s)); err != nil {
			return err
		}
	}
	return nil
}

// Shutdown implements sdktrace.SpanExporter: nothing is written after it.
func (e *ConsoleExporter) Shutdown(context.Context) error {
	e.mu.Lock()
	e.stopped = true
	e.mu.Unlock()
	return nil
}

// consoleLine is span s as ConsoleExporter prints it, newline included.
func consoleLine(s sdktrace.ReadOnlySpan) string {
	var b strings.Builder
	sc := s.SpanContext()
	parent := "-"
	if p := s.Parent(); p.IsValid() {
		parent = p.SpanID().String()
	}
	b.WriteString("span ")
	b.WriteString(s.Name())
	b.WriteByte(' ')
	b.WriteString(s.EndTime().Sub(s.StartTime()).Round(time.Microsecond).String())
	b.WriteString(" trace=")
	b.WriteString(sc.TraceID().String())
	b.WriteString(" span=")
	b.WriteString(sc.SpanID().String())
	b.WriteString(" parent=")
	b.WriteString(parent)
	b.WriteString(" links=")
	b.WriteString(strconv.Itoa(len(s.Links())))
	b.WriteString(" status=")
	b.WriteString(statusName(s.Status().Code))
	writeAttrs(&b, s.Attributes())
	if ev := s.Events(); len(ev) > 0 {
		b.WriteString(" |")
		for _, e := range ev {
			b.WriteByte(' ')
			b.WriteString(strings.TrimPrefix(e.Name, attrPrefix))
			b.WriteByte('{')
			inner := strings.Builder{}
			writeAttrs(&inner, e.Attributes)
			b.WriteString(strings.TrimPrefix(inner.String(), " "))
			b.WriteByte('}')
		}
	}
	b.WriteByte('\n')
	return b.String()
}

func statusName(c codes.Code) string {
	switch c {
	case codes.Ok:
		return "ok"
	case codes.Error:
		return "error"
	default:
		return "unset"
	}
}

// writeAttrs writes " key=value" for each of our attributes in attrs.
func writeAttrs(b *strings.Builder, attrs []attribute.KeyValue) {
	for _, kv := range attrs {
		k, ok := strings.CutPrefix(string(kv.Key), attrPrefix)
		if !ok {
			continue
		}
		v := kv.Value.Emit()
		if v == "" || strings.ContainsAny(v, " =\"{}|") {
			v = strconv.Quote(v)
		}
		b.WriteByte(' ')
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(v)
	}
}
