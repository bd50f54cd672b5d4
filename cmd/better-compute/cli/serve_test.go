package cli

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/config"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

// The package's TestMain (pgtest.Main) is in cli_test.go.

type serveTestArgs struct{}

func (serveTestArgs) Kind() string { return "serve_test" }

// serveTestQueue is worked by nobody, so its jobs stay available.
const serveTestQueue = "serve_test"

func insertServeTestJob(t *testing.T, db *pg.Pool) int64 {
	t.Helper()
	var id int64
	require.NoError(t, pg.InTx(context.Background(), db, func(ctx context.Context, tx pgx.Tx) error {
		res, err := jobs.InsertTx(context.Background(), tx, serveTestArgs{}, &river.InsertOpts{Queue: serveTestQueue})
		if err == nil {
			id = res.Job.ID
		}
		return err
	}))
	return id
}

// lockedBuffer is an output stream a running command writes while the test
// reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

var uiURL = regexp.MustCompile(`River UI: (http://\S+/)`)

// runServe runs `better-compute serve args…` in-process with environ until the
// test ends (or stop is called), waits for the printed URL and returns it.
func runServe(t *testing.T, environ []string, args ...string) (base string, stop func() int, stdout, stderr *lockedBuffer) {
	t.Helper()
	stdout, stderr = &lockedBuffer{}, &lockedBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	code := make(chan int, 1)
	go func() {
		code <- Run(ctx, App{}, append([]string{"serve"}, args...), Env{Stdout: stdout, Stderr: stderr, Environ: environ})
	}()
	var once sync.Once
	exit := -1
	stop = func() int {
		once.Do(func() { cancel(); exit = <-code })
		return exit
	}
	t.Cleanup(func() { stop() })
	deadline := time.Now().Add(60 * time.Second)
	for {
		if m := uiURL.FindStringSubmatch(stdout.String()); m != nil {
			return m[1], stop, stdout, stderr
		}
		select {
		case c := <-code:
			t.Fatalf("serve exited with %d before serving: %s", c, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve printed no URL; stderr: %s", stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func get(t *testing.T, url, user, pass string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	req.Header.Set("Accept", "text/html")
	if user != "" {
		req.SetBasicAuth(user, pass)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// TestServeCommand runs the serve command on a real loopback listener with
// credentials: probes, metrics, River UI, and no password in the logs.
func TestServeCommand(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	const user, pass = "ops", "serve-Pa55word-plugh"
	base, stop, _, stderr := runServe(t, []string{
		"BETTER_COMPUTE_DATABASE_URL=" + db.URL,
		"BETTER_COMPUTE_LISTEN=127.0.0.1:0",
		"BETTER_COMPUTE_AUTH_USER=" + user,
		"BETTER_COMPUTE_AUTH_PASSWORD=" + pass,
		"BETTER_COMPUTE_LOG_LEVEL=debug",
		"BETTER_COMPUTE_LOG_FORMAT=json",
	})
	require.True(t, strings.HasPrefix(base, "http://127.0.0.1:"), base)

	code, body := get(t, base+"healthz", "", "")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "ok\n", body)
	code, _ = get(t, base+"readyz", "", "")
	require.Equal(t, http.StatusUnauthorized, code)
	code, _ = get(t, base+"readyz", user, "wrong")
	require.Equal(t, http.StatusUnauthorized, code)
	code, body = get(t, base+"readyz", user, pass)
	require.Equal(t, http.StatusOK, code, body)

	id := insertServeTestJob(t, db.Pool)
	code, body = get(t, base+"metrics", user, pass)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `bettercompute_queue_jobs{queue="serve_test",state="available"} 1`)
	require.Contains(t, body, "go_goroutines")
	require.Contains(t, body, "process_")

	code, body = get(t, base, user, pass)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "/assets/")
	code, body = get(t, base+"api/jobs?state=available", user, pass)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `"id":`+strconv.FormatInt(id, 10))

	require.Equal(t, 0, stop(), stderr.String())
	_, err := http.Get(base + "healthz")
	require.Error(t, err, "still serving after the command returned")

	logs := stderr.String()
	require.Contains(t, logs, "serving River UI")
	require.Contains(t, logs, `"status":401`, "the access log ran at debug")
	require.NotContains(t, logs, pass)
}

func TestServeRefusesNonLoopbackWithoutCredentials(t *testing.T) {
	t.Parallel()
	for _, listen := range []string{"0.0.0.0:0", ":0", "[::]:0"} {
		var stdout, stderr bytes.Buffer
		// The database URL points nowhere: the refusal must come first.
		code := Run(context.Background(), App{}, []string{"serve"}, Env{Stdout: &stdout, Stderr: &stderr, Environ: []string{
			"BETTER_COMPUTE_DATABASE_URL=postgres://nobody:pw@127.0.0.1:1/none",
			"BETTER_COMPUTE_LISTEN=" + listen,
		}})
		require.Equal(t, 1, code, listen)
		require.True(t, strings.HasPrefix(stderr.String(), "INVALID_CONFIG: "), "%s: %s", listen, stderr.String())
		require.Contains(t, stderr.String(), "loopback")
		require.Contains(t, stderr.String(), "BETTER_COMPUTE_AUTH_PASSWORD")
	}
}

func TestServeNoMigrateReadyzPending(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, pgtest.Options{Empty: true})
	environ := []string{"BETTER_COMPUTE_DATABASE_URL=" + db.URL, "BETTER_COMPUTE_LISTEN=127.0.0.1:0"}

	base, stop, _, stderr := runServe(t, environ, "--no-migrate")
	code, body := get(t, base+"readyz", "", "")
	require.Equal(t, http.StatusServiceUnavailable, code, body)
	require.Contains(t, body, "migrations pending")
	code, _ = get(t, base+"healthz", "", "")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, 0, stop(), stderr.String())

	// Without --no-migrate serve migrates first, and is ready.
	base, stop, _, stderr = runServe(t, environ)
	code, body = get(t, base+"readyz", "", "")
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, 0, stop(), stderr.String())
}

func TestServeReadOnlyCommand(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	base, _, _, _ := runServe(t, []string{
		"BETTER_COMPUTE_DATABASE_URL=" + db.URL,
		"BETTER_COMPUTE_LISTEN=127.0.0.1:0",
		"BETTER_COMPUTE_READ_ONLY=true",
	})
	id := insertServeTestJob(t, db.Pool)
	resp, err := http.Post(base+"api/jobs/cancel", "application/json", strings.NewReader(`{"ids":["`+strconv.FormatInt(id, 10)+`"]}`))
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode, string(b))
	require.Contains(t, string(b), "READ_ONLY")
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM river_job WHERE id = $1 AND state = 'available'`, id))
	code, body := get(t, base+"api/jobs?state=available", "", "")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `"id":`+strconv.FormatInt(id, 10))
}

// TestStartServeWithRuntime is dev's path: StartServe with a running worker,
// whose River client River UI uses and whose metrics join /metrics.
func TestStartServeWithRuntime(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	promReg := prometheus.NewRegistry()
	metrics := workers.NewMetrics(promReg)
	// As when the worker serves its own /metrics: the runtime families must
	// not appear twice.
	promReg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// Leases long enough that a loaded machine's late renewal cannot let
	// them lapse in the database between two reads of /metrics.
	rt := workertest.Start(t, db.Pool, nil, &workers.Options{Metrics: metrics, LeaseTTL: 10 * time.Second, LeaseRenew: time.Second})

	cfg, err := config.Load([]string{"BETTER_COMPUTE_DATABASE_URL=" + db.URL, "BETTER_COMPUTE_LISTEN=127.0.0.1:0", "BETTER_COMPUTE_LOG_LEVEL=warn"})
	require.NoError(t, err)
	stdout, stderr := &lockedBuffer{}, &lockedBuffer{}
	s := &Session{App: &App{}, Config: cfg, Env: Env{Stdout: stdout, Stderr: stderr}, workerMetrics: promReg}
	t.Cleanup(s.close)

	stop, err := s.StartServe(context.Background(), rt)
	require.NoError(t, err)
	m := uiURL.FindStringSubmatch(stdout.String())
	require.NotNil(t, m, stdout.String())
	base := m[1]

	id := insertServeTestJob(t, db.Pool)
	var code int
	var body string
	want := []string{
		"bettercompute_leases_held 16",                                     // the worker's own gauge
		`bettercompute_queue_jobs{queue="serve_test",state="available"} 1`, // serve's, from the database
		`bettercompute_leases{kind="shard",owner="` + rt.Owner() + `"} 16`, // serve's, from the database
	}
	workertest.WaitFor(t, 30*time.Second, "metrics from the worker and from the database", func() bool {
		code, body = get(t, base+"metrics", "", "")
		if code != http.StatusOK {
			return false
		}
		for _, w := range want {
			if !strings.Contains(body, w) {
				return false
			}
		}
		return true
	})
	require.Equal(t, 1, strings.Count(body, "# TYPE go_goroutines "), "Go runtime metrics exactly once")

	code, body = get(t, base+"api/jobs?state=available", "", "")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `"id":`+strconv.FormatInt(id, 10))

	stop()
	stop() // harmless twice
	_, err = http.Get(base + "healthz")
	require.Error(t, err)
	require.Empty(t, stderr.String(), "nothing at warn or above")
}
