// Package embedded runs a private PostgreSQL cluster with the machine's
// PostgreSQL server binaries, for development, tests and examples.
//
// BETTER_COMPUTE_DATABASE_URL=embedded:DIR keeps the cluster in DIR across runs;
// embedded:memory uses a temporary directory removed when the cluster stops.
//
// # Lifecycle
//
//	no DIR ──initdb──▶ stopped ──start (free loopback port)──▶ running ──Stop──▶ stopped
//	                                  ▲                           │
//	                                  └─ a second process finds ──┘ postmaster.pid
//	                                     and reuses the server
//
// The server listens on 127.0.0.1 only, on a free port, with trust
// authentication for the superuser postgres: it is a development cluster, never
// a production one. It runs as a child process in its own process group, and
// Linux sends it SIGINT (fast shutdown) if the process that started it dies, so
// a crashed dev process leaves no server behind. As root it runs the server as an
// unprivileged user (postgres where it exists, else nobody), since PostgreSQL
// refuses to run as root. A second process pointed at the same DIR reuses the
// running server; only the process that started it stops it.
//
// With Options.Detach the server outlives the process that starts it instead:
// it runs in a session of its own (no terminal's Ctrl-C or hang-up reaches it),
// no process owns it, and it runs until Shutdown stops it. Running finds it.
//
// The binaries (initdb, postgres) are found in BETTER_COMPUTE_PG_BIN, on PATH, or
// under /usr/lib/postgresql/*/bin (the newest version first).
package embedded

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/prereq"
)

// Scheme is the URL prefix that selects the embedded cluster.
const Scheme = "embedded:"

// Memory is the DIR that selects a temporary cluster.
const Memory = "memory"

// Database is the database the cluster creates for Better Compute.
const Database = "bettercompute"

// IsURL reports whether s selects the embedded cluster.
func IsURL(s string) bool { return strings.HasPrefix(s, Scheme) }

// Options configure Start.
type Options struct {
	// Dir is the data directory, or "" / "memory" for a temporary one.
	Dir string
	// BinDir holds initdb and postgres; "" searches (see the package doc).
	BinDir string
	// Fast turns off fsync and synchronous commit: for tests, never for data
	// you want to keep.
	Fast bool
	// Settings are extra server settings (-c name=value).
	Settings map[string]string
	// Logf receives a line per lifecycle step; nil is silent.
	Logf func(format string, args ...any)
	// Detach starts the server so that it outlives this process: in a session
	// of its own, without the signal a dying parent sends, and not owned (Stop
	// leaves it running; Shutdown stops it). A server already running is
	// reused as it is. Only for a cluster kept in a directory.
	Detach bool
}

// Cluster is a running embedded cluster.
type Cluster struct {
	dir     string
	tmp     bool // remove dir on Stop
	port    int
	owned   bool // this process started the server
	cmd     *exec.Cmd
	exited  chan struct{}
	logf    func(string, ...any)
	stopped sync.Once
	stopErr error
}

// FromURL starts (or reuses) the cluster an embedded: URL names.
func FromURL(ctx context.Context, url string, o Options) (*Cluster, error) {
	if !IsURL(url) {
		return nil, fault.New(fault.InvalidConfig, "%q is not an embedded: URL", url)
	}
	o.Dir = strings.TrimPrefix(url, Scheme)
	if o.Dir == "" {
		return nil, fault.New(fault.InvalidConfig, "BETTER_COMPUTE_DATABASE_URL=embedded: needs a directory or memory (embedded:DIR, embedded:memory)")
	}
	return Start(ctx, o)
}

// URL is the postgres:// URL of the Better Compute database, as the superuser.
func (c *Cluster) URL() string { return c.DatabaseURL(Database) }

// DatabaseURL is the URL of database name on the cluster.
func (c *Cluster) DatabaseURL(name string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, name)
}

// Port is the server's TCP port on 127.0.0.1.
func (c *Cluster) Port() int { return c.port }

// Dir is the data directory.
func (c *Cluster) Dir() string { return c.dir }

// Owned reports whether this process started the server and Stop stops it:
// false for a server it found running, and for one it started with Detach.
func (c *Cluster) Owned() bool { return c.owned }

// Start creates the cluster if its directory is empty, starts it (or finds it
// already running), and creates the bettercompute database. It returns
// INVALID_CONFIG when no PostgreSQL binaries are found or the directory is not
// usable, UNAVAILABLE when the server does not come up.
func Start(ctx context.Context, o Options) (*Cluster, error) {
	logf := o.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	c := &Cluster{logf: logf}
	if o.Detach && (o.Dir == "" || o.Dir == Memory) {
		return nil, fault.New(fault.InvalidConfig, "a detached embedded cluster outlives its process, so it needs a directory to keep it in (embedded:DIR), not a temporary one")
	}
	if o.Dir == "" || o.Dir == Memory {
		dir, err := os.MkdirTemp("", "better-compute-pg-")
		if err != nil {
			return nil, fault.Wrap(fault.InvalidConfig, err, "cannot create a temporary directory for the embedded cluster")
		}
		c.dir, c.tmp = dir, true
	} else {
		dir, err := filepath.Abs(o.Dir)
		if err != nil {
			return nil, fault.Wrap(fault.InvalidConfig, err, "bad embedded cluster directory %q", o.Dir)
		}
		c.dir = dir
	}
	if err := c.start(ctx, o); err != nil {
		if c.tmp {
			_ = os.RemoveAll(c.dir)
		}
		return nil, err
	}
	return c, nil
}

func (c *Cluster) start(ctx context.Context, o Options) error {
	// A server already running on this directory is reused.
	if port, _, ok := postmaster(c.dir); ok {
		if err := c.createDatabase(ctx, port); err == nil {
			c.port = port
			c.logf("embedded PostgreSQL: reusing the server already running on %s (port %d)", c.dir, port)
			return nil
		}
	}

	bin, err := FindBin(o.BinDir)
	if err != nil {
		return err
	}
	runAs, err := serverUser()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(c.dir), 0o755); err != nil {
		return fault.Wrap(fault.InvalidConfig, err, "cannot create the embedded cluster directory %s", c.dir)
	}
	if err := os.Mkdir(c.dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fault.Wrap(fault.InvalidConfig, err, "cannot create the embedded cluster directory %s", c.dir)
	}
	if runAs != nil {
		if err := os.Chown(c.dir, int(runAs.Uid), int(runAs.Gid)); err != nil {
			return fault.Wrap(fault.InvalidConfig, err, "cannot give %s to the server's user", c.dir)
		}
		if err := checkTraversable(c.dir); err != nil {
			return err
		}
	}

	if _, err := os.Stat(filepath.Join(c.dir, "PG_VERSION")); errors.Is(err, os.ErrNotExist) {
		entries, _ := os.ReadDir(c.dir)
		if len(entries) > 0 {
			return fault.New(fault.InvalidConfig, "embedded cluster directory %s is not empty and holds no cluster (no PG_VERSION)", c.dir)
		}
		t0 := time.Now()
		args := []string{"-D", c.dir, "-U", "postgres", "--auth=trust", "--encoding=UTF8", "--locale=C"}
		if o.Fast {
			args = append(args, "--no-sync")
		}
		cmd := exec.CommandContext(ctx, filepath.Join(bin, "initdb"), args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: runAs}
		cmd.Dir = c.dir
		if out, err := cmd.CombinedOutput(); err != nil {
			return fault.Wrap(fault.InvalidConfig, err, "initdb failed in %s: %s", c.dir, lastLines(string(out), 5))
		}
		c.logf("embedded PostgreSQL: initdb %s in %s", c.dir, time.Since(t0).Round(time.Millisecond))
	}

	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort()
		if err != nil {
			return fault.Wrap(fault.Unavailable, err, "cannot find a free port on 127.0.0.1")
		}
		lastErr = c.launch(ctx, bin, runAs, port, o)
		if lastErr == nil {
			break
		}
		if ctx.Err() != nil {
			return fault.Wrap(fault.Unavailable, ctx.Err(), "embedded PostgreSQL did not start")
		}
		// Another process may have started a server on this directory meanwhile.
		if p, _, ok := postmaster(c.dir); ok {
			if err := c.createDatabase(ctx, p); err == nil {
				c.port = p
				return nil
			}
		}
	}
	if lastErr != nil {
		return lastErr
	}
	if err := c.createDatabase(ctx, c.port); err != nil {
		_ = c.Stop()
		return fault.Wrap(fault.Unavailable, err, "cannot create database %s on the embedded cluster", Database)
	}
	return nil
}

func (c *Cluster) launch(ctx context.Context, bin string, runAs *syscall.Credential, port int, o Options) error {
	t0 := time.Now()
	args := []string{"-D", c.dir, "-p", strconv.Itoa(port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories=",
		"-c", "max_connections=200",
		"-c", "shared_buffers=128MB",
		"-c", "logging_collector=off",
	}
	if o.Fast {
		args = append(args, "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	}
	keys := make([]string, 0, len(o.Settings))
	for k := range o.Settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		args = append(args, "-c", k+"="+o.Settings[k])
	}
	logPath := filepath.Join(c.dir, "server.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fault.Wrap(fault.InvalidConfig, err, "cannot open %s", logPath)
	}
	defer logFile.Close()
	if runAs != nil {
		_ = os.Chown(logPath, int(runAs.Uid), int(runAs.Gid))
	}
	cmd := exec.Command(filepath.Join(bin, "postgres"), args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Dir = c.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: runAs,
		Setpgid:    true,           // a terminal's Ctrl-C reaches us, and we stop the server in order
		Pdeathsig:  syscall.SIGINT, // fast shutdown if this process dies
	}
	if o.Detach {
		// Its own session: no controlling terminal, so neither a Ctrl-C nor the
		// terminal's hang-up reaches it, and nothing signals it when we exit.
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: runAs, Setsid: true}
	}
	if err := cmd.Start(); err != nil {
		return fault.Wrap(fault.Unavailable, err, "cannot start postgres")
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()

	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-exited:
			return fault.New(fault.Unavailable, "postgres exited while starting: %s", lastLines(readTail(logPath), 5))
		case <-ctx.Done():
			_ = cmd.Process.Signal(syscall.SIGQUIT)
			<-exited
			return fault.Wrap(fault.Unavailable, ctx.Err(), "embedded PostgreSQL did not start")
		case <-time.After(20 * time.Millisecond):
		}
		if ready(ctx, port) {
			break
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Signal(syscall.SIGQUIT)
			<-exited
			return fault.New(fault.Unavailable, "postgres did not accept connections within 60 s: %s", lastLines(readTail(logPath), 5))
		}
	}
	c.port = port
	if !o.Detach {
		c.cmd, c.exited, c.owned = cmd, exited, true
	}
	c.logf("embedded PostgreSQL: started on 127.0.0.1:%d (data %s) in %s", port, c.dir, time.Since(t0).Round(time.Millisecond))
	return nil
}

// Running returns the cluster whose server runs in dir and accepts
// connections, whoever started it; this process does not own it. It returns
// NOT_FOUND when none does.
func Running(ctx context.Context, dir string) (*Cluster, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fault.Wrap(fault.InvalidConfig, err, "bad embedded cluster directory %q", dir)
	}
	if port, _, ok := postmaster(abs); ok && ready(ctx, port) {
		return &Cluster{dir: abs, port: port, logf: func(string, ...any) {}}, nil
	}
	return nil, fault.New(fault.NotFound, "no embedded cluster running in %s", dir)
}

// Shutdown stops the server running in dir, whoever started it (a detached one,
// or another process's), with a fast shutdown: open transactions roll back,
// clients are disconnected, a checkpoint is written. It returns once the server
// has exited, NOT_FOUND when none runs there, and UNAVAILABLE when it did not
// stop within 30 s (it then gets an immediate shutdown) or ctx ended first.
func Shutdown(ctx context.Context, dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fault.Wrap(fault.InvalidConfig, err, "bad embedded cluster directory %q", dir)
	}
	_, pid, ok := postmaster(abs)
	if !ok {
		return fault.New(fault.NotFound, "no embedded cluster running in %s", dir)
	}
	if err := syscall.Kill(pid, syscall.SIGINT); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			return fault.New(fault.NotFound, "no embedded cluster running in %s", dir)
		}
		return fault.Wrap(fault.Unavailable, err, "cannot stop the embedded cluster in %s (postmaster pid %d)", dir, pid)
	}
	// The server removes postmaster.pid as it exits (after its last child): a
	// server that has exited may stay a zombie until its parent, gone, is
	// replaced by one that reaps it, so the file is the sign, as for pg_ctl.
	gone := func() bool { _, _, ok := postmaster(abs); return !ok }
	deadline := time.Now().Add(30 * time.Second)
	for !gone() {
		select {
		case <-ctx.Done():
			return fault.Wrap(fault.Unavailable, ctx.Err(), "the embedded cluster in %s was stopping (postmaster pid %d)", dir, pid)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGQUIT)
			return fault.New(fault.Unavailable, "the embedded cluster in %s did not stop within 30 s; sent SIGQUIT (immediate shutdown) to pid %d", dir, pid)
		}
	}
	return nil
}

// Stop stops the server if this process started it, and removes a temporary
// directory. It is safe to call more than once.
func (c *Cluster) Stop() error {
	c.stopped.Do(func() {
		if c.owned && c.cmd != nil {
			_ = c.cmd.Process.Signal(syscall.SIGINT) // fast shutdown: roll back, disconnect, checkpoint
			select {
			case <-c.exited:
			case <-time.After(30 * time.Second):
				_ = c.cmd.Process.Signal(syscall.SIGQUIT)
				<-c.exited
				c.stopErr = fault.New(fault.Unavailable, "postgres did not stop within 30 s; sent SIGQUIT")
			}
			c.logf("embedded PostgreSQL: stopped (port %d)", c.port)
		}
		if c.tmp {
			if err := os.RemoveAll(c.dir); err != nil && c.stopErr == nil {
				c.stopErr = err
			}
		}
	})
	return c.stopErr
}

// Restart stops and starts the server on the same directory and port, for tests
// of connection loss. Only an owned cluster can restart.
func (c *Cluster) Restart(ctx context.Context, o Options) error {
	if err := c.Halt(false); err != nil {
		return err
	}
	return c.Resume(ctx, o)
}

// Halt stops the server, leaving its directory and port to Resume, for tests of
// a server outage: a fast shutdown (SIGINT: roll back, disconnect, checkpoint),
// or with immediate an immediate one (SIGQUIT: no checkpoint, crash recovery at
// the next start). It waits for the server to exit. Halting a halted server does
// nothing. Only an owned cluster can halt.
func (c *Cluster) Halt(immediate bool) error {
	if !c.owned || c.cmd == nil {
		return fault.New(fault.InvalidArgument, "only the process that started the embedded cluster can halt it")
	}
	select {
	case <-c.exited:
		return nil
	default:
	}
	sig, mode := syscall.SIGINT, "fast"
	if immediate {
		sig, mode = syscall.SIGQUIT, "immediate"
	}
	t0 := time.Now()
	_ = c.cmd.Process.Signal(sig)
	<-c.exited
	c.logf("embedded PostgreSQL: halted (%s shutdown, port %d) in %s", mode, c.port, time.Since(t0).Round(time.Millisecond))
	return nil
}

// Resume starts a halted server again on the same directory and port, and
// returns once it accepts connections. Resuming a running server does nothing.
func (c *Cluster) Resume(ctx context.Context, o Options) error {
	if !c.owned || c.cmd == nil {
		return fault.New(fault.InvalidArgument, "only the process that started the embedded cluster can resume it")
	}
	select {
	case <-c.exited:
	default:
		return nil
	}
	bin, err := FindBin(o.BinDir)
	if err != nil {
		return err
	}
	runAs, err := serverUser()
	if err != nil {
		return err
	}
	return c.launch(ctx, bin, runAs, c.port, o)
}

func (c *Cluster) createDatabase(ctx context.Context, port int) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port))
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", Database).Scan(&exists); err != nil {
		return err
	}
	if !exists {
		if _, err := conn.Exec(ctx, "CREATE DATABASE "+Database); err != nil && !strings.Contains(err.Error(), "already exists") {
			return err
		}
	}
	return nil
}

// FindBin returns the directory that holds initdb and postgres: hint if given,
// else BETTER_COMPUTE_PG_BIN, else the directory of initdb on PATH, else the
// newest /usr/lib/postgresql/*/bin (prereq.PGBin). It returns INVALID_CONFIG
// naming what is missing and how to install it.
func FindBin(hint string) (string, error) { return prereq.PGBin(hint) }

// serverUser is nil when this process is not root, else the unprivileged user
// the server runs as.
func serverUser() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}, nil
	}
	return nil, fault.New(fault.InvalidConfig, "running as root, and no unprivileged user (postgres or nobody) to run the embedded PostgreSQL server as")
}

// checkTraversable fails when a parent of dir cannot be entered by others, since
// the server runs as another user than root.
func checkTraversable(dir string) error {
	for p := filepath.Dir(dir); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err == nil && fi.Mode().Perm()&0o001 == 0 {
			return fault.New(fault.InvalidConfig, "the embedded cluster directory %s is under %s, which the unprivileged server user cannot enter (mode %s); choose a directory outside it", dir, p, fi.Mode().Perm())
		}
		if p == "/" || p == "." {
			return nil
		}
	}
}

// postmaster reads dir/postmaster.pid and reports the port and pid of a live
// server.
func postmaster(dir string) (port, pid int, ok bool) {
	f, err := os.Open(filepath.Join(dir, "postmaster.pid"))
	if err != nil {
		return 0, 0, false
	}
	defer f.Close()
	var lines []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		lines = append(lines, s.Text())
	}
	if len(lines) < 4 {
		return 0, 0, false
	}
	pid, err1 := strconv.Atoi(strings.TrimSpace(lines[0]))
	port, err2 := strconv.Atoi(strings.TrimSpace(lines[3]))
	if err1 != nil || err2 != nil || pid <= 0 {
		return 0, 0, false
	}
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return 0, 0, false
	}
	return port, pid, true
}

func ready(ctx context.Context, port int) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=1", port))
	if err != nil {
		return false
	}
	_ = conn.Close(ctx)
	return true
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func readTail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 4096 {
		b = b[len(b)-4096:]
	}
	return string(b)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
