package outbox_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/outbox"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

// record is one dispatched SSE record: an event (ID and Data), an id-only
// record (Data empty), or a comment.
type record struct {
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
