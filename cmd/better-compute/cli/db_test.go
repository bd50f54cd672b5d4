package cli_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/cmd/better-compute/cli"
	"github.com/bettercompute/bettercompute/cmd/better-compute/cli/clitest"
	"github.com/bettercompute/bettercompute/platform/embedded"
)

// dbURL is the URL db start prints for the embedded cluster.
var dbURL = regexp.MustCompile(`^postgres://postgres@127\.0\.0\.1:\d+/bettercompute\?sslmode=disable$`)

// clusterDir returns a fresh working directory that the server's unprivileged
// user can enter (t.TempDir is private to root); at cleanup it stops any
// cluster left in its subdirectory sub and removes it.
func clusterDir(t *testing.T, sub string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "bc-cli-db-")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(dir, 0o755))
	t.Cleanup(func() {
		_ = embedded.Shutdown(context.Background(), filepath.Join(dir, sub))
		_ = os.RemoveAll(dir)
	})
	return dir
}

// answers reports whether url accepts a connection and runs SELECT 1.
func answers(url string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url+"&connect_timeout=5")
	if err != nil {
		return false
	}
	defer conn.Close(ctx)
	var one int
	return conn.QueryRow(ctx, "SELECT 1").Scan(&one) == nil && one == 1
}

// postmasterPID is the pid in the data directory's postmaster.pid.
func postmasterPID(t *testing.T, dataDir string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	require.NoError(t, err)
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	require.NoError(t, err)
	return pid
}

// TestDBKeepsAClusterForSeveralProcesses runs the built binary as a user
// would, in a fresh working directory: db start prints the postgres:// URL of
// the embedded cluster in .better-compute/pg and returns (its output closed:
// $(… db start) works), leaving the server answering, its URL in
// .better-compute/database-url (mode 0600). A second db start reuses it.
// migrate --dev, a worker --dev process and workflow list --dev on the
// embedded: URL (and migrate --dev with no URL set, which means it), and doctor on the printed URL, each leave it running, the same
// server throughout. db url prints the URL, also with the printed postgres://
// URL exported; db stop stops it and removes the file, after which db url and
// db stop fail with NOT_FOUND.
func TestDBKeepsAClusterForSeveralProcesses(t *testing.T) {
	t.Parallel()
	bin := build(t, t.TempDir())
	dir := clusterDir(t, ".better-compute/pg")
	dataDir := filepath.Join(dir, ".better-compute", "pg")
	urlFile := filepath.Join(dir, ".better-compute", "database-url")
	const embeddedURL = "BETTER_COMPUTE_DATABASE_URL=embedded:.better-compute/pg"
	command := func(env []string, args ...string) (*exec.Cmd, *bytes.Buffer, *bytes.Buffer) {
		cmd := exec.Command(bin, args...)
		cmd.Dir = dir
		cmd.Env = processEnv(append([]string{"BETTER_COMPUTE_LOG_LEVEL=warn"}, env...)...)
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		// A server that kept the command's output open would hold Wait.
		cmd.WaitDelay = 10 * time.Second
		return cmd, &o, &e
	}
	run := func(env []string, args ...string) (int, string, string) {
		t.Helper()
		cmd, o, e := command(env, args...)
		t0 := time.Now()
		err := cmd.Run()
		t.Logf("%s (%s): %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), time.Since(t0).Round(time.Millisecond), err, o, e)
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode(), o.String(), e.String()
		}
		require.NoError(t, err, "%s", args)
		return 0, o.String(), e.String()
	}

	code, stdout, stderr := run(nil, "db", "start")
	require.Equal(t, 0, code, stderr)
	url, ok := strings.CutSuffix(stdout, "\n")
	require.True(t, ok && dbURL.MatchString(url), "one line, the URL: %q", stdout)
	require.Contains(t, stderr, "better-compute db stop")
	require.True(t, answers(url), "the server runs on after db start exited")
	pid := postmasterPID(t, dataDir)
	fi, err := os.Stat(urlFile)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	content, err := os.ReadFile(urlFile)
	require.NoError(t, err)
	require.Equal(t, url+"\n", string(content))

	code, stdout, stderr = run(nil, "db", "start")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, url+"\n", stdout, "a running cluster is reused")
	up := func(after string) {
		t.Helper()
		require.True(t, answers(url), "the cluster is up after %s", after)
		require.Equal(t, pid, postmasterPID(t, dataDir), "the same server after %s", after)
	}
	up("a second db start")

	code, _, stderr = run([]string{embeddedURL}, "migrate", "--dev")
	require.Equal(t, 0, code, stderr)
	up("migrate --dev")
	// --dev without a URL is the binary's dev database, the one db started;
	// without --dev there is no database at all.
	code, _, stderr = run(nil, "migrate", "--dev")
	require.Equal(t, 0, code, stderr)
	up("migrate --dev with no URL set")
	code, _, stderr = run(nil, "migrate")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "INVALID_CONFIG: BETTER_COMPUTE_DATABASE_URL: not set")

	worker, wout, werr := command([]string{embeddedURL, "BETTER_COMPUTE_LISTEN=127.0.0.1:0"}, "worker", "--dev")
	require.NoError(t, worker.Start())
	exited := make(chan error, 1)
	go func() { exited <- worker.Wait() }()
	t.Cleanup(func() { _ = worker.Process.Kill() })
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	deadline := time.Now().Add(60 * time.Second)
	for {
		var held int
		require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM compute_leases WHERE expires_at > compute_now()`).Scan(&held))
		if held > 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the worker took no shard:\n%s%s", wout, werr)
		time.Sleep(20 * time.Millisecond)
	}
	require.NoError(t, conn.Close(ctx))
	require.NoError(t, worker.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		require.NoError(t, err, "the worker stops cleanly:\n%s%s", wout, werr)
	case <-time.After(30 * time.Second):
		t.Fatalf("the worker did not stop within 30 s of SIGTERM:\n%s%s", wout, werr)
	}
	up("a worker --dev process")

	code, stdout, stderr = run([]string{embeddedURL}, "workflow", "list", "--dev")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "no workflows\n", stdout)
	up("workflow list --dev")
	code, _, stderr = run([]string{"BETTER_COMPUTE_DATABASE_URL=" + url}, "doctor")
	require.Equal(t, 0, code, stderr)
	up("doctor")

	for _, env := range [][]string{nil, {embeddedURL}, {"BETTER_COMPUTE_DATABASE_URL=" + url}} {
		code, stdout, stderr = run(env, "db", "url")
		require.Equal(t, 0, code, stderr)
		require.Equal(t, url+"\n", stdout, "db url with %q", env)
	}

	// As after `export BETTER_COMPUTE_DATABASE_URL=$(better-compute db start)`.
	code, _, stderr = run([]string{"BETTER_COMPUTE_DATABASE_URL=" + url}, "db", "stop")
	require.Equal(t, 0, code, stderr)
	require.False(t, answers(url), "db stop stopped the server")
	require.NoFileExists(t, filepath.Join(dataDir, "postmaster.pid"))
	require.NoFileExists(t, urlFile, "db stop removes the URL file")
	require.FileExists(t, filepath.Join(dataDir, "PG_VERSION"), "the cluster's data is kept")

	for _, verb := range []string{"url", "stop"} {
		code, stdout, stderr = run(nil, "db", verb)
		require.Equal(t, 1, code)
		require.Empty(t, stdout)
		require.Equal(t, "NOT_FOUND: no embedded cluster running in .better-compute/pg: start one with `better-compute db start`\n", stderr, "db %s", verb)
	}
}

// TestDevLeavesAClusterItFoundRunning: dev on a cluster db start runs uses it
// and, when it stops, leaves it running and its URL file in place, since it
// did not start it; db stop then stops it and removes the file.
func TestDevLeavesAClusterItFoundRunning(t *testing.T) {
	t.Parallel()
	dir := clusterDir(t, ".devkept/pg")
	urlFile := filepath.Join(dir, ".devkept", "database-url")
	app := cli.App{Name: "devkept"}
	env := []string{"BETTER_COMPUTE_DATABASE_URL=embedded:" + filepath.Join(dir, ".devkept", "pg"),
		"BETTER_COMPUTE_LOG_LEVEL=warn", "BETTER_COMPUTE_LISTEN=127.0.0.1:0"}
	r := clitest.Run(t, context.Background(), app, env, "db", "start")
	require.Equal(t, 0, r.Code, r.Stderr)
	url := strings.TrimSuffix(r.Stdout, "\n")
	require.Regexp(t, dbURL, url)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr clitest.Buffer
	done := make(chan int, 1)
	go func() {
		done <- cli.Run(ctx, app, []string{"dev"}, cli.Env{Stdout: &stdout, Stderr: &stderr, Environ: clitest.WithStatementCache(env)})
	}()
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(stdout.String(), "Press Ctrl-C to stop.") {
		select {
		case code := <-done:
			t.Fatalf("dev ended: exit %d\n%s", code, stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
		require.True(t, time.Now().Before(deadline), "dev did not start:\n%s", stderr.String())
	}
	require.Contains(t, stdout.String(), "database ready at "+url, "dev uses the running cluster")
	cancel()
	select {
	case code := <-done:
		require.Equal(t, 0, code, stderr.String())
	case <-time.After(60 * time.Second):
		t.Fatal("dev did not stop")
	}
	require.True(t, answers(url), "the cluster runs on after dev stopped")
	content, err := os.ReadFile(urlFile)
	require.NoError(t, err, "the URL file stays with the running cluster")
	require.Equal(t, url+"\n", string(content))

	r = clitest.Run(t, context.Background(), app, env, "db", "stop")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.False(t, answers(url))
	require.NoFileExists(t, urlFile)
}

// TestDBUsage: db needs one known verb and no other argument, and refuses a
// temporary cluster, which would not outlive db start.
func TestDBUsage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for args, want := range map[string]string{
		"db":           "INVALID_ARGUMENT: db needs a verb: start | url | stop",
		"db frob":      `INVALID_ARGUMENT: db: unknown verb "frob"`,
		"db url extra": `INVALID_ARGUMENT: db url takes no arguments, got ["extra"]`,
	} {
		r := clitest.Run(t, ctx, cli.App{}, nil, strings.Fields(args)...)
		require.Equal(t, 1, r.Code, args)
		require.True(t, strings.HasPrefix(r.Stderr, want), "%s: %s", args, r.Stderr)
	}
	for _, u := range []string{"embedded:memory", "embedded:"} {
		r := clitest.Run(t, ctx, cli.App{}, []string{"BETTER_COMPUTE_DATABASE_URL=" + u}, "db", "start")
		require.Equal(t, 1, r.Code, u)
		require.Contains(t, r.Stderr, "INVALID_CONFIG: BETTER_COMPUTE_DATABASE_URL="+u+": db keeps a cluster in a directory", u)
	}
	r := clitest.Run(t, ctx, cli.App{Name: "shop"}, nil, "--help")
	require.Regexp(t, `(?m)^\s+db\s+run the embedded PostgreSQL \(embedded:\.shop/pg unless`, r.Stdout)
}
