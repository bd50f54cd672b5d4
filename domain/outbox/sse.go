package outbox

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/bettercompute/bettercompute/platform/pg"
)

// SSEOptions configure the event stream handler.
type SSEOptions struct {
	// Poll is how often an idle stream reads the log again (default 100 ms).
	// A stream that read a full batch reads again at once.
	Poll time.Duration
	// Heartbeat is how often a stream with nothing to send writes a comment
	// line, so proxies keep the connection open (default 15 s).
	Heartbeat time.Duration
	// Batch is the most rows one read scans (default 500).
	Batch int
	// Retry is the reconnection delay the stream asks clients to use (default 1 s).
	Retry time.Duration
	// Log receives read errors.
	Log zerolog.Logger
}

// SSEData is the JSON of one event's data line.
type SSEData struct {
	ID        string          `json:"id"`
	Topic     string          `json:"topic"`
	Key       string          `json:"key"`
	Payload   json.RawMessage `json:"payload"`
	CreatedAt time.Time       `json:"created_at"`
}

// SSEReset is the JSON of a reset record's data line: the events after
// LastEventID up to ResumeAfter were deleted by retention before the stream
// could send them (see NewSSEHandler).
type SSEReset struct {
	// Reason is why: "pruned".
	Reason string `json:"reason"`
	// LastEventID is the position the stream was at: the Last-Event-ID (or
	// from=TXID:SEQ) the client resumed from, or the stream's own position when
	// it fell behind while connected.
	LastEventID string `json:"last_event_id"`
	// ResumeAfter is the retention horizon, the last deleted event: the stream
	// goes on after it, and it is the record's id, so a reconnect resumes there.
	ResumeAfter string `json:"resume_after"`
	// Earliest is the first event still stored after the horizon ("" when
	// none is readable yet).
	Earliest string `json:"earliest"`
}

// ResetPruned is SSEReset.Reason for events deleted by retention.
const ResetPruned = "pruned"

// NewSSEHandler returns the event stream, GET /v1/events: Server-Sent Events
// read from the log with the same rule as sinks (see Read), each with
//
//	id: TXID:SEQ
//	data: {"id":"TXID:SEQ","topic":…,"key":…,"payload":…,"created_at":…}
//
// Query parameters: topics=a,b keeps those topics (default all); from=start,
// end or TXID:SEQ says where a new stream starts (default end); heartbeat=N
// asks for a heartbeat every N seconds (1 to 300). A Last-Event-ID
// header (or last_event_id parameter, for clients that cannot set headers)
// resumes after that event, so a client that reconnects receives every later
// event exactly once, in order. The stream opens with an id line for its
// starting cursor (so a reconnect before any event loses nothing), sends a
// comment line every Heartbeat, and then an id line for rows of other topics it
// has moved past, so a resuming filtered client need not scan them again.
//
// # Events deleted by retention
//
// Retention deletes old events (see Prune) and records the last one it deleted,
// the horizon (see PrunedThrough). A stream that resumes from an explicit cursor
// (Last-Event-ID, last_event_id or from=TXID:SEQ) behind the horizon cannot
// deliver the events it missed, and says so: its first record, after the retry
// line, is
//
//	event: reset
//	id: HORIZON
//	data: {"reason":"pruned","last_event_id":"TXID:SEQ","resume_after":"HORIZON","earliest":"TXID:SEQ"}
//
// (earliest is the first event still stored, "" when none is readable yet), and
// it then streams every event after the horizon. A browser EventSource
// dispatches it as a "reset" event (addEventListener("reset", …); onmessage does
// not see it) and takes HORIZON as its last event id, so a reconnect is not
// reset again; a client that keeps state built from the events should rebuild
// it (from its own source of truth, or from=start: every retained event). A
// stream that falls behind the horizon while connected (a client reading slower
// than retention deletes) gets the same record, with its own position as
// last_event_id, before any event after the gap: every read that returns rows
// reads the horizon in its own snapshot (one lookup of a one-row table, in the
// same statement), and an idle stream checks it at each heartbeat. from=start
// (every retained event) and from=end never reset at the start; from=start
// opens at the horizon.
func NewSSEHandler(db pg.DBTX, o SSEOptions) http.Handler {
	if o.Poll <= 0 {
		o.Poll = 100 * time.Millisecond
	}
	if o.Heartbeat <= 0 {
		o.Heartbeat = 15 * time.Second
	}
	if o.Batch <= 0 {
		o.Batch = 500
	}
	if o.Retry <= 0 {
		o.Retry = time.Second
	}
	return &sseHandler{db: db, o: o}
}

type sseHandler struct {
	db pg.DBTX
	o  SSEOptions
}

// ServeHTTP streams the events: see NewSSEHandler.
func (h *sseHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var topics []string
	for _, v := range q["topics"] {
		for _, t := range strings.Split(v, ",") {
			if t = strings.TrimSpace(t); t != "" {
				topics = append(topics, t)
			}
		}
	}
	pos := End
	if v := q.Get("from"); v != "" {
		p, err := ParsePosition(v)
		if err != nil {
			http.Error(w, "from: "+err.Error(), http.StatusBadRequest)
			return
		}
		pos = p
	}
	last := r.Header.Get("Last-Event-ID")
	if last == "" {
		last = q.Get("last_event_id")
	}
	if last != "" {
		c, err := ParseCursor(last)
		if err != nil {
			http.Error(w, "Last-Event-ID: "+err.Error(), http.StatusBadRequest)
			return
		}
		pos = After(c)
	}
	every := h.o.Heartbeat
	if v := q.Get("heartbeat"); v != "" {
		secs, err := strconv.Atoi(v)
		if err != nil || secs < 1 || secs > 300 {
			http.Error(w, "heartbeat: want whole seconds from 1 to 300", http.StatusBadRequest)
			return
		}
		every = time.Duration(secs) * time.Second
	}
	ctx := r.Context()
	cursor, reset, err := h.start(ctx, pos)
	if err != nil {
		h.o.Log.Error().Err(err).Msg("event stream: cannot resolve the start position")
		http.Error(w, "the event log cannot be read now", http.StatusServiceUnavailable)
		return
	}
	// A stream from the start is at "every retained event" until its first read
	// returns a row: it follows the horizon silently until then.
	floating := pos.kind == posStart
	rc := http.NewResponseController(w)
	hdr := w.Header()
	hdr.Set("Content-Type", "text/event-stream")
	hdr.Set("Cache-Control", "no-cache")
	hdr.Set("Connection", "keep-alive")
	hdr.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriterSize(w, 16<<10)
	write := func() bool {
		// A stream may outlive any server write timeout; a stuck client gets 30 s.
		_ = rc.SetWriteDeadline(time.Now().Add(30 * time.Second))
		if bw.Flush() != nil {
			return false
		}
		return rc.Flush() == nil
	}
	fmt.Fprintf(bw, "retry: %d\n", h.o.Retry.Milliseconds())
	if reset != nil {
		writeReset(bw, *reset)
	} else {
		fmt.Fprintf(bw, "id: %s\n\n", cursor)
	}
	if !write() {
		return
	}
	sent := cursor
	heartbeat := time.NewTicker(every)
	defer heartbeat.Stop()
	poll := time.NewTimer(0)
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-heartbeat.C:
			// An idle stream learns here that retention passed it.
			through, err := PrunedThrough(ctx, h.db)
			if err != nil {
				h.warn(ctx, err, "event stream: cannot read the retention horizon; the client reconnects with its Last-Event-ID")
				return
			}
			switch {
			case !cursor.Less(through):
			case floating:
				cursor = through
			default:
				hz, err := ReadHorizon(ctx, h.db)
				if err != nil {
					h.warn(ctx, err, "event stream: cannot read the retention horizon; the client reconnects with its Last-Event-ID")
					return
				}
				writeReset(bw, SSEReset{Reason: ResetPruned, LastEventID: cursor.String(), ResumeAfter: hz.Through.String(), Earliest: cursorText(hz.Earliest)})
				cursor, sent = hz.Through, hz.Through
				if !write() {
					return
				}
				continue
			}
			if cursor != sent {
				fmt.Fprintf(bw, ": heartbeat\nid: %s\n\n", cursor)
				sent = cursor
			} else {
				fmt.Fprint(bw, ": heartbeat\n\n")
			}
			if !write() {
				return
			}
			continue
		case <-poll.C:
		}
		b, err := read(ctx, h.db, ReadOptions{After: cursor, Limit: h.o.Batch, Topics: topics}, true)
		if err != nil {
			h.warn(ctx, err, "event stream: read failed; the client reconnects with its Last-Event-ID")
			return
		}
		events := b.events
		if b.scanned > 0 && cursor.Less(b.horizon) && !floating {
			// Retention deleted events after the cursor before this read: say
			// so before anything that follows the gap.
			writeReset(bw, SSEReset{Reason: ResetPruned, LastEventID: cursor.String(), ResumeAfter: b.horizon.String(), Earliest: b.first.String()})
			sent = b.horizon
			events = events[:0:0]
			for _, e := range b.events {
				if b.horizon.Less(e.ID) {
					events = append(events, e)
				}
			}
		}
		if b.scanned > 0 {
			floating = false
		}
		cursor = b.next
		for _, e := range events {
			data, _ := json.Marshal(SSEData{ID: e.ID.String(), Topic: e.Topic, Key: e.Key, Payload: e.Payload, CreatedAt: e.CreatedAt})
			fmt.Fprintf(bw, "id: %s\ndata: %s\n\n", e.ID, data)
			sent = e.ID
		}
		if bw.Buffered() > 0 && !write() {
			return
		}
		if b.scanned == h.o.Batch {
			poll.Reset(0)
		} else {
			poll.Reset(h.o.Poll)
		}
	}
}

// start resolves where a stream starts. An explicit cursor behind the retention
// horizon starts at the horizon, with the reset record to send first.
//
// It reads in a read-only transaction of its own because InTx's BEGIN retries
// on a fresh connection when the pooled one turns out to be dead (after a server
// restart, say): a stream that cannot start answers 503, which a browser
// EventSource does not retry.
func (h *sseHandler) start(ctx context.Context, pos Position) (Cursor, *SSEReset, error) {
	var (
		cursor Cursor
		reset  *SSEReset
	)
	err := pg.InTx(ctx, h.db, &pg.TxOptions{ReadOnly: true}, func(tx pgx.Tx) error {
		switch pos.kind {
		case posStart:
			// Every retained event: nothing at or before the horizon is stored.
			c, err := PrunedThrough(ctx, tx)
			cursor = c
			return err
		case posCursor:
			hz, err := ReadHorizon(ctx, tx)
			if err != nil {
				return err
			}
			cursor = pos.cursor
			if hz.Lost(pos.cursor) {
				cursor = hz.Through
				reset = &SSEReset{Reason: ResetPruned, LastEventID: pos.cursor.String(),
					ResumeAfter: hz.Through.String(), Earliest: cursorText(hz.Earliest)}
			}
			return nil
		}
		c, err := Resolve(ctx, tx, pos)
		cursor = c
		return err
	})
	return cursor, reset, err
}

// warn logs a failed read, unless the client went away.
func (h *sseHandler) warn(ctx context.Context, err error, msg string) {
	if ctx.Err() == nil && !errors.Is(err, context.Canceled) {
		h.o.Log.Warn().Err(err).Msg(msg)
	}
}

// writeReset writes a reset record: its id is the horizon the stream resumes
// after.
func writeReset(bw *bufio.Writer, r SSEReset) {
	data, _ := json.Marshal(r)
	fmt.Fprintf(bw, "event: reset\nid: %s\ndata: %s\n\n", r.ResumeAfter, data)
}

// cursorText is c's text, or "" for the zero Cursor (no event).
func cursorText(c Cursor) string {
	if c.IsZero() {
		return ""
	}
	return c.String()
}
