package cli

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

	"github.com/bettercompute/bettercompute/domain/outbox"
	"github.com/bettercompute/bettercompute/platform/pg"
)

// eventsData is the JSON of one event's data line.
type eventsData struct {
	ID        string          `json:"id"`
	Topic     string          `json:"topic"`
	Key       string          `json:"key"`
	Payload   json.RawMessage `json:"payload"`
	CreatedAt time.Time       `json:"created_at"`
}

// eventsReset is the JSON of a reset record's data line: the events after
// LastEventID up to ResumeAfter were deleted by retention before the stream
// could send them (see newEventsHandler).
type eventsReset struct {
	// Reason is why: "pruned" (resetPruned).
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

// resetPruned is eventsReset.Reason for events deleted by retention.
const resetPruned = "pruned"

// eventsOptions tune the event stream; a zero field takes its default.
type eventsOptions struct {
	// poll is how often an idle stream reads the log again (default 100 ms).
	// A stream that read a full batch reads again at once.
	poll time.Duration
	// heartbeat is how often a stream with nothing to send writes a comment
	// line, so proxies keep the connection open (default 15 s).
	heartbeat time.Duration
	// batch is the most rows one read scans (default 500).
	batch int
	// retry is the reconnection delay the stream asks clients to use (default 1 s).
	retry time.Duration
}

// newEventsHandler returns the event stream, GET /v1/events: Server-Sent
// Events read from the outbox's event log with the same rule as sinks (see
// outbox.Read and outbox.Tail), each with
//
//	id: TXID:SEQ
//	data: {"id":"TXID:SEQ","topic":…,"key":…,"payload":…,"created_at":…}
//
// Query parameters: topics=a,b keeps those topics (default all); from=start,
// end or TXID:SEQ says where a new stream starts (default end); heartbeat=N
// asks for a heartbeat every N seconds (1 to 300, default 15). A Last-Event-ID
// header (or last_event_id parameter, for clients that cannot set headers)
// resumes after that event, so a client that reconnects receives every later
// event exactly once, in order. The stream opens with a retry line (1 s) and an
// id line for its starting cursor (so a reconnect before any event loses
// nothing), sends a comment line every heartbeat, and then an id line for rows
// of other topics it has moved past, so a resuming filtered client need not
// scan them again. Read errors go to log.
//
// # Events deleted by retention
//
// Retention deletes old events (see outbox.Prune) and records the last one it
// deleted, the horizon (see outbox.PrunedThrough). A stream that resumes from
// an explicit cursor (Last-Event-ID, last_event_id or from=TXID:SEQ) behind the
// horizon cannot deliver the events it missed, and says so: its first record,
// after the retry line, is
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
// reads the horizon in its own snapshot (see outbox.Tail.Next), and an idle
// stream checks it at each heartbeat (outbox.Tail.CheckHorizon). from=start
// (every retained event) and from=end never reset at the start; from=start
// opens at the horizon.
func newEventsHandler(db *pg.Pool, log zerolog.Logger) http.Handler {
	return newEventsHandlerWith(db, log, eventsOptions{})
}

// newEventsHandlerWith is newEventsHandler with options, for tests.
func newEventsHandlerWith(db *pg.Pool, log zerolog.Logger, o eventsOptions) *eventsHandler {
	if o.poll <= 0 {
		o.poll = 100 * time.Millisecond
	}
	if o.heartbeat <= 0 {
		o.heartbeat = 15 * time.Second
	}
	if o.batch <= 0 {
		o.batch = 500
	}
	if o.retry <= 0 {
		o.retry = time.Second
	}
	return &eventsHandler{db: db, log: log, o: o}
}

type eventsHandler struct {
	db  *pg.Pool
	log zerolog.Logger
	o   eventsOptions
}

// ServeHTTP streams the events: see newEventsHandler. It parses the request
// (400 if malformed), opens the stream (503 if the log cannot be read), and runs it.
func (h *eventsHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	req, err := h.parseRequest(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	ctx := r.Context()
	tail, gap, err := h.open(ctx, req.pos, req.topics)
	if err != nil {
		h.log.Error().Err(err).Msg("event stream: cannot resolve the start position")
		http.Error(w, "the event log cannot be read now", http.StatusServiceUnavailable)
		return
	}
	s := h.start(w, tail, gap)
	if !s.flush() {
		return
	}
	s.run(ctx, req.heartbeat)
}

// eventsRequest is what one request asks of the stream.
type eventsRequest struct {
	topics    []string        // topics to keep; nil keeps all
	pos       outbox.Position // where the stream starts
	heartbeat time.Duration   // how often an idle stream writes a heartbeat
}

// parseRequest reads r's query and Last-Event-ID header into an eventsRequest.
// Its error is the text of the 400 answer.
func (h *eventsHandler) parseRequest(r *http.Request) (eventsRequest, error) {
	q := r.URL.Query()
	req := eventsRequest{pos: outbox.End, heartbeat: h.o.heartbeat}
	for _, v := range q["topics"] {
		for _, t := range strings.Split(v, ",") {
			if t = strings.TrimSpace(t); t != "" {
				req.topics = append(req.topics, t)
			}
		}
	}
	if v := q.Get("from"); v != "" {
		p, err := outbox.ParsePosition(v)
		if err != nil {
			return eventsRequest{}, errors.New("from: " + err.Error())
		}
		req.pos = p
	}
	last := r.Header.Get("Last-Event-ID")
	if last == "" {
		last = q.Get("last_event_id")
	}
	if last != "" {
		c, err := outbox.ParseCursor(last)
		if err != nil {
			return eventsRequest{}, errors.New("Last-Event-ID: " + err.Error())
		}
		req.pos = outbox.After(c)
	}
	if v := q.Get("heartbeat"); v != "" {
		secs, err := strconv.Atoi(v)
		if err != nil || secs < 1 || secs > 300 {
			return eventsRequest{}, errors.New("heartbeat: want whole seconds from 1 to 300")
		}
		req.heartbeat = time.Duration(secs) * time.Second
	}
	return req, nil
}

// eventsStream is one open stream: where it writes and the last id its client has.
type eventsStream struct {
	h    *eventsHandler
	tail *outbox.Tail
	rc   *http.ResponseController
	bw   *bufio.Writer
	sent outbox.Cursor // the last id the client has
}

// start writes the stream's headers and buffers its opening: the retry line,
// then the reset record of gap, or else an id line for the starting cursor.
func (h *eventsHandler) start(w http.ResponseWriter, tail *outbox.Tail, gap *outbox.Gap) *eventsStream {
	rc := http.NewResponseController(w)
	hdr := w.Header()
	hdr.Set("Content-Type", "text/event-stream")
	hdr.Set("Cache-Control", "no-cache")
	hdr.Set("Connection", "keep-alive")
	hdr.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	s := &eventsStream{h: h, tail: tail, rc: rc, bw: bufio.NewWriterSize(w, 16<<10)}
	fmt.Fprintf(s.bw, "retry: %d\n", h.o.retry.Milliseconds())
	if gap != nil {
		writeEventsReset(s.bw, *gap)
	} else {
		fmt.Fprintf(s.bw, "id: %s\n\n", tail.Cursor())
	}
	s.sent = tail.Cursor()
	return s
}

// run is the streaming loop: it reads the log whenever the poll timer fires (at
// once again after a full batch) and writes a heartbeat at every tick, until the
// client goes away or a read or write fails.
func (s *eventsStream) run(ctx context.Context, every time.Duration) {
	heartbeat := time.NewTicker(every)
	defer heartbeat.Stop()
	poll := time.NewTimer(0)
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-heartbeat.C:
			if !s.heartbeat(ctx) {
				return
			}
		case <-poll.C:
			full, ok := s.poll(ctx)
			if !ok {
				return
			}
			if full {
				poll.Reset(0)
			} else {
				poll.Reset(s.h.o.poll)
			}
		}
	}
}

// heartbeat checks the retention horizon (an idle stream learns here that
// retention passed it) and writes a reset record, or else a heartbeat; false
// ends the stream.
func (s *eventsStream) heartbeat(ctx context.Context) bool {
	gap, err := s.tail.CheckHorizon(ctx, s.h.db)
	if err != nil {
		s.h.warn(ctx, err, "event stream: cannot read the retention horizon; the client reconnects with its Last-Event-ID")
		return false
	}
	if gap != nil {
		s.writeReset(*gap)
	} else {
		s.writeHeartbeat()
	}
	return s.flush()
}

// poll reads the next batch and writes it; full says the read was a full batch
// (read again at once), false ok ends the stream.
func (s *eventsStream) poll(ctx context.Context) (full, ok bool) {
	b, err := s.tail.Next(ctx, s.h.db)
	if err != nil {
		s.h.warn(ctx, err, "event stream: read failed; the client reconnects with its Last-Event-ID")
		return false, false
	}
	s.writeBatch(b)
	if s.bw.Buffered() > 0 && !s.flush() {
		return false, false
	}
	return b.Scanned == s.h.o.batch, true
}

// writeBatch buffers b: its reset record first, when retention deleted events
// after the cursor before this read, then its events.
func (s *eventsStream) writeBatch(b outbox.TailBatch) {
	if b.Gap != nil {
		s.writeReset(*b.Gap)
	}
	for _, e := range b.Events {
		data, _ := json.Marshal(eventsData{ID: e.ID.String(), Topic: e.Topic, Key: e.Key, Payload: e.Payload, CreatedAt: e.CreatedAt})
		fmt.Fprintf(s.bw, "id: %s\ndata: %s\n\n", e.ID, data)
		s.sent = e.ID
	}
}

// writeReset buffers the reset record of gap; the client then has its horizon.
func (s *eventsStream) writeReset(gap outbox.Gap) {
	writeEventsReset(s.bw, gap)
	s.sent = gap.Through
}

// writeHeartbeat buffers a heartbeat comment, with an id line when the tail has
// moved past rows of other topics since the last id the client has.
func (s *eventsStream) writeHeartbeat() {
	if c := s.tail.Cursor(); c != s.sent {
		fmt.Fprintf(s.bw, ": heartbeat\nid: %s\n\n", c)
		s.sent = c
	} else {
		fmt.Fprint(s.bw, ": heartbeat\n\n")
	}
}

// flush sends what is buffered; false when the client cannot take it. A stream
// may outlive any server write timeout; a stuck client gets 30 s.
func (s *eventsStream) flush() bool {
	_ = s.rc.SetWriteDeadline(time.Now().Add(30 * time.Second))
	if s.bw.Flush() != nil {
		return false
	}
	return s.rc.Flush() == nil
}

// open opens the stream's Tail at pos (see outbox.OpenTail), with the gap to
// report first when pos is an explicit cursor behind the retention horizon.
//
// It reads in a read-only transaction of its own because InTx's BEGIN retries
// on a fresh connection when the pooled one turns out to be dead (after a server
// restart, say): a stream that cannot start answers 503, which a browser
// EventSource does not retry.
func (h *eventsHandler) open(ctx context.Context, pos outbox.Position, topics []string) (*outbox.Tail, *outbox.Gap, error) {
	var (
		tail *outbox.Tail
		gap  *outbox.Gap
	)
	err := pg.InTxWith(ctx, h.db, pg.TxOptions{ReadOnly: true}, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		tail, gap, err = outbox.OpenTail(ctx, tx, pos, outbox.TailOptions{Topics: topics, Limit: h.o.batch})
		return err
	})
	return tail, gap, err
}

// warn logs a failed read, unless the client went away.
func (h *eventsHandler) warn(ctx context.Context, err error, msg string) {
	if ctx.Err() == nil && !errors.Is(err, context.Canceled) {
		h.log.Warn().Err(err).Msg(msg)
	}
}

// writeEventsReset writes the reset record of gap: its id is the horizon the
// stream resumes after.
func writeEventsReset(bw *bufio.Writer, gap outbox.Gap) {
	data, _ := json.Marshal(eventsReset{Reason: resetPruned, LastEventID: gap.After.String(),
		ResumeAfter: gap.Through.String(), Earliest: eventsCursorText(gap.Earliest)})
	fmt.Fprintf(bw, "event: reset\nid: %s\ndata: %s\n\n", gap.Through, data)
}

// eventsCursorText is c's text, or "" for the zero Cursor (no event).
func eventsCursorText(c outbox.Cursor) string {
	if c.IsZero() {
		return ""
	}
	return c.String()
}
