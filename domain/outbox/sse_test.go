package outbox_test

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
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

// record is one dispatched SSE record: an event (ID and Data, and Event when
// it names a type, as reset records do), an id-only record (Data empty), or a
// comment.
type record struct {
	Event   string
	ID      string
	Data    string
	Comment string
}

// parseSSE reads SSE records from r into out until r ends.
func parseSSE(r io.Reader, out chan<- record) {
	defer close(out)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var cur record
	var data []string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			cur.Data = strings.Join(data, "\n")
			out <- cur
			cur, data = record{}, nil
		case strings.HasPrefix(line, ":"):
			cur.Comment = strings.TrimSpace(line[1:])
		case strings.HasPrefix(line, "event:"):
			cur.Event = strings.TrimSpace(line[6:])
		case strings.HasPrefix(line, "id:"):
			cur.ID = strings.TrimSpace(line[3:])
		case strings.HasPrefix(line, "data:"):
			data = append(data, strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " "))
		}
	}
}

// pipeWriter is an http.ResponseWriter streaming into a pipe: the test client
// reads what the handler writes as it flushes, without a network.
type pipeWriter struct {
	hdr    http.Header
	status int
	w      *io.PipeWriter
}

func (p *pipeWriter) Header() http.Header         { return p.hdr }
func (p *pipeWriter) WriteHeader(code int)        { p.status = code }
func (p *pipeWriter) Write(b []byte) (int, error) { return p.w.Write(b) }
func (p *pipeWriter) Flush()                      {}

// testClient connects to h in-process, optionally resuming after lastID, and
// returns the records and a disconnect function.
func testClient(t *testing.T, h http.Handler, query, lastID string) (<-chan record, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req := httptest.NewRequest(http.MethodGet, "/v1/events?"+query, nil).WithContext(ctx)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	pr, pw := io.Pipe()
	w := &pipeWriter{hdr: http.Header{}, w: pw}
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.ServeHTTP(w, req)
		pw.Close()
	}()
	out := make(chan record, 1024)
	go parseSSE(pr, out)
	return out, func() {
		cancel()
		pr.Close()
		<-done
	}
}

// nextEvent returns the next record with data, skipping comments and id-only
// records; lastID tracks the id the client would resume from.
func nextEvent(t *testing.T, in <-chan record, lastID *string) record {
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

func TestSSEResumesFromLastEventIDExactlyOnce(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	h := outbox.NewSSEHandler(db.Pool, outbox.SSEOptions{Poll: 10 * time.Millisecond, Heartbeat: 25 * time.Millisecond, Batch: 4})
	for i := 0; i < 5; i++ {
		appendOne(t, db.Pool, "orders", "o"+string(rune('0'+i)), map[string]int{"n": i})
	}
	appendOne(t, db.Pool, "other", "x", nil)

	recs, disconnect := testClient(t, h, "topics=orders&from=start", "")
	var last string
	var got []string
	for i := 0; i < 3; i++ {
		r := nextEvent(t, recs, &last)
		var d outbox.SSEData
		require.NoError(t, json.Unmarshal([]byte(r.Data), &d))
		require.Equal(t, r.ID, d.ID)
		require.Equal(t, "orders", d.Topic)
		require.JSONEq(t, `{"n":`+string(rune('0'+i))+`}`, string(d.Payload))
		got = append(got, d.Key)
	}
	disconnect()

	// More events arrive while the client is away, in several transactions.
	for i := 5; i < 9; i++ {
		appendOne(t, db.Pool, "orders", "o"+string(rune('0'+i)), map[string]int{"n": i})
		appendOne(t, db.Pool, "other", "x", nil)
	}
	recs, disconnect = testClient(t, h, "topics=orders", last)
	defer disconnect()
	appendOne(t, db.Pool, "orders", "sentinel", nil)
	for {
		r := nextEvent(t, recs, &last)
		var d outbox.SSEData
		require.NoError(t, json.Unmarshal([]byte(r.Data), &d))
		got = append(got, d.Key)
		if d.Key == "sentinel" {
			break
		}
	}
	require.Equal(t, []string{"o0", "o1", "o2", "o3", "o4", "o5", "o6", "o7", "o8", "sentinel"}, got, "every event once, in order")

	// Heartbeats keep an idle stream alive, and carry the id past rows of other
	// topics, so a resuming client need not scan them again.
	appendOne(t, db.Pool, "other", "y", nil)
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

func TestSSEStartsAtTheEndAndRejectsBadIDs(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	h := outbox.NewSSEHandler(db.Pool, outbox.SSEOptions{Poll: 10 * time.Millisecond})
	appendOne(t, db.Pool, "t", "old", nil)
	readN(t, db.Pool, outbox.Cursor{}, 1)

	// Without a position the stream starts at the end, and says where (an
	// id-only record), so a reconnect before any event loses nothing.
	recs, disconnect := testClient(t, h, "", "")
	first := <-recs
	require.NotEmpty(t, first.ID)
	require.Empty(t, first.Data)
	disconnect()
	appendOne(t, db.Pool, "t", "new", nil)
	recs, disconnect = testClient(t, h, "", first.ID)
	defer disconnect()
	var last string
	r := nextEvent(t, recs, &last)
	require.Contains(t, r.Data, `"key":"new"`)

	for _, tc := range []struct{ query, lastID string }{{"from=middle", ""}, {"", "12"}, {"last_event_id=x:y", ""}} {
		req := httptest.NewRequest(http.MethodGet, "/v1/events?"+tc.query, nil)
		if tc.lastID != "" {
			req.Header.Set("Last-Event-ID", tc.lastID)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		require.Equal(t, http.StatusBadRequest, w.Code, tc)
	}
}

// recv returns the next record of any kind.
func recv(t *testing.T, in <-chan record) record {
	t.Helper()
	select {
	case r, ok := <-in:
		require.True(t, ok, "stream ended")
		return r
	case <-time.After(20 * time.Second):
		t.Fatal("timed out waiting for a record")
	}
	return record{}
}

// requireReset checks that r is a reset record resuming after horizon.
func requireReset(t *testing.T, r record, lastEventID, horizon, earliest string) {
	t.Helper()
	require.Equal(t, "reset", r.Event, "%+v", r)
	require.Equal(t, horizon, r.ID, "the id is the horizon: a reconnect resumes there")
	var d outbox.SSEReset
	require.NoError(t, json.Unmarshal([]byte(r.Data), &d))
	require.Equal(t, outbox.SSEReset{Reason: "pruned", LastEventID: lastEventID, ResumeAfter: horizon, Earliest: earliest}, d)
}

// keysUntil reads events until the one keyed last, failing on any reset, and
// returns their keys.
func keysUntil(t *testing.T, in <-chan record, last string) []string {
	t.Helper()
	var id string
	var out []string
	for {
		r := nextEvent(t, in, &id)
		require.Empty(t, r.Event, "no reset: %+v", r)
		var d outbox.SSEData
		require.NoError(t, json.Unmarshal([]byte(r.Data), &d))
		out = append(out, d.Key)
		if d.Key == last {
			return out
		}
	}
}

// TestSSEResumeBehindTheHorizonIsReset: a client resuming from an explicit
// cursor whose later events retention deleted gets an "event: reset" record
// first, naming the horizon (as its id) and the earliest stored event, and then
// every stored event after it exactly once. At or after the horizon, or from
// the start, there is no reset.
func TestSSEResumeBehindTheHorizonIsReset(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	h := outbox.NewSSEHandler(db.Pool, outbox.SSEOptions{Poll: 10 * time.Millisecond, Batch: 2, Log: zerolog.New(zerolog.NewTestWriter(t))})
	ids := appendIDs(t, db.Pool, outbox.Cursor{}, "e", 6)
	require.NoError(t, outbox.EnsureSink(ctx, db.Pool, "keep", outbox.After(ids[2])))
	n, err := outbox.Prune(ctx, db.Pool, outbox.PruneOptions{})
	require.NoError(t, err)
	require.Equal(t, 3, n)
	appendOne(t, db.Pool, "t", "sentinel", nil)
	hz, earliest := ids[2].String(), ids[3].String()
	rest := []string{"e3", "e4", "e5", "sentinel"}

	// Behind the horizon, by Last-Event-ID, last_event_id or from=TXID:SEQ.
	for _, tc := range []struct{ query, lastID, sent string }{
		{"", ids[0].String(), ids[0].String()},
		{"last_event_id=" + ids[1].String(), "", ids[1].String()},
		{"from=" + ids[0].String(), "", ids[0].String()},
		{"topics=t", "0:0", "0:0"},
	} {
		recs, disconnect := testClient(t, h, tc.query, tc.lastID)
		requireReset(t, recv(t, recs), tc.sent, hz, earliest)
		require.Equal(t, rest, keysUntil(t, recs, "sentinel"), "every stored event after the horizon, once, in order")
		disconnect()
	}

	// At the horizon (the id a reset gave), after it, or from the start: no
	// reset. from=start opens at the horizon.
	for _, tc := range []struct{ query, lastID, opening string }{
		{"", hz, hz},
		{"", ids[3].String(), ids[3].String()},
		{"from=start", "", hz},
	} {
		recs, disconnect := testClient(t, h, tc.query, tc.lastID)
		first := recv(t, recs)
		require.Equal(t, record{ID: tc.opening}, first, "an id-only opening record")
		want := rest
		if tc.lastID == ids[3].String() {
			want = rest[1:]
		}
		require.Equal(t, want, keysUntil(t, recs, "sentinel"))
		disconnect()
	}
}

// TestSSEIdleStreamBehindTheHorizonIsResetAtHeartbeat: a connected stream that
// has not read the events retention deleted (here it polls only once an hour)
// is told at its next heartbeat, and a reconnect with the reset's id is not
// reset again.
func TestSSEIdleStreamBehindTheHorizonIsResetAtHeartbeat(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	h := outbox.NewSSEHandler(db.Pool, outbox.SSEOptions{Poll: time.Hour, Heartbeat: time.Hour})
	appendOne(t, db.Pool, "t", "first", nil)
	_, first := readN(t, db.Pool, outbox.Cursor{}, 1)

	// ?heartbeat=1: a heartbeat every second. The stream's one read returns
	// "first"; its next is an hour away.
	recs, disconnect := testClient(t, h, "from=start&heartbeat=1", "")
	var last string
	require.Contains(t, nextEvent(t, recs, &last).Data, `"key":"first"`)
	ids := appendIDs(t, db.Pool, first, "e", 3)
	pruneAll(t, db.Pool, outbox.PruneOptions{}, 4) // no sink: first, e0, e1, e2
	appendOne(t, db.Pool, "t", "new", nil)
	evs, _ := readN(t, db.Pool, ids[2], 1)
	deadline := time.After(20 * time.Second)
	for reset := false; !reset; {
		select {
		case r := <-recs:
			if r.Comment == "heartbeat" && r.Data == "" {
				continue // one before the prune committed
			}
			requireReset(t, r, first.String(), ids[2].String(), evs[0].ID.String())
			reset = true
		case <-deadline:
			t.Fatal("no reset")
		}
	}
	disconnect()

	recs, disconnect = testClient(t, h, "", ids[2].String())
	defer disconnect()
	require.Equal(t, record{ID: ids[2].String()}, recv(t, recs))
	require.Equal(t, []string{"new"}, keysUntil(t, recs, "new"))
}

// gatedWriter is a pipeWriter whose writes wait while the test holds gate, and
// that says when one starts waiting: a client that stops reading.
type gatedWriter struct {
	*pipeWriter
	gate    sync.Mutex
	waiting chan struct{}
}

func (g *gatedWriter) Write(b []byte) (int, error) {
	select {
	case g.waiting <- struct{}{}:
	default:
	}
	g.gate.Lock()
	g.gate.Unlock() //nolint:staticcheck // a gate, not a critical section
	return g.pipeWriter.Write(b)
}

// TestSSEStreamOvertakenByRetentionIsReset: a slow client's stream has read e0
// and waits to write it while retention deletes e1..e3. Its next read would
// jump from e0 to e4; instead, the read sees the horizon in its own snapshot,
// and the stream sends a reset before e4.
func TestSSEStreamOvertakenByRetentionIsReset(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	h := outbox.NewSSEHandler(db.Pool, outbox.SSEOptions{Poll: 10 * time.Millisecond, Heartbeat: time.Hour, Batch: 1})

	rctx, cancel := context.WithCancel(ctx)
	req := httptest.NewRequest(http.MethodGet, "/v1/events", nil).WithContext(rctx)
	pr, pw := io.Pipe()
	w := &gatedWriter{pipeWriter: &pipeWriter{hdr: http.Header{}, w: pw}, waiting: make(chan struct{}, 1)}
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
	recs := make(chan record, 1024)
	go parseSSE(pr, recs)
	opening := recv(t, recs)
	require.Empty(t, opening.Event)
	for len(w.waiting) > 0 {
		<-w.waiting
	}

	// The client stops reading; the stream reads e0 and waits to write it.
	w.gate.Lock()
	start, err := outbox.ParseCursor(opening.ID)
	require.NoError(t, err)
	ids := appendIDs(t, db.Pool, start, "e", 5)
	select {
	case <-w.waiting:
	case <-time.After(20 * time.Second):
		t.Fatal("the stream never wrote")
	}
	require.NoError(t, outbox.EnsureSink(ctx, db.Pool, "keep", outbox.After(ids[3])))
	pruneAll(t, db.Pool, outbox.PruneOptions{}, 4)
	w.gate.Unlock()

	var last string
	r := nextEvent(t, recs, &last)
	require.Empty(t, r.Event)
	require.Equal(t, ids[0].String(), r.ID, "e0 was read before the prune: it is delivered")
	r = nextEvent(t, recs, &last)
	requireReset(t, r, ids[0].String(), ids[3].String(), ids[4].String())
	require.Equal(t, []string{"e4"}, keysUntil(t, recs, "e4"))
}
