package cli_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/cmd/better-compute/cli"
	"github.com/bettercompute/bettercompute/domain/outbox"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

var serveURL = regexp.MustCompile(`River UI: (http://\S+/)`)

// startServe runs `better-compute serve` in-process until the test ends and
// returns its base URL.
func startServe(t *testing.T, environ []string) string {
	t.Helper()
	var stdout, stderr syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- cli.Run(ctx, cli.App{}, []string{"serve"}, cli.Env{Stdout: &stdout, Stderr: &stderr, Environ: environ})
	}()
	t.Cleanup(func() { cancel(); <-done })
	deadline := time.Now().Add(60 * time.Second)
	for {
		if m := serveURL.FindStringSubmatch(stdout.String()); m != nil {
			return m[1]
		}
		select {
		case c := <-done:
			t.Fatalf("serve exited with %d: %s", c, stderr.String())
		default:
		}
		require.False(t, time.Now().After(deadline), "serve printed no URL: %s", stderr.String())
		time.Sleep(10 * time.Millisecond)
	}
}

// sseEvent is one SSE record read over HTTP.
type sseEvent struct{ id, data, comment string }

// connect opens the event stream over a real HTTP connection and returns its
// records and a function that drops the connection.
func connect(t *testing.T, url, user, pass, lastID string) (<-chan sseEvent, func()) {
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
	out := make(chan sseEvent, 1024)
	go func() {
		defer close(out)
		sc := bufio.NewScanner(resp.Body)
		var cur sseEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				out <- cur
				cur = sseEvent{}
			case strings.HasPrefix(line, ":"):
				cur.comment = strings.TrimSpace(line[1:])
			case strings.HasPrefix(line, "id: "):
				cur.id = line[4:]
			case strings.HasPrefix(line, "data: "):
				cur.data = line[6:]
			}
		}
	}()
	return out, func() { cancel(); resp.Body.Close() }
}

// nextData returns the next record with data, tracking the last id seen.
func nextData(t *testing.T, in <-chan sseEvent, last *string) outbox.SSEData {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case r, ok := <-in:
			require.True(t, ok, "the stream ended")
			if r.id != "" {
				*last = r.id
			}
			if r.data != "" {
				var d outbox.SSEData
				require.NoError(t, json.Unmarshal([]byte(r.data), &d))
				require.Equal(t, r.id, d.ID)
				return d
			}
		case <-timeout:
			t.Fatal("no event")
		}
	}
}

// TestEventStreamOverHTTP: serve's /v1/events, behind its credentials, over a
// real connection: a client that drops the connection and reconnects with
// Last-Event-ID receives every later event exactly once, in order.
func TestEventStreamOverHTTP(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	const user, pass = "ops", "events-Pa55word"
	base := startServe(t, []string{
		"BETTER_COMPUTE_DATABASE_URL=" + db.URL, "BETTER_COMPUTE_LISTEN=127.0.0.1:0",
		"BETTER_COMPUTE_AUTH_USER=" + user, "BETTER_COMPUTE_AUTH_PASSWORD=" + pass,
		"BETTER_COMPUTE_LOG_LEVEL=warn", "BETTER_COMPUTE_READ_ONLY=true",
	})
	add := func(topic, key string) {
		require.NoError(t, pg.InTx(ctx, db.Pool, nil, func(tx pgx.Tx) error {
			return outbox.Append(ctx, tx, outbox.Message{Topic: topic, Key: key, Payload: map[string]string{"key": key}})
		}))
	}
	for _, k := range []string{"a", "b", "c"} {
		add("orders", k)
		add("noise", k)
	}

	resp, err := http.Get(base + "v1/events")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "behind serve's credentials")

	url := base + "v1/events?topics=orders&from=start&heartbeat=1"
	recs, drop := connect(t, url, user, pass, "")
	var last string
	var got []string
	for i := 0; i < 2; i++ {
		got = append(got, nextData(t, recs, &last).Key)
	}
	drop()
	for _, k := range []string{"d", "e", "f"} {
		add("orders", k)
		add("noise", k)
	}
	recs, drop = connect(t, url, user, pass, last)
	defer drop()
	add("orders", "end")
	for got[len(got)-1] != "end" {
		got = append(got, nextData(t, recs, &last).Key)
	}
	require.Equal(t, []string{"a", "b", "c", "d", "e", "f", "end"}, got)

	// An idle stream sends heartbeats (?heartbeat=1: every second).
	timeout := time.After(30 * time.Second)
	for done := false; !done; {
		select {
		case r := <-recs:
			require.Empty(t, r.data)
			done = r.comment == "heartbeat"
		case <-timeout:
			t.Fatal("no heartbeat")
		}
	}
}
