package web_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/migrate"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/platform/web"
	"github.com/bettercompute/bettercompute/workers"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type pingArgs struct {
	N int `json:"n"`
}

func (pingArgs) Kind() string { return "web_test_ping" }

// testQueue is worked by nobody, so inserted jobs stay available.
const testQueue = "web_test"

// insertJob inserts an available job and returns its id.
func insertJob(t *testing.T, db *pg.Pool) int64 {
	t.Helper()
	var id int64
	require.NoError(t, pg.InTx(context.Background(), db, func(ctx context.Context, tx pgx.Tx) error {
		res, err := jobs.InsertTx(context.Background(), tx, pingArgs{N: 1}, &river.InsertOpts{Queue: testQueue})
		if err != nil {
			return err
		}
		id = res.Job.ID
		return nil
	}))
	return id
}

func jobState(t *testing.T, db *pgtest.DB, id int64) string {
	t.Helper()
	var s string
	require.NoError(t, db.QueryRow(context.Background(), `SELECT state::text FROM river_job WHERE id = $1`, id).Scan(&s))
	return s
}

// syncBuffer is a log sink that handlers may write to concurrently.
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

// testLog writes warnings and errors to t.Log while the test runs and drops
// whatever a background goroutine logs after it ended.
func testLog(t *testing.T) zerolog.Logger {
	w := &tlog{t: t}
	t.Cleanup(func() { w.done.Store(true) })
	return zerolog.New(zerolog.ConsoleWriter{Out: w, NoColor: true}).Level(zerolog.WarnLevel)
}

type tlog struct {
	t    *testing.T
	done atomic.Bool
}

func (w *tlog) Write(p []byte) (int, error) {
	if !w.done.Load() {
		w.t.Log(strings.TrimSpace(string(p)))
	}
	return len(p), nil
}

func builtinSet(t *testing.T) *migrate.Set {
	t.Helper()
	set, err := migrate.Builtin()
	require.NoError(t, err)
	return set
}

// newServer builds a server on db (not listening) with opts adjusted by mut and
// serves its handler with httptest.
func newServer(t *testing.T, db *pgtest.DB, mut func(o *web.Options)) (*web.Server, *httptest.Server) {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(workers.NewQueueCollector(db.Pool))
	o := web.Options{
		Pool:       db.Pool,
		Migrations: builtinSet(t),
		Metrics:    reg,
		Log:        testLog(t),
	}
	if mut != nil {
		mut(&o)
	}
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := web.New(ctx, o)
	require.NoError(t, err)
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		ts.Close()
		require.NoError(t, srv.Shutdown(context.Background()))
		cancel()
	})
	return srv, ts
}

type request struct {
	method, path, body string
	user, pass         string
	header             map[string]string
}

// do sends r to base and returns the status and body.
func do(t *testing.T, base string, r request) (int, string, http.Header) {
	t.Helper()
	if r.method == "" {
		r.method = http.MethodGet
	}
	var body io.Reader
	if r.body != "" {
		body = strings.NewReader(r.body)
	}
	req, err := http.NewRequest(r.method, strings.TrimSuffix(base, "/")+r.path, body)
	require.NoError(t, err)
	if r.body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if r.user != "" || r.pass != "" {
		req.SetBasicAuth(r.user, r.pass)
	}
	for k, v := range r.header {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b), resp.Header
}

// listedIDs returns the ids River UI's API lists for state.
func listedIDs(t *testing.T, base, state string, auth ...string) []int64 {
	t.Helper()
	r := request{path: "/api/jobs?state=" + state}
	if len(auth) == 2 {
		r.user, r.pass = auth[0], auth[1]
	}
	code, body, _ := do(t, base, r)
	require.Equal(t, http.StatusOK, code, body)
	var out struct {
		Data []struct {
			ID json.Number `json:"id"`
		} `json:"data"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &out), body)
	var ids []int64
	for _, j := range out.Data {
		id, err := strconv.ParseInt(j.ID.String(), 10, 64)
		require.NoError(t, err)
		ids = append(ids, id)
	}
	return ids
}

func TestHealthReadyMetrics(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	_, ts := newServer(t, db, nil)

	code, body, _ := do(t, ts.URL, request{path: "/healthz"})
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "ok\n", body)

	code, body, _ = do(t, ts.URL, request{path: "/readyz"})
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, "ready\n", body)

	code, body, _ = do(t, ts.URL, request{path: "/metrics"})
	require.Equal(t, http.StatusOK, code)
	require.NotContains(t, body, `queue="`+testQueue+`"`)

	insertJob(t, db.Pool)
	insertJob(t, db.Pool)
	code, body, _ = do(t, ts.URL, request{path: "/metrics"})
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `bettercompute_queue_jobs{queue="`+testQueue+`",state="available"} 2`)
}

func TestReadyzPendingAndRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{Empty: true})
	_, ts := newServer(t, db, nil)

	code, body, _ := do(t, ts.URL, request{path: "/readyz"})
	require.Equal(t, http.StatusServiceUnavailable, code, body)
	require.Contains(t, body, "migrations pending")
	require.Contains(t, body, "core/0001_")
	require.Contains(t, body, "run better-compute migrate")

	// Migrated: ready.
	require.NoError(t, migrate.EnsureExtensions(ctx, db.Pool))
	_, err := builtinSet(t).Apply(ctx, db.Pool, nil)
	require.NoError(t, err)
	code, body, _ = do(t, ts.URL, request{path: "/readyz"})
	require.Equal(t, http.StatusOK, code, body)

	// A newer release migrated the database: refused, not ready.
	db.MustExec(t, `INSERT INTO compute_migrations (name, applied_at) VALUES ('core/9999_from_a_newer_release', clock_timestamp())`)
	code, body, _ = do(t, ts.URL, request{path: "/readyz"})
	require.Equal(t, http.StatusServiceUnavailable, code, body)
	require.Contains(t, body, "migrations refused")
	require.Contains(t, body, "core/9999_from_a_newer_release")
}

func TestReadyzDatabaseDown(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	_, ts := newServer(t, db, nil)
	db.Pool.Close() // every query now fails
	code, body, _ := do(t, ts.URL, request{path: "/readyz"})
	require.Equal(t, http.StatusServiceUnavailable, code, body)
	require.Contains(t, body, "database unreachable")
	code, _, _ = do(t, ts.URL, request{path: "/healthz"})
	require.Equal(t, http.StatusOK, code, "the process is still up")
}

func TestRiverUIPageAndAPI(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	_, ts := newServer(t, db, nil)

	code, body, hdr := do(t, ts.URL, request{path: "/", header: map[string]string{"Accept": "text/html"}})
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, hdr.Get("Content-Type"), "text/html")
	require.Contains(t, body, "River")
	require.Contains(t, body, "/assets/")

	// A client-side route of the single-page app serves the same page.
	code, _, _ = do(t, ts.URL, request{path: "/jobs", header: map[string]string{"Accept": "text/html"}})
	require.Equal(t, http.StatusOK, code)

	id := insertJob(t, db.Pool)
	require.Contains(t, listedIDs(t, ts.URL, "available"), id)

	code, body, _ = do(t, ts.URL, request{path: "/api/jobs/" + strconv.FormatInt(id, 10)})
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "web_test_ping")

	code, body, _ = do(t, ts.URL, request{path: "/api/queues"})
	require.Equal(t, http.StatusOK, code, body)
}

func TestCheckBind(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		listen string
		auth   bool
		ok     bool
	}{
		{"127.0.0.1:8080", false, true},
		{"127.0.0.2:0", false, true},
		{"[::1]:0", false, true},
		{"localhost:0", false, true},
		{"0.0.0.0:0", false, false},
		{":8080", false, false},
		{"[::]:0", false, false},
		{"192.0.2.10:8080", false, false},
		{"0.0.0.0:0", true, true},
		{"192.0.2.10:8080", true, true},
		{"nonsense", true, false},
	} {
		err := web.CheckBind(ctx, tc.listen, tc.auth)
		if tc.ok {
			require.NoError(t, err, tc.listen)
			continue
		}
		require.Error(t, err, tc.listen)
		require.Equal(t, fault.InvalidConfig, fault.CodeOf(err), "%s: %v", tc.listen, err)
	}
}

func TestNonLoopbackNeedsCredentials(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()

	_, err := web.Start(ctx, web.Options{Listen: "0.0.0.0:0", Pool: db.Pool, Log: zerolog.Nop()})
	require.Error(t, err)
	require.Equal(t, fault.InvalidConfig, fault.CodeOf(err), "%v", err)
	require.Contains(t, err.Error(), "BETTER_COMPUTE_AUTH_USER")

	_, err = web.New(ctx, web.Options{Listen: "127.0.0.1:0", User: "admin", Pool: db.Pool, Log: zerolog.Nop()})
	require.Equal(t, fault.InvalidConfig, fault.CodeOf(err), "a user without a password: %v", err)
}

// TestBasicAuthRealListener binds every interface with credentials on a real
// listener, and checks the guards, that the password is never logged, and the
// graceful stop on context cancel.
func TestBasicAuthRealListener(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	const user, pass = "operator", "s3cret-Pa55word-xyzzy"
	logs := &syncBuffer{}
	log := zerolog.New(logs).Level(zerolog.TraceLevel)
	reg := prometheus.NewRegistry()
	reg.MustRegister(workers.NewQueueCollector(db.Pool))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv, err := web.Start(ctx, web.Options{
		Listen: "0.0.0.0:0", User: user, Password: pass,
		Pool: db.Pool, Migrations: builtinSet(t), Metrics: reg, Log: log,
		Routes: []web.Route{{Pattern: "GET /v1/hello", ReadOnly: true, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write([]byte("hello"))
		})}},
	})
	require.NoError(t, err)
	port := srv.Addr().(*net.TCPAddr).Port
	base := "http://127.0.0.1:" + strconv.Itoa(port)

	// /healthz is open.
	code, _, _ := do(t, base, request{path: "/healthz"})
	require.Equal(t, http.StatusOK, code)

	id := insertJob(t, db.Pool)
	for _, path := range []string{"/readyz", "/metrics", "/api/jobs?state=available", "/", "/v1/hello"} {
		for _, cred := range [][2]string{{"", ""}, {user, "wrong"}, {"wrong", pass}, {user, pass + "x"}, {user, ""}} {
			code, _, hdr := do(t, base, request{path: path, user: cred[0], pass: cred[1], header: map[string]string{"Accept": "text/html"}})
			require.Equal(t, http.StatusUnauthorized, code, "%s with %q", path, cred[0])
			require.Contains(t, hdr.Get("WWW-Authenticate"), "Basic realm=")
		}
		code, body, _ := do(t, base, request{path: path, user: user, pass: pass, header: map[string]string{"Accept": "text/html"}})
		require.Equal(t, http.StatusOK, code, "%s: %s", path, body)
	}
	// Not the job-cancel API either, and the job is untouched.
	code, _, _ = do(t, base, request{method: http.MethodPost, path: "/api/jobs/cancel", body: `{"ids":["` + strconv.FormatInt(id, 10) + `"]}`})
	require.Equal(t, http.StatusUnauthorized, code)
	require.Equal(t, "available", jobState(t, db, id))
	require.Contains(t, listedIDs(t, base, "available", user, pass), id)

	// Graceful stop on ctx cancel: the port stops answering.
	cancel()
	require.NoError(t, srv.Shutdown(context.Background()))
	_, err = net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(port))
	require.Error(t, err, "still listening after shutdown")

	out := logs.String()
	require.Contains(t, out, `"message":"http request"`, "the access log ran, so the check below means something")
	require.Contains(t, out, `"status":401`)
	require.NotContains(t, out, pass)
	require.NotContains(t, out, "s3cret")
}

func TestReadOnly(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	routes := []web.Route{
		{Pattern: "GET /v1/view", ReadOnly: true, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write([]byte("view"))
		})},
		{Pattern: "/v1/change", ReadOnly: false, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write([]byte("changed"))
		})},
	}
	_, ro := newServer(t, db, func(o *web.Options) { o.ReadOnly = true; o.Routes = routes })
	_, rw := newServer(t, db, func(o *web.Options) { o.Routes = routes })

	a, b := insertJob(t, db.Pool), insertJob(t, db.Pool)
	cancelBody := func(id int64) string { return `{"ids":["` + strconv.FormatInt(id, 10) + `"]}` }

	// Read-only: the cancel is refused with a JSON error and the job is untouched.
	code, body, hdr := do(t, ro.URL, request{method: http.MethodPost, path: "/api/jobs/cancel", body: cancelBody(a)})
	require.Equal(t, http.StatusForbidden, code, body)
	require.Contains(t, hdr.Get("Content-Type"), "application/json")
	var e struct{ Message, Code string }
	require.NoError(t, json.Unmarshal([]byte(body), &e))
	require.Equal(t, "READ_ONLY", e.Code)
	require.Contains(t, e.Message, "read-only")
	require.Equal(t, "available", jobState(t, db, a))

	// Every other state-changing call too.
	for _, r := range []request{
		{method: http.MethodPost, path: "/api/jobs/delete", body: cancelBody(a)},
		{method: http.MethodPost, path: "/api/jobs/retry", body: cancelBody(a)},
		{method: http.MethodPut, path: "/api/queues/" + testQueue + "/pause", body: `{}`},
		{method: http.MethodPatch, path: "/api/queues/" + testQueue, body: `{}`},
		{method: http.MethodDelete, path: "/api/jobs/" + strconv.FormatInt(a, 10)},
	} {
		code, body, _ := do(t, ro.URL, r)
		require.Equal(t, http.StatusForbidden, code, "%s %s: %s", r.method, r.path, body)
	}
	require.Equal(t, "available", jobState(t, db, a))
	require.Equal(t, 0, db.MustCount(t, `SELECT count(*) FROM river_queue WHERE name = $1 AND paused_at IS NOT NULL`, testQueue))

	// Reads still work.
	require.Contains(t, listedIDs(t, ro.URL, "available"), a)
	code, _, _ = do(t, ro.URL, request{path: "/", header: map[string]string{"Accept": "text/html"}})
	require.Equal(t, http.StatusOK, code)

	// Routes: read-only ones served, the others refused whatever the method.
	code, body, _ = do(t, ro.URL, request{path: "/v1/view"})
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "view", body)
	code, _, _ = do(t, ro.URL, request{path: "/v1/change"})
	require.Equal(t, http.StatusForbidden, code)

	// The same request on a writable server does cancel: the refusal above is
	// read-only mode, not a malformed request.
	code, body, _ = do(t, rw.URL, request{method: http.MethodPost, path: "/api/jobs/cancel", body: cancelBody(b)})
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, "cancelled", jobState(t, db, b))
	code, body, _ = do(t, rw.URL, request{method: http.MethodPost, path: "/v1/change"})
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "changed", body)
}

func TestHostAndCrossOrigin(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	_, ts := newServer(t, db, nil)
	id := insertJob(t, db.Pool)

	// DNS rebinding: without credentials, only loopback names are answered.
	for _, host := range []string{"evil.example", "evil.example:8080", "10.0.0.1:8080"} {
		code, body, _ := do(t, ts.URL, request{path: "/api/jobs?state=available", header: map[string]string{"Host": host}})
		require.Equal(t, http.StatusForbidden, code, "%s: %s", host, body)
		require.Contains(t, body, "MISDIRECTED")
	}
	for _, host := range []string{"localhost:8080", "127.0.0.1:8080", "[::1]:8080", "ui.localhost"} {
		code, body, _ := do(t, ts.URL, request{path: "/api/jobs?state=available", header: map[string]string{"Host": host}})
		require.Equal(t, http.StatusOK, code, "%s: %s", host, body)
	}
	code, _, _ := do(t, ts.URL, request{path: "/healthz", header: map[string]string{"Host": "evil.example"}})
	require.Equal(t, http.StatusOK, code, "/healthz passes no guard")

	// Cross-site browser requests cannot cancel.
	for _, h := range []map[string]string{
		{"Sec-Fetch-Site": "cross-site"},
		{"Origin": "http://evil.example"},
	} {
		code, body, _ := do(t, ts.URL, request{method: http.MethodPost, path: "/api/jobs/cancel",
			body: `{"ids":["` + strconv.FormatInt(id, 10) + `"]}`, header: h})
		require.Equal(t, http.StatusForbidden, code, "%v: %s", h, body)
	}
	require.Equal(t, "available", jobState(t, db, id))
	// A same-origin one can.
	code, body, _ := do(t, ts.URL, request{method: http.MethodPost, path: "/api/jobs/cancel",
		body: `{"ids":["` + strconv.FormatInt(id, 10) + `"]}`, header: map[string]string{"Sec-Fetch-Site": "same-origin"}})
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, "cancelled", jobState(t, db, id))
}

func TestRoutesValidated(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	h := http.NotFoundHandler()
	for _, r := range []web.Route{
		{Pattern: "GET /healthz", Handler: h},
		{Pattern: "/api/mine", Handler: h},
		{Pattern: "GET /assets/x.js", Handler: h},
		{Pattern: "NOT A PATTERN", Handler: h},
		{Pattern: "GET /v1/nil"},
	} {
		_, err := web.New(context.Background(), web.Options{Pool: db.Pool, Log: zerolog.Nop(), Routes: []web.Route{r}})
		require.Error(t, err, r.Pattern)
		require.Equal(t, fault.InvalidConfig, fault.CodeOf(err), "%s: %v", r.Pattern, err)
	}
}

// TestShutdownEndsStreams: a long-lived response (an event stream) is flushed
// through the guards, and ends when the server shuts down.
func TestShutdownEndsStreams(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ended := make(chan error, 1)
	stream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write([]byte("data: hello\n\n"))
		if err := http.NewResponseController(w).Flush(); err != nil {
			ended <- err
			return
		}
		<-r.Context().Done()
		ended <- r.Context().Err()
	})
	srv, err := web.Start(context.Background(), web.Options{
		Listen: "127.0.0.1:0", Pool: db.Pool, Log: zerolog.Nop(),
		Routes: []web.Route{{Pattern: "GET /v1/stream", ReadOnly: true, Handler: stream}},
	})
	require.NoError(t, err)
	resp, err := http.Get(srv.URL() + "v1/stream")
	require.NoError(t, err)
	defer resp.Body.Close()
	line := make([]byte, len("data: hello"))
	_, err = io.ReadFull(resp.Body, line)
	require.NoError(t, err, "the first event arrives before the handler returns: Flush works")
	require.Equal(t, "data: hello", string(line))

	require.NoError(t, srv.Shutdown(context.Background()), "the stream ended within the shutdown timeout")
	require.True(t, errors.Is(<-ended, context.Canceled))
	_, err = http.Get(srv.URL() + "healthz")
	require.Error(t, err)
	require.NoError(t, srv.Shutdown(context.Background()), "a second Shutdown is harmless")
}
