package embedded_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/platform/embedded"
	"github.com/bettercompute/bettercompute/platform/fault"
)

// The tests re-run this test binary as a helper process: with helperEnv set,
// TestMain starts (or reuses) the cluster in helperDirEnv, reports on stdout,
// and then does what helperThenEnv says instead of running the tests.
const (
	helperEnv     = "BC_EMBEDDED_TEST_HELPER"
	helperDirEnv  = "BC_EMBEDDED_TEST_DIR"
	helperThenEnv = "BC_EMBEDDED_TEST_THEN" // stop, exit (no Stop), or hold (until stdin closes)
	helperDetach  = "BC_EMBEDDED_TEST_DETACH"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(helper())
	}
	os.Exit(m.Run())
}

// helper starts the cluster, queries it, prints key=value lines, then stops,
// exits or holds.
func helper() int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := embedded.Start(ctx, embedded.Options{Dir: os.Getenv(helperDirEnv), Fast: true, Detach: os.Getenv(helperDetach) != ""})
	if err != nil {
		fmt.Println("error=" + err.Error())
		return 1
	}
	conn, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		fmt.Println("error=" + err.Error())
		return 1
	}
	var db string
	var port int
	if err := conn.QueryRow(ctx, "SELECT current_database(), inet_server_port()").Scan(&db, &port); err != nil {
		fmt.Println("error=" + err.Error())
		return 1
	}
	_ = conn.Close(ctx)
	fmt.Printf("port=%d\nserverport=%d\ndatabase=%s\nowned=%t\neuid=%d\ndir=%s\n", c.Port(), port, db, c.Owned(), os.Geteuid(), c.Dir())
	switch os.Getenv(helperThenEnv) {
	case "exit":
		fmt.Println("ready")
		return 0
	case "hold":
		fmt.Println("ready")
		_, _ = io.Copy(io.Discard, os.Stdin)
		return 0
	default:
		if err := c.Stop(); err != nil {
			fmt.Println("error=" + err.Error())
			return 1
		}
		fmt.Println("ready")
		return 0
	}
}

// helperCmd returns the command that runs this test binary as a helper.
func helperCmd(t *testing.T, bin, dir, then string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=1", helperDirEnv+"="+dir, helperThenEnv+"="+then, "TMPDIR="+os.TempDir())
	cmd.Dir = filepath.Dir(bin)
	cmd.Stderr = zerolog.NewTestWriter(t)
	return cmd
}

// startHolder starts the helper process holding a cluster in dir (detached
// or owned) until its standard input closes (at the test's end), and returns
// it with its report.
func startHolder(t *testing.T, dir string, detach bool) (*exec.Cmd, map[string]string) {
	t.Helper()
	self, err := os.Executable()
	require.NoError(t, err)
	cmd := helperCmd(t, self, dir, "hold")
	if detach {
		cmd.Env = append(cmd.Env, helperDetach+"=1")
	}
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	t.Cleanup(func() { _ = stdin.Close() })
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	return cmd, readReport(t, stdout)
}

// readReport reads the helper's key=value lines up to "ready".
func readReport(t *testing.T, r io.Reader) map[string]string {
	t.Helper()
	out := map[string]string{}
	s := bufio.NewScanner(r)
	for s.Scan() {
		line := s.Text()
		if line == "ready" {
			return out
		}
		k, v, _ := strings.Cut(line, "=")
		out[k] = v
		if k == "error" {
			t.Fatalf("helper failed: %s", v)
		}
	}
	t.Fatalf("helper ended before it was ready: %v (%v)", out, s.Err())
	return nil
}

// sharedDir returns a fresh directory that the server's unprivileged user can
// enter (t.TempDir is private to root), removed at cleanup.
func sharedDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "bc-embedded-test-")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(d, 0o755))
	t.Cleanup(func() { _ = os.RemoveAll(d) })
	return d
}

// query runs SELECT 1 on the cluster's database.
func query(t *testing.T, url string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var one int
	require.NoError(t, conn.QueryRow(ctx, "SELECT 1").Scan(&one))
	require.Equal(t, 1, one)
}

func refuses(port int) bool {
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second)
	if err != nil {
		return true
	}
	_ = c.Close()
	return false
}

// serverPIDs lists the postgres processes whose command line names data dir
// ([-1] when /proc cannot be read). It does not fail the test, so that
// require.Eventually may poll it.
func serverPIDs(dir string) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return []int{-1}
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if strings.Contains(string(b), "\x00-D\x00"+dir+"\x00") {
			pids = append(pids, pid)
		}
	}
	return pids
}

// postmaster returns the server's pid from dir/postmaster.pid.
func postmaster(t *testing.T, dir string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "postmaster.pid"))
	require.NoError(t, err)
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	require.NoError(t, err)
	return pid
}

// processUID is the real uid of process pid.
func processUID(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			uid, err := strconv.Atoi(strings.Fields(rest)[0])
			require.NoError(t, err)
			return uid
		}
	}
	t.Fatalf("no Uid in /proc/%d/status", pid)
	return -1
}

// sessionOf is the session id of process pid (/proc/PID/stat: after the
// command's closing parenthesis come its state, parent, group and session).
func sessionOf(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	require.NoError(t, err)
	i := bytes.LastIndexByte(b, ')')
	require.Positive(t, i, "%s", b)
	fields := strings.Fields(string(b[i+1:]))
	require.GreaterOrEqual(t, len(fields), 4, "%s", b)
	sid, err := strconv.Atoi(fields[3])
	require.NoError(t, err)
	return sid
}

// requireGone waits until the server on port and dir is gone: the port refuses
// connections and no postgres process names dir.
func requireGone(t *testing.T, port int, dir string) {
	t.Helper()
	require.Eventually(t, func() bool {
		return refuses(port) && len(serverPIDs(dir)) == 0
	}, 60*time.Second, 100*time.Millisecond, "the server on port %d (%s) is still there", port, dir)
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
}

func TestStartAndStop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, err := embedded.FromURL(ctx, "embedded:memory", embedded.Options{Fast: true})
	require.NoError(t, err)
	defer c.Stop()
	require.True(t, c.Owned())
	dir, port := c.Dir(), c.Port()
	require.FileExists(t, filepath.Join(dir, "PG_VERSION"))
	require.Contains(t, c.URL(), fmt.Sprintf("127.0.0.1:%d/%s", port, embedded.Database))
	query(t, c.URL())
	query(t, c.DatabaseURL("postgres"))

	pid := postmaster(t, dir)
	if os.Geteuid() == 0 {
		// PostgreSQL refuses to run as root: the server runs as postgres.
		u, err := user.Lookup("postgres")
		require.NoError(t, err, "the test machine has a postgres user")
		uid, _ := strconv.Atoi(u.Uid)
		require.Equal(t, uid, processUID(t, pid))
	} else {
		require.Equal(t, os.Geteuid(), processUID(t, pid))
	}
	require.Contains(t, serverPIDs(dir), pid)

	// Listening on loopback only, and only over TCP.
	conn, err := pgx.Connect(ctx, c.URL())
	require.NoError(t, err)
	var listen, sockets string
	require.NoError(t, conn.QueryRow(ctx, "SELECT current_setting('listen_addresses'), current_setting('unix_socket_directories')").Scan(&listen, &sockets))
	require.NoError(t, conn.Close(ctx))
	require.Equal(t, "127.0.0.1", listen)
	require.Equal(t, "", sockets)

	require.NoError(t, c.Stop())
	require.NoError(t, c.Stop(), "Stop twice is fine")
	require.True(t, refuses(port))
	require.Empty(t, serverPIDs(dir))
	require.NoDirExists(t, dir, "a memory cluster's directory is removed")
}

// TestEmbeddedHaltAndResume stops the server in fast and in immediate mode and
// starts it again on the same port and data: a connection made before the halt
// is broken, new ones work after Resume, and the data survives both modes.
func TestEmbeddedHaltAndResume(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, err := embedded.Start(ctx, embedded.Options{Fast: true})
	require.NoError(t, err)
	defer c.Stop()
	port := c.Port()
	conn, err := pgx.Connect(ctx, c.URL())
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "CREATE TABLE survives (n int); INSERT INTO survives VALUES (1)")
	require.NoError(t, err)

	for _, immediate := range []bool{false, true} {
		pid := postmaster(t, c.Dir())
		require.NoError(t, c.Halt(immediate))
		require.True(t, refuses(port), "immediate=%t: the port is closed while halted", immediate)
		require.NotContains(t, serverPIDs(c.Dir()), pid)
		require.NoError(t, c.Halt(immediate), "halting a halted server does nothing")
		_, err = conn.Exec(ctx, "SELECT 1")
		require.Error(t, err, "immediate=%t: the old connection is gone", immediate)

		require.NoError(t, c.Resume(ctx, embedded.Options{Fast: true}))
		require.NoError(t, c.Resume(ctx, embedded.Options{Fast: true}), "resuming a running server does nothing")
		require.Equal(t, port, c.Port())
		require.NotEqual(t, pid, postmaster(t, c.Dir()))
		conn, err = pgx.Connect(ctx, c.URL())
		require.NoError(t, err)
		var n int
		require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM survives").Scan(&n))
		require.Equal(t, 1, n, "immediate=%t", immediate)
	}
	require.NoError(t, conn.Close(ctx))

	// Restart is Halt and Resume.
	pid := postmaster(t, c.Dir())
	require.NoError(t, c.Restart(ctx, embedded.Options{Fast: true}))
	require.NotEqual(t, pid, postmaster(t, c.Dir()))
	query(t, c.URL())

	require.NoError(t, c.Stop())
	require.True(t, refuses(port))
	require.Empty(t, serverPIDs(c.Dir()))
}

// TestStartAsNonRoot runs the start-and-query helper as the unprivileged
// postgres user, from a copy of this test binary that the user can read. The
// helper then exits without stopping the cluster: the server goes with it.
func TestStartAsNonRoot(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	u, err := user.Lookup("postgres")
	if err != nil {
		t.Skip("no postgres user")
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)

	self, err := os.Executable()
	require.NoError(t, err)
	root := sharedDir(t)
	require.NoError(t, os.Chown(root, uid, gid))
	bin := filepath.Join(root, "embedded.test")
	src, err := os.ReadFile(self)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(bin, src, 0o755))
	dir := filepath.Join(root, "pg")

	cmd := helperCmd(t, bin, dir, "exit")
	cmd.Env = append(cmd.Env, "HOME="+root)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}}
	out, err := cmd.Output()
	require.NoError(t, err, "helper output:\n%s", out)
	report := readReport(t, bytes.NewReader(out))
	require.Equal(t, strconv.Itoa(uid), report["euid"])
	require.Equal(t, "true", report["owned"])
	require.Equal(t, embedded.Database, report["database"])
	require.Equal(t, report["port"], report["serverport"])
	port, err := strconv.Atoi(report["port"])
	require.NoError(t, err)
	fi, err := os.Stat(filepath.Join(dir, "PG_VERSION"))
	require.NoError(t, err)
	require.Equal(t, uint32(uid), fi.Sys().(*syscall.Stat_t).Uid, "the cluster belongs to the user that ran it")
	requireGone(t, port, dir)
}

// TestReusedBySecondProcess starts a cluster here on a persistent directory; a
// second process pointed at the same directory reuses the running server, and
// leaves it running when it ends, since it does not own it.
func TestReusedBySecondProcess(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := filepath.Join(sharedDir(t), "pg")
	c, err := embedded.Start(ctx, embedded.Options{Dir: dir, Fast: true})
	require.NoError(t, err)
	defer c.Stop()
	require.True(t, c.Owned())
	pid := postmaster(t, dir)

	// A second Start in this process reuses it too.
	c2, err := embedded.FromURL(ctx, embedded.Scheme+dir, embedded.Options{Fast: true})
	require.NoError(t, err)
	require.False(t, c2.Owned())
	require.Equal(t, c.Port(), c2.Port())
	require.NoError(t, c2.Stop())
	query(t, c.URL())

	// And a second process.
	self, err := os.Executable()
	require.NoError(t, err)
	out, err := helperCmd(t, self, dir, "stop").Output()
	require.NoError(t, err, "helper output:\n%s", out)
	report := readReport(t, bytes.NewReader(out))
	require.Equal(t, strconv.Itoa(c.Port()), report["port"])
	require.Equal(t, strconv.Itoa(c.Port()), report["serverport"])
	require.Equal(t, "false", report["owned"])

	query(t, c.URL())
	require.Equal(t, pid, postmaster(t, dir), "the same server, never restarted")

	require.NoError(t, c.Stop())
	requireGone(t, c.Port(), dir)
	require.DirExists(t, dir, "a persistent directory is kept")
	require.NoFileExists(t, filepath.Join(dir, "postmaster.pid"))

	// A warm start on the kept directory brings the same data back.
	c3, err := embedded.Start(ctx, embedded.Options{Dir: dir, Fast: true})
	require.NoError(t, err)
	defer c3.Stop()
	require.True(t, c3.Owned())
	query(t, c3.URL())
	require.NoError(t, c3.Stop())
	requireGone(t, c3.Port(), dir)
}

// TestDetachedOutlivesItsProcess: a process that starts the cluster with
// Detach does not own it, and exits (here by SIGKILL, after it reported) with
// the server still running, in a session of its own so that no terminal's
// Ctrl-C or hang-up reaches it. Another process finds it with Running and
// reuses it with Start; Shutdown stops it, after which Running and Shutdown
// find nothing.
func TestDetachedOutlivesItsProcess(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := filepath.Join(sharedDir(t), "pg")
	t.Cleanup(func() { _ = embedded.Shutdown(context.Background(), dir) })
	cmd, report := startHolder(t, dir, true)
	require.Equal(t, "false", report["owned"], "a detached server has no owner")
	port, err := strconv.Atoi(report["port"])
	require.NoError(t, err)
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()

	pid := postmaster(t, dir)
	require.Equal(t, pid, sessionOf(t, pid), "the server leads a session of its own")
	c, err := embedded.Running(ctx, dir)
	require.NoError(t, err)
	require.Equal(t, port, c.Port())
	require.False(t, c.Owned())
	query(t, c.URL())
	require.NoError(t, c.Stop(), "Stop leaves a server it does not own running")
	query(t, c.URL())

	again, err := embedded.Start(ctx, embedded.Options{Dir: dir, Fast: true, Detach: true})
	require.NoError(t, err)
	require.Equal(t, port, again.Port(), "reused")
	require.Equal(t, pid, postmaster(t, dir), "the same server, never restarted")

	require.NoError(t, embedded.Shutdown(ctx, dir))
	require.NoFileExists(t, filepath.Join(dir, "postmaster.pid"), "Shutdown returns once the server is gone")
	requireGone(t, port, dir)
	_, err = embedded.Running(ctx, dir)
	require.Equal(t, fault.NotFound, fault.CodeOf(err), "%v", err)
	require.Contains(t, err.Error(), "no embedded cluster running in "+dir)
	require.Equal(t, fault.NotFound, fault.CodeOf(embedded.Shutdown(ctx, dir)))

	_, err = embedded.Start(ctx, embedded.Options{Dir: embedded.Memory, Detach: true})
	require.Equal(t, fault.InvalidConfig, fault.CodeOf(err), "a detached cluster needs a directory: %v", err)
}

// TestStoppedWhenTheOwnerIsKilled: a process that started the server and is
// killed with SIGKILL (no chance to stop it) leaves no server behind.
// TestStartAsNonRoot shows the same for a process that just exits.
func TestStoppedWhenTheOwnerIsKilled(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(sharedDir(t), "pg")
	cmd, report := startHolder(t, dir, false)
	require.Equal(t, "true", report["owned"])
	port, err := strconv.Atoi(report["port"])
	require.NoError(t, err)

	// The server is up while its owner lives.
	query(t, fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port))
	require.NotEmpty(t, serverPIDs(dir))
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	requireGone(t, port, dir)
}

func TestErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("bad URL", func(t *testing.T) {
		require.True(t, embedded.IsURL("embedded:memory"))
		require.False(t, embedded.IsURL("postgres://x"))
		for _, u := range []string{"embedded:", "postgres://u@127.0.0.1/db"} {
			_, err := embedded.FromURL(ctx, u, embedded.Options{})
			require.Equal(t, fault.InvalidConfig, fault.CodeOf(err), "%s: %v", u, err)
		}
	})
	t.Run("no binaries", func(t *testing.T) {
		bogus := filepath.Join(t.TempDir(), "no-postgres-here")
		_, err := embedded.FindBin(bogus)
		require.Equal(t, fault.InvalidConfig, fault.CodeOf(err))
		require.Contains(t, err.Error(), bogus)
		require.Contains(t, err.Error(), "apt-get install -y postgresql")

		dir := filepath.Join(sharedDir(t), "pg")
		_, err = embedded.Start(ctx, embedded.Options{Dir: dir, BinDir: bogus})
		require.Equal(t, fault.InvalidConfig, fault.CodeOf(err))
		require.Contains(t, err.Error(), "apt-get install -y postgresql")
		require.NoDirExists(t, dir, "nothing is created")
	})
	t.Run("found", func(t *testing.T) {
		bin, err := embedded.FindBin("")
		require.NoError(t, err)
		require.FileExists(t, filepath.Join(bin, "initdb"))
		require.FileExists(t, filepath.Join(bin, "postgres"))
		again, err := embedded.FindBin(bin)
		require.NoError(t, err)
		require.Equal(t, bin, again)
	})
	t.Run("directory without a cluster", func(t *testing.T) {
		dir := filepath.Join(sharedDir(t), "pg")
		require.NoError(t, os.MkdirAll(dir, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("mine"), 0o644))
		_, err := embedded.Start(ctx, embedded.Options{Dir: dir})
		require.Equal(t, fault.InvalidConfig, fault.CodeOf(err), "%v", err)
		require.Contains(t, err.Error(), "not empty")
		b, err := os.ReadFile(filepath.Join(dir, "notes.txt"))
		require.NoError(t, err)
		require.Equal(t, "mine", string(b), "the directory is left alone")
	})
}

// TestFindBinFromTheEnvironment: BETTER_COMPUTE_PG_BIN is read when no hint is
// given (t.Setenv: not parallel).
func TestFindBinFromTheEnvironment(t *testing.T) {
	bogus := filepath.Join(t.TempDir(), "bogus-bin")
	t.Setenv("BETTER_COMPUTE_PG_BIN", bogus)
	_, err := embedded.FindBin("")
	require.Equal(t, fault.InvalidConfig, fault.CodeOf(err))
	require.Contains(t, err.Error(), "BETTER_COMPUTE_PG_BIN="+bogus)
	require.Contains(t, err.Error(), "apt-get install -y postgresql")
}
