package pgtest

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/platform/prereq"
)

// PgBouncer starts a PgBouncer in transaction pooling mode in front of the
// server of db, and returns db's URL through it. It is stopped at cleanup. The
// test fails (it does not skip) when pgbouncer is not installed: `go tool task
// deps`, which the test task runs first, installs it.
func PgBouncer(tb testing.TB, db *DB) string {
	tb.Helper()
	return StartPgBouncer(tb, db).URL
}

// Bouncer is a running PgBouncer (see StartPgBouncer).
type Bouncer struct {
	// URL is the database's URL through the pooler.
	URL    string
	dir    string
	exited chan struct{}
}

// Exited reports whether the PgBouncer process has ended.
func (b *Bouncer) Exited() bool {
	select {
	case <-b.exited:
		return true
	default:
		return false
	}
}

// Log returns PgBouncer's log so far.
func (b *Bouncer) Log() string {
	l, _ := os.ReadFile(filepath.Join(b.dir, "pgbouncer.log"))
	o, _ := os.ReadFile(filepath.Join(b.dir, "stdout.log"))
	return string(l) + string(o)
}

// StartPgBouncer is PgBouncer, returning the running pooler so a test can check
// that it is still up and read its log.
func StartPgBouncer(tb testing.TB, db *DB) *Bouncer {
	tb.Helper()
	bin, err := prereq.Find(prereq.PgBouncer)
	if err != nil {
		tb.Fatal("pgtest: ", err)
	}
	up, err := url.Parse(db.URL)
	if err != nil {
		tb.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "pgbouncer-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()

	userName := up.User.Username()
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
max_client_conn = 500
default_pool_size = 40
server_reset_query =
ignore_startup_parameters = extra_float_digits
logfile = %s
pidfile = %s
`, up.Hostname(), up.Port(), port, filepath.Join(dir, "users.txt"), filepath.Join(dir, "pgbouncer.log"), filepath.Join(dir, "pgbouncer.pid"))
	must := func(err error) {
		if err != nil {
			tb.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(dir, "pgbouncer.ini"), []byte(ini), 0o644))
	must(os.WriteFile(filepath.Join(dir, "users.txt"), []byte(fmt.Sprintf("%q \"\"\n", userName)), 0o644))

	cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM, Setpgid: true}
	if os.Geteuid() == 0 { // pgbouncer refuses to run as root
		u, err := user.Lookup("postgres")
		if err != nil {
			u, err = user.Lookup("nobody")
		}
		if err != nil {
			tb.Fatal("pgtest: running as root and no unprivileged user for pgbouncer")
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		must(os.Chown(dir, uid, gid))
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}
	}
	out, err := os.Create(filepath.Join(dir, "stdout.log"))
	must(err)
	cmd.Stdout, cmd.Stderr = out, out
	must(cmd.Start())
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	tb.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			c.Close()
			break
		}
		select {
		case <-exited:
			b, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.log"))
			b2, _ := os.ReadFile(filepath.Join(dir, "stdout.log"))
			tb.Fatalf("pgtest: pgbouncer exited: %s %s", b, b2)
		default:
		}
		if time.Now().After(deadline) {
			tb.Fatal("pgtest: pgbouncer did not listen within 10 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	via := *up
	via.Host = fmt.Sprintf("127.0.0.1:%d", port)
	return &Bouncer{URL: via.String(), dir: dir, exited: exited}
}
