package cli_test

import (
	"bytes"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

// TestReadmeProgramBuildsAndRuns extracts the application the README's "Using it
// from an application" shows (its main.go and its migrations), builds it against
// this module, and runs it as a user would: --help lists its own command,
// migrate, place (and its errors), a worker process that ships the order,
// reconciles the customer and audits the event exactly once, and the backfill.
// The README cannot drift from the API, or from what works.
func TestReadmeProgramBuildsAndRuns(t *testing.T) {
	t.Parallel()
	bin := buildReadmeProgram(t, "shop", "main.go", "migrations/0001_orders.sql", "migrations/0002_tax.sql")
	db := pgtest.New(t, pgtest.Options{Empty: true})
	env := processEnv(dbEnv(db)...)
	shop := programRunner(t, bin, env)

	code, stdout, _ := shop("--help")
	require.Equal(t, 0, code)
	require.Regexp(t, `(?m)^\s+place\s+place an order`, stdout)
	require.Contains(t, stdout, "worker")
	code, _, stderr := shop("migrate")
	require.Equal(t, 0, code, stderr)

	// Orders from before tax_cents existed, for the backfill.
	db.MustExec(t, `INSERT INTO orders (id, customer, cents) VALUES ('old-1', 'ada', 500), ('old-2', 'bob', 700)`)
	db.MustExec(t, `UPDATE orders SET tax_cents = NULL`)

	code, _, stderr = shop("place", "o-1", "ada", "1250")
	require.Equal(t, 0, code, stderr)
	code, _, stderr = shop("place", "o-1", "ada", "1250")
	require.Equal(t, 1, code)
	require.Regexp(t, `^CONFLICT: `, stderr, "the same order twice")
	code, _, stderr = shop("place", "o-2", "ada")
	require.Equal(t, 1, code)
	require.Regexp(t, `^INVALID_ARGUMENT: place takes ORDER CUSTOMER CENTS`, stderr)
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'ship_order' AND queue LIKE 'shard\_%'`))

	worker := startProgramWorker(t, bin, env)

	workertest.WaitFor(t, 60*time.Second, "the order shipped, the customer reconciled, the event audited", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM orders WHERE id = 'o-1' AND state = 'shipped'`) == 1 &&
			db.MustCount(t, `SELECT count(*) FROM customers WHERE id = 'ada' AND orders = 2 AND cents = 1750`) == 1 &&
			db.MustCount(t, `SELECT count(*) FROM order_audit WHERE order_id = 'o-1' AND (payload->>'cents')::int = 1250 AND payload->>'customer' = 'ada'`) == 1
	})
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM order_audit`), "one event, audited once")

	code, _, stderr = shop("backfill", "start", "order_tax")
	require.Equal(t, 0, code, stderr)
	workertest.WaitFor(t, 60*time.Second, "the backfill filled tax_cents", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM orders WHERE tax_cents IS NULL`) == 0
	})
	require.Equal(t, 3, db.MustCount(t, `SELECT count(*) FROM orders WHERE tax_cents = cents / 5`))

	worker.stop(t)
}

// buildReadmeProgram extracts the docs' blocks of program name (marked
// <!-- readme-test: name/… -->; want are the paths it must have), writes them
// inside the module (so they build against this code) in a directory that
// ./... skips, and builds the program.
func buildReadmeProgram(t *testing.T, name string, want ...string) string {
	t.Helper()
	pkg := extractDocProgram(t, name, want...)
	return buildPkg(t, t.TempDir(), pkg)
}

// programRunner runs bin with args in env and returns its exit code and output.
func programRunner(t *testing.T, bin string, env []string) func(args ...string) (code int, stdout, stderr string) {
	return func(args ...string) (int, string, string) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Env = env
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		err := cmd.Run()
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode(), o.String(), e.String()
		}
		require.NoError(t, err)
		return 0, o.String(), e.String()
	}
}

// programWorker is a `worker` process of a program built from the README.
type programWorker struct {
	cmd    *exec.Cmd
	log    bytes.Buffer
	exited chan error
}

// startProgramWorker starts `bin worker` in env; it is stopped (or killed) at
// cleanup.
func startProgramWorker(t *testing.T, bin string, env []string) *programWorker {
	t.Helper()
	w := &programWorker{cmd: exec.Command(bin, "worker"), exited: make(chan error, 1)}
	w.cmd.Env = env
	w.cmd.Stdout, w.cmd.Stderr = &w.log, &w.log
	require.NoError(t, w.cmd.Start())
	go func() { w.exited <- w.cmd.Wait() }()
	t.Cleanup(func() {
		_ = w.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-w.exited:
		case <-time.After(30 * time.Second):
			_ = w.cmd.Process.Kill()
		}
	})
	return w
}

// stop sends SIGTERM and requires a clean exit within 30 s, with no error logged.
func (w *programWorker) stop(t *testing.T) {
	t.Helper()
	require.NoError(t, w.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-w.exited:
		w.exited <- err // for the cleanup
		require.NoError(t, err, "the worker stops cleanly on SIGTERM:\n%s", w.log.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("the worker did not stop within 30 s of SIGTERM:\n%s", w.log.String())
	}
	require.NotContains(t, strings.ToLower(w.log.String()), `"level":"error"`, "the worker logged no error")
}
