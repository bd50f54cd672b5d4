package demo

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/cmd/better-compute/cli"
	"github.com/bettercompute/bettercompute/cmd/better-compute/cli/clitest"
	"github.com/bettercompute/bettercompute/domain/backfill"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestDevRunsTheDemoApplication: dev of the better-compute binary (the demo
// application) migrates the demos' tables and runs their Dev loops: the
// counters are reconciled and the demo backfill runs under its own job kind.
// Its verbs know the demo backfill and its doctor the demo reconciler; an
// application without the demos knows neither.
func TestDevRunsTheDemoApplication(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	env := []string{"BETTER_COMPUTE_DATABASE_URL=" + db.URL, "BETTER_COMPUTE_LOG_LEVEL=warn",
		"BETTER_COMPUTE_LISTEN=127.0.0.1:0", "BETTER_COMPUTE_POLL_INTERVAL=20ms"}
	app := cli.App{Modules: Modules()}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan clitest.Result, 1)
	go func() { done <- clitest.Run(t, ctx, app, env, "dev") }()
	workertest.WaitFor(t, 60*time.Second, "the demo backfill's batches and reconciled counters", func() bool {
		var batches, reconciled int
		err := db.QueryRow(context.Background(), `SELECT
			(SELECT count(*) FROM river_job WHERE kind = 'backfill_demo_greetings' AND state = 'completed'),
			(SELECT count(*) FROM demo_counters WHERE value > 0 AND reconciled = value)`).Scan(&batches, &reconciled)
		return err == nil && batches >= 2 && reconciled >= 1
	})
	p, err := backfill.Get(context.Background(), db.Pool, DemoBackfill)
	require.NoError(t, err)
	require.Equal(t, backfill.Running, p.State)
	require.Greater(t, p.RowsDone, int64(0))

	r := clitest.Run(t, context.Background(), app, env, "backfill", "status", DemoBackfill)
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Regexp(t, `(?m)^state:\s+running`, r.Stdout)
	r = clitest.Run(t, context.Background(), cli.App{}, env, "backfill", "status", DemoBackfill)
	require.Equal(t, 1, r.Code, "an application without the demos does not know it")
	require.Contains(t, r.Stderr, "NOT_FOUND: unknown backfill")
	cancel()
	select {
	case r := <-done:
		require.Equal(t, 0, r.Code, r.Stderr)
	case <-time.After(60 * time.Second):
		t.Fatal("dev did not stop")
	}

	// A dirty key of the demo reconciler: the demo application's doctor knows
	// the kind, an application without the demos names it as unhandled.
	require.NoError(t, pg.InTx(context.Background(), db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		return workers.DirtyTx(context.Background(), tx, DemoReconciler, "counter-999", nil)
	}))
	r = clitest.Run(t, context.Background(), app, env, "doctor")
	require.NotRegexp(t, `(?m)^FAIL\s+reconcilers\s`, r.Stdout)
	r = clitest.Run(t, context.Background(), cli.App{}, env, "doctor")
	require.Regexp(t, `(?m)^FAIL\s+reconcilers\s+.*`+DemoReconciler+` \(\d+ keys?\)`, r.Stdout)
}

// TestDevTraceShowsARequestToItsDelivery: dev --trace prints, on stderr, the
// demo application's request (an order placed) and the spans it caused in the
// same trace: the workflow's steps and the outbox delivery of the event a step
// appended; and a counter's change with the reconcile it caused.
func TestDevTraceShowsARequestToItsDelivery(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	environ := []string{"BETTER_COMPUTE_DATABASE_URL=" + db.URL, "BETTER_COMPUTE_LOG_LEVEL=warn",
		"BETTER_COMPUTE_LISTEN=127.0.0.1:0", "BETTER_COMPUTE_POLL_INTERVAL=20ms"}
	stdout, stderr := &clitest.Buffer{}, &clitest.Buffer{}
	ctx, cancel := context.WithCancel(context.Background())
	code := make(chan int, 1)
	go func() {
		code <- cli.Run(ctx, cli.App{Modules: Modules()}, []string{"dev", "--trace"},
			cli.Env{Stdout: stdout, Stderr: stderr, Environ: clitest.WithStatementCache(environ)})
	}()
	defer func() {
		cancel()
		select {
		case c := <-code:
			require.Equal(t, 0, c, stderr.String())
		case <-time.After(60 * time.Second):
			t.Error("dev did not stop within 60 s")
		}
	}()
	// trace id -> the names of the spans printed in it
	traces := func() map[string][]string {
		out := map[string][]string{}
		for _, line := range strings.Split(stderr.String(), "\n") {
			f := strings.Fields(line)
			if len(f) < 4 || f[0] != "span" || !strings.HasPrefix(f[3], "trace=") {
				continue
			}
			id := strings.TrimPrefix(f[3], "trace=")
			out[id] = append(out[id], f[1])
		}
		return out
	}
	has := func(names []string, name string) bool { return slices.Contains(names, name) }
	workertest.WaitFor(t, 90*time.Second, "an order's trace from the request to its delivery, and a counter's to its reconcile", func() bool {
		var order, counter bool
		for _, names := range traces() {
			order = order || has(names, "demo.place_order") && has(names, "bettercompute.workflow.step") &&
				has(names, "bettercompute.outbox.deliver")
			counter = counter || has(names, "demo.change_counter") && has(names, "bettercompute.reconcile")
		}
		return order && counter
	})
}
