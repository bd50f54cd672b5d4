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
	cursor, err := Resolve(ctx, h.db, pos)
	if err != nil {
		h.o.Log.Error().Err(err).Msg("event stream: cannot resolve the start position")
		http.Error(w, "the event log cannot be read now", http.StatusServiceUnavailable)
		return
	}
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
	fmt.Fprintf(bw, "retry: %d\nid: %s\n\n", h.o.Retry.Milliseconds(), cursor)
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
		events, next, scanned, err := Read(ctx, h.db, ReadOptions{After: cursor, Limit: h.o.Batch, Topics: topics})
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, context.Canceled) {
				h.o.Log.Warn().Err(err).Msg("event stream: read failed; the client reconnects with its Last-Event-ID")
			}
			return
		}
		cursor = next
		for _, e := range events {
			data, _ := json.Marshal(SSEData{ID: e.ID.String(), Topic: e.Topic, Key: e.Key, Payload: e.Payload, CreatedAt: e.CreatedAt})
			fmt.Fprintf(bw, "id: %s\ndata: %s\n\n", e.ID, data)
			sent = e.ID
		}
		if len(events) > 0 && !write() {
			return
		}
		if scanned == h.o.Batch {
			poll.Reset(0)
		} else {
			poll.Reset(h.o.Poll)
		}
	}
}
