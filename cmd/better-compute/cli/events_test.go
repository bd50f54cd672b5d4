package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/outbox"
	"github.com/bettercompute/bettercompute/domain/outbox/outboxtest"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

// pruneEvents prunes until want events are deleted in all (the read rule may
// hold rows of just-ended transactions back for a moment), and fails if more
// were.
func pruneEvents(t testing.TB, db pg.DBTX, want int) {
	t.Helper()
	deleted := 0
	deadline := time.Now().Add(20 * time.Second)
	for deleted < want {
		n, err := outbox.Prune(context.Background(), db, outbox.PruneOptions{})
		require.NoError(t, err)
		deleted += n
		if time.Now().After(deadline) {
			t.Fatalf("pruned %d events, want %d", deleted, want)
		}
		if n == 0 {
			time.Sleep(5 * time.Millisecond)
		}
	}
	require.Equal(t, want, deleted)
}

// sseRecord is one dispatched SSE record: an event (ID and Data, and Event
// when it names a type, as reset records do), an id-only record (Data empty),
// or a comment. Retry is the value of a retry: line in the record.
type sseRecord struct {
	Event   string
	ID      string
	Data    string
	Comment string
	Retry   string
}

// parseSSE reads SSE records from r into out until r ends.
func parseSSE(r io.Reader, out chan<- sseRecord) {
	defer close(out)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var cur sseRecord
	var data []string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			cur.Data = strings.Join(data, "\n")
			out <- cur
			cur, data = sseRecord{}, nil
		case strings.HasPrefix(line, ":"):
			cur.Comment = strings.TrimSpace(line[1:])
		case strings.HasPrefix(line, "event:"):
			cur.Event = strings.TrimSpace(line[6:])
		case strings.HasPrefix(line, "id:"):
			cur.ID = strings.TrimSpace(line[3:])
		case strings.HasPrefix(line, "retry:"):
			cur.Retry = strings.TrimSpace(line[6:])
		case strings.HasPrefix(line, "data:"):
			data = append(data, strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " "))
		}
	}
}

// ssePipeWriter is an http.ResponseWriter streaming into a pipe: the test
// client reads what the handler writes as it flushes, without a network.
type ssePipeWriter struct {
	hdr    http.Header
	status int
	w      *io.PipeWriter
}

func (p *ssePipeWriter) Header() http.Header         { return p.hdr }
func (p *ssePipeWriter) WriteHeader(code int)        { p.status = code }
func (p *ssePipeWriter) Write(b []byte) (int, error) { return p.w.Write(b) }
func (p *ssePipeWriter) Flush()                      {}

// newTestEventsHandler is the event stream on db with options o, logging to t.
func newTestEventsHandler(t *testing.T, db *pg.Pool, o eventsOptions) *eventsHandler {
	t.Helper()
	return newEventsHandlerWith(db, zerolog.New(zerolog.NewTestWriter(t)), o)
}

// sseClient connects to h in-process, optionally resuming after lastID, and
// returns the records and a disconnect function.
func sseClient(t *testing.T, h http.Handler, query, lastID string) (<-chan sseRecord, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req := httptest.NewRequest(http.MethodGet, "/v1/events?"+query, nil).WithContext(ctx)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	pr, pw := io.Pipe()
	w := &ssePipeWriter{hdr: http.Header{}, w: pw}
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.ServeHTTP(w, req)
		pw.Close()
	}()
	out := make(chan sseRecord, 1024)
	go parseSSE(pr, out)
	return out, func() {
		cancel()
		pr.Close()
		<-done
	}
}

// sseConnect opens the event stream over a real HTTP connection and returns
// its records and a function that drops the connection.
func sseConnect(t *testing.T, url, user, pass, lastID string) (<-chan sseRecord, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	require.NoError(t, err)
	req.SetBasicAuth(user, pass)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	out := make(chan sseRecord, 1024)
	go parseSSE(resp.Body, out)
	return out, func() { cancel(); resp.Body.Close() }
}

// nextSSEEvent returns the next record with data, skipping comments and
// id-only records; lastID tracks the id the client would resume from.
func nextSSEEvent(t *testing.T, in <-chan sseRecord, lastID *string) sseRecord {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		select {
		case r, ok := <-in:
			require.True(t, ok, "stream ended")
			if r.ID != "" {
				*lastID = r.ID
			}
			if r.Data != "" {
				return r
			}
		case <-timeout:
			t.Fatal("timed out waiting for an event")
		}
	}
}

// nextSSEData is nextSSEEvent's data, checked against its id.
func nextSSEData(t *testing.T, in <-chan sseRecord, lastID *string) eventsData {
	t.Helper()
	r := nextSSEEvent(t, in, lastID)
	require.Empty(t, r.Event, "no reset: %+v", r)
	var d eventsData
	require.NoError(t, json.Unmarshal([]byte(r.Data), &d))
	require.Equal(t, r.ID, d.ID)
	return d
}

// recvSSE returns the next record of any kind.
func recvSSE(t *testing.T, in <-chan sseRecord) sseRecord {
	t.Helper()
	select {
	case r, ok := <-in:
		require.True(t, ok, "stream ended")
		return r
	case <-time.After(20 * time.Second):
		t.Fatal("timed out waiting for a record")
	}
	return sseRecord{}
}

// requireSSEReset checks that r is a reset record resuming after horizon.
func requireSSEReset(t *testing.T, r sseRecord, lastEventID, horizon, earliest string) {
	t.Helper()
	require.Equal(t, "reset", r.Event, "%+v", r)
	require.Equal(t, horizon, r.ID, "the id is the horizon: a reconnect resumes there")
	var d eventsReset
	require.NoError(t, json.Unmarshal([]byte(r.Data), &d))
	require.Equal(t, eventsReset{Reason: "pruned", LastEventID: lastEventID, ResumeAfter: horizon, Earliest: earliest}, d)
}

// sseKeysUntil reads events until the one keyed last, failing on any reset,
// and returns their keys.
func sseKeysUntil(t *testing.T, in <-chan sseRecord, last string) []string {
	t.Helper()
	var id string
	var out []string
	for {
		d := nextSSEData(t, in, &id)
		out = append(out, d.Key)
		if d.Key == last {
			return out
		}
	}
}

// startServeForEvents runs `better-compute serve` in-process with environ
// until the test ends, logging to t, and returns its base URL once serve
// prints it.
func startServeForEvents(t *testing.T, environ []string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	code := make(chan int, 1)
	go func() {
		code <- Run(ctx, App{}, []string{"serve"}, Env{Stdout: pw, Stderr: zerolog.NewTestWriter(t), Environ: environ})
		pw.Close()
	}()
	t.Cleanup(func() { cancel(); <-code })
	url := make(chan string, 1)
	go func() {
		defer close(url)
		sc := bufio.NewScanner(pr)
		for sent := false; sc.Scan(); {
			if _, rest, ok := strings.Cut(sc.Text(), "River UI: "); ok && !sent {
				url <- strings.Fields(rest)[0]
				sent = true
			}
		}
	}()
	select {
	case u, ok := <-url:
		require.True(t, ok, "serve exited before serving (see its log)")
		return u
	case <-time.After(60 * time.Second):
		t.Fatal("serve printed no URL")
	}
	return ""
}

// TestEventStreamOverHTTP: serve's /v1/events, behind its credentials, over a
// real connection: a client that drops the connection and reconnects with
// Last-Event-ID receives every later event exactly once, in order.
func TestEventStreamOverHTTP(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	const user, pass = "ops", "events-Pa55word"
	base := startServeForEvents(t, []string{
		"BETTER_COMPUTE_DATABASE_URL=" + db.URL, "BETTER_COMPUTE_LISTEN=127.0.0.1:0",
		"BETTER_COMPUTE_AUTH_USER=" + user, "BETTER_COMPUTE_AUTH_PASSWORD=" + pass,
		"BETTER_COMPUTE_LOG_LEVEL=warn", "BETTER_COMPUTE_READ_ONLY=true",
	})
	add := func(topic, key string) { outboxtest.Append(t, db.Pool, topic, key, map[string]string{"key": key}) }
	for _, k := range []string{"a", "b", "c"} {
		add("orders", k)
		add("noise", k)
	}

	resp, err := http.Get(base + "v1/events")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "behind serve's credentials")

	url := base + "v1/events?topics=orders&from=start&heartbeat=1"
	recs, drop := sseConnect(t, url, user, pass, "")
	// docs/outbox.md: the stream opens with "retry: 1000" (a client reconnects
	// after 1 s), then the id it starts from, before any event.
	first := recvSSE(t, recs)
	require.Equal(t, "1000", first.Retry, "the opening record's retry: line, %+v", first)
	require.NotEmpty(t, first.ID, "then the id it starts from")
	require.Empty(t, first.Data)
	var last string
	var got []string
	for i := 0; i < 2; i++ {
		got = append(got, nextSSEData(t, recs, &last).Key)
	}
	drop()
	for _, k := range []string{"d", "e", "f"} {
		add("orders", k)
		add("noise", k)
	}
	recs, drop = sseConnect(t, url, user, pass, last)
	defer drop()
	add("orders", "end")
	for got[len(got)-1] != "end" {
		got = append(got, nextSSEData(t, recs, &last).Key)
	}
	require.Equal(t, []string{"a", "b", "c", "d", "e", "f", "end"}, got)

	// An idle stream sends heartbeats (?heartbeat=1: every second).
	timeout := time.After(30 * time.Second)
	for done := false; !done; {
		select {
		case r := <-recs:
			require.Empty(t, r.Data)
			done = r.Comment == "heartbeat"
		case <-timeout:
			t.Fatal("no heartbeat")
		}
	}
}

func TestEventsResumesFromLastEventIDExactlyOnce(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	h := newTestEventsHandler(t, db.Pool, eventsOptions{poll: 10 * time.Millisecond, heartbeat: 25 * time.Millisecond, batch: 4})
	for i := 0; i < 5; i++ {
		outboxtest.Append(t, db.Pool, "orders", "o"+string(rune('0'+i)), map[string]int{"n": i})
	}
	outboxtest.Append(t, db.Pool, "other", "x", nil)

	recs, disconnect := sseClient(t, h, "topics=orders&from=start", "")
	var last string
	var got []string
	for i := 0; i < 3; i++ {
		d := nextSSEData(t, recs, &last)
		require.Equal(t, "orders", d.Topic)
		require.JSONEq(t, `{"n":`+string(rune('0'+i))+`}`, string(d.Payload))
		got = append(got, d.Key)
	}
	disconnect()

	// More events arrive while the client is away, in several transactions.
	for i := 5; i < 9; i++ {
		outboxtest.Append(t, db.Pool, "orders", "o"+string(rune('0'+i)), map[string]int{"n": i})
		outboxtest.Append(t, db.Pool, "other", "x", nil)
	}
	recs, disconnect = sseClient(t, h, "topics=orders", last)
	defer disconnect()
	outboxtest.Append(t, db.Pool, "orders", "sentinel", nil)
	got = append(got, sseKeysUntil(t, recs, "sentinel")...)
	require.Equal(t, []string{"o0", "o1", "o2", "o3", "o4", "o5", "o6", "o7", "o8", "sentinel"}, got, "every event once, in order")

	// Heartbeats keep an idle stream alive, and carry the id past rows of other
	// topics, so a resuming client need not scan them again.
	outboxtest.Append(t, db.Pool, "other", "y", nil)
	var y string
	require.NoError(t, db.QueryRow(context.Background(), `SELECT txid::text || ':' || seq FROM compute_events WHERE key = 'y'`).Scan(&y))
	timeout := time.After(20 * time.Second)
	for done := false; !done; {
		select {
		case r := <-recs:
			require.Empty(t, r.Data, "no event of another topic")
			done = r.Comment == "heartbeat" && r.ID == y
		case <-timeout:
			t.Fatal("no heartbeat with the id of the skipped row")
		}
	}
}

func TestEventsStartAtTheEndAndRejectBadIDs(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	h := newTestEventsHandler(t, db.Pool, eventsOptions{poll: 10 * time.Millisecond})
	outboxtest.Append(t, db.Pool, "t", "old", nil)
	outboxtest.ReadN(t, db.Pool, outbox.Cursor{}, 1)

	// Without a position the stream starts at the end, and says where (an
	// id-only record), so a reconnect before any event loses nothing.
	recs, disconnect := sseClient(t, h, "", "")
	first := recvSSE(t, recs)
	require.NotEmpty(t, first.ID)
	require.Empty(t, first.Data)
	disconnect()
	outboxtest.Append(t, db.Pool, "t", "new", nil)
	recs, disconnect = sseClient(t, h, "", first.ID)
	defer disconnect()
	var last string
	r := nextSSEEvent(t, recs, &last)
	require.Contains(t, r.Data, `"key":"new"`)

	for _, tc := range []struct{ query, lastID string }{{"from=middle", ""}, {"", "12"}, {"last_event_id=x:y", ""}, {"heartbeat=0", ""}, {"heartbeat=301", ""}} {
		req := httptest.NewRequest(http.MethodGet, "/v1/events?"+tc.query, nil)
		if tc.lastID != "" {
			req.Header.Set("Last-Event-ID", tc.lastID)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		require.Equal(t, http.StatusBadRequest, w.Code, tc)
	}
}

// TestEventsResumeBehindTheHorizonIsReset: a client resuming from an explicit
// cursor whose later events retention deleted gets an "event: reset" record
// first, naming the horizon (as its id) and the earliest stored event, and then
// every stored event after it exactly once. At or after the horizon, or from
// the start, there is no reset.
func TestEventsResumeBehindTheHorizonIsReset(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	h := newTestEventsHandler(t, db.Pool, eventsOptions{poll: 10 * time.Millisecond, batch: 2})
	ids := outboxtest.AppendIDs(t, db.Pool, outbox.Cursor{}, "e", 6)
	require.NoError(t, outbox.EnsureSink(ctx, db.Pool, "keep", outbox.After(ids[2])))
	n, err := outbox.Prune(ctx, db.Pool, outbox.PruneOptions{})
	require.NoError(t, err)
	require.Equal(t, 3, n)
	outboxtest.Append(t, db.Pool, "t", "sentinel", nil)
	hz, earliest := ids[2].String(), ids[3].String()
	rest := []string{"e3", "e4", "e5", "sentinel"}

	// Behind the horizon, by Last-Event-ID, last_event_id or from=TXID:SEQ.
	for _, tc := range []struct{ query, lastID, sent string }{
		{"", ids[0].String(), ids[0].String()},
		{"last_event_id=" + ids[1].String(), "", ids[1].String()},
		{"from=" + ids[0].String(), "", ids[0].String()},
		{"topics=t", "0:0", "0:0"},
	} {
		recs, disconnect := sseClient(t, h, tc.query, tc.lastID)
		requireSSEReset(t, recvSSE(t, recs), tc.sent, hz, earliest)
		require.Equal(t, rest, sseKeysUntil(t, recs, "sentinel"), "every stored event after the horizon, once, in order")
		disconnect()
	}

	// At the horizon (the id a reset gave), after it, or from the start: no
	// reset. from=start opens at the horizon.
	for _, tc := range []struct{ query, lastID, opening string }{
		{"", hz, hz},
		{"", ids[3].String(), ids[3].String()},
		{"from=start", "", hz},
	} {
		recs, disconnect := sseClient(t, h, tc.query, tc.lastID)
		first := recvSSE(t, recs)
		require.Equal(t, sseRecord{ID: tc.opening, Retry: "1000"}, first, "an id-only opening record, after the retry line")
		want := rest
		if tc.lastID == ids[3].String() {
			want = rest[1:]
		}
		require.Equal(t, want, sseKeysUntil(t, recs, "sentinel"))
		disconnect()
	}
}

// TestEventsIdleStreamBehindTheHorizonIsResetAtHeartbeat: a connected stream
// that has not read the events retention deleted (here it polls only once an
// hour) is told at its next heartbeat, and a reconnect with the reset's id is
// not reset again.
func TestEventsIdleStreamBehindTheHorizonIsResetAtHeartbeat(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	h := newTestEventsHandler(t, db.Pool, eventsOptions{poll: time.Hour, heartbeat: time.Hour})
	outboxtest.Append(t, db.Pool, "t", "first", nil)
	_, first := outboxtest.ReadN(t, db.Pool, outbox.Cursor{}, 1)

	// ?heartbeat=1: a heartbeat every second. The stream's one read returns
	// "first"; its next is an hour away.
	recs, disconnect := sseClient(t, h, "from=start&heartbeat=1", "")
	var last string
	require.Contains(t, nextSSEEvent(t, recs, &last).Data, `"key":"first"`)
	ids := outboxtest.AppendIDs(t, db.Pool, first, "e", 3)
	pruneEvents(t, db.Pool, 4) // no sink: first, e0, e1, e2
	outboxtest.Append(t, db.Pool, "t", "new", nil)
	evs, _ := outboxtest.ReadN(t, db.Pool, ids[2], 1)
	deadline := time.After(20 * time.Second)
	for reset := false; !reset; {
		select {
		case r := <-recs:
			if r.Comment == "heartbeat" && r.Data == "" {
				continue // one before the prune committed
			}
			requireSSEReset(t, r, first.String(), ids[2].String(), evs[0].ID.String())
			reset = true
		case <-deadline:
			t.Fatal("no reset")
		}
	}
	disconnect()

	recs, disconnect = sseClient(t, h, "", ids[2].String())
	defer disconnect()
	require.Equal(t, sseRecord{ID: ids[2].String(), Retry: "1000"}, recvSSE(t, recs))
	require.Equal(t, []string{"new"}, sseKeysUntil(t, recs, "new"))
}

// sseGatedWriter is an ssePipeWriter whose writes wait while the test holds
// gate, and that says when one starts waiting: a client that stops reading.
type sseGatedWriter struct {
	*ssePipeWriter
	gate    sync.Mutex
	waiting chan struct{}
}

func (g *sseGatedWriter) Write(b []byte) (int, error) {
	select {
	case g.waiting <- struct{}{}:
	default:
	}
	g.gate.Lock()
	g.gate.Unlock() //nolint:staticcheck // a gate, not a critical section
	return g.ssePipeWriter.Write(b)
}

// TestEventsStreamOvertakenByRetentionIsReset: a slow client's stream has read
// e0 and waits to write it while retention deletes e1..e3. Its next read would
// jump from e0 to e4; instead, the read sees the horizon in its own snapshot,
// and the stream sends a reset before e4.
func TestEventsStreamOvertakenByRetentionIsReset(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	h := newTestEventsHandler(t, db.Pool, eventsOptions{poll: 10 * time.Millisecond, heartbeat: time.Hour, batch: 1})

	rctx, cancel := context.WithCancel(ctx)
	req := httptest.NewRequest(http.MethodGet, "/v1/events", nil).WithContext(rctx)
	pr, pw := io.Pipe()
	w := &sseGatedWriter{ssePipeWriter: &ssePipeWriter{hdr: http.Header{}, w: pw}, waiting: make(chan struct{}, 1)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.ServeHTTP(w, req)
		pw.Close()
	}()
	defer func() {
		cancel()
		pr.Close()
		<-done
	}()
	recs := make(chan sseRecord, 1024)
	go parseSSE(pr, recs)
	opening := recvSSE(t, recs)
	require.Empty(t, opening.Event)
	for len(w.waiting) > 0 {
		<-w.waiting
	}

	// The client stops reading; the stream reads e0 and waits to write it.
	w.gate.Lock()
	start, err := outbox.ParseCursor(opening.ID)
	require.NoError(t, err)
	ids := outboxtest.AppendIDs(t, db.Pool, start, "e", 5)
	select {
	case <-w.waiting:
	case <-time.After(20 * time.Second):
		t.Fatal("the stream never wrote")
	}
	require.NoError(t, outbox.EnsureSink(ctx, db.Pool, "keep", outbox.After(ids[3])))
	pruneEvents(t, db.Pool, 4)
	w.gate.Unlock()

	var last string
	r := nextSSEEvent(t, recs, &last)
	require.Empty(t, r.Event)
	require.Equal(t, ids[0].String(), r.ID, "e0 was read before the prune: it is delivered")
	r = nextSSEEvent(t, recs, &last)
	requireSSEReset(t, r, ids[0].String(), ids[3].String(), ids[4].String())
	require.Equal(t, []string{"e4"}, sseKeysUntil(t, recs, "e4"))
}
