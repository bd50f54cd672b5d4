// Package clitest tests an application built on Better Compute from its own
// _test.go files: a kit with the application's database, clock and workers
// (Start), and its command lines run in-process (Run).
//
// # The kit
//
// Start gives a test a fresh database migrated by the application's own
// migrate command, compute_now() on a sim clock that moves only when the test
// says (Advance), and a worker runtime of the application's modules in the
// test's process. The test changes state as the application does, in one
// transaction (InTx), and waits for what the workers do with it: a reconcile
// (WaitReconciled), River jobs (WaitJobs), an outbox sink's delivery
// (WaitDelivered), a workflow's end (WaitWorkflow). Every wait reads the
// database, polls, and fails the test after Options.Timeout (30 s) saying what
// it waited for and what it saw last.
//
//	func TestMain(m *testing.M) { clitest.Main(m) }
//
//	func TestPlaceOrder(t *testing.T) {
//		k := clitest.Start(t, cli.App{Modules: []cli.Module{shop.Module()}}, nil)
//		k.InTx(func(ctx context.Context, tx pgx.Tx) error {
//			return shop.PlaceOrderTx(ctx, tx, "o-1", "ada", 1250)
//		})
//		k.WaitReconciled("customer", "ada") // the customer's totals
//		shipped := k.WaitJobs("ship_order") // the fenced job, completed
//		k.WaitDelivered("audit")            // the sink has every event
//		…assert on k.DB…
//
//		k.Advance(72 * time.Hour)           // compute_now() moves; timers fire
//		info := k.WaitWorkflow("order-o-1") // completed, failed or cancelled
//	}
//
// The first Start of a test binary starts an embedded PostgreSQL cluster (or
// uses the server at TEST_DATABASE_URL: see platform/pgtest), which Main stops
// when the tests end. Each Start is a database of its own, so tests may run in
// parallel (t.Parallel).
//
// # Command lines
//
// Run runs one command line of an App in-process, the same cli.Run the
// binary's main calls, with its output captured; Kit.Run does it against the
// kit's database.
//
//	r := clitest.Run(t, ctx, app, []string{"BETTER_COMPUTE_DATABASE_URL=" + db.URL}, "doctor")
//	require.Equal(t, 0, r.Code, r.Stderr)
package clitest

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/bettercompute/bettercompute/cmd/better-compute/cli"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

// Result is what one command line did: its exit code and its output.
type Result struct {
	Code           int
	Stdout, Stderr string
}

// Run runs one command line of app in-process, with env (KEY=VALUE) as its
// whole environment, and logs what it printed. It returns when the command
// does; cancel ctx to stop a long-running one (worker, serve, dev) as SIGTERM
// would. When the test pools keep prepared statements (pgtest.StatementCache),
// so does the command, unless env sets BETTER_COMPUTE_DB_STATEMENT_CACHE.
func Run(tb testing.TB, ctx context.Context, app cli.App, env []string, args ...string) Result {
	tb.Helper()
	env = WithStatementCache(env)
	var stdout, stderr bytes.Buffer
	code := cli.Run(ctx, app, args, cli.Env{Stdout: &stdout, Stderr: &stderr, Environ: env})
	tb.Logf("%s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, stdout.String(), stderr.String())
	return Result{code, stdout.String(), stderr.String()}
}

// WithStatementCache returns env with BETTER_COMPUTE_DB_STATEMENT_CACHE=true
// added when the tests run with TEST_DB_STATEMENT_CACHE=1 (see pgtest) and env
// does not set it, for a command line a test runs: env itself otherwise.
func WithStatementCache(env []string) []string {
	const name = "BETTER_COMPUTE_DB_STATEMENT_CACHE"
	if !pgtest.StatementCache() {
		return env
	}
	for _, kv := range env {
		if strings.HasPrefix(kv, name+"=") {
			return env
		}
	}
	return append(slices.Clip(env), name+"=true")
}

// Buffer is an output stream a running command writes while the test reads it
// (a bytes.Buffer behind a mutex): the Stdout or Stderr of a command started
// with cli.Run in a goroutine, such as dev.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write implements io.Writer.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String is what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
