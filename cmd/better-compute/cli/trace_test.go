package cli_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/cmd/better-compute/cli"
	"github.com/bettercompute/bettercompute/cmd/better-compute/cli/clitest"
	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

type tracedArgs struct {
	Payload string `json:"payload"`
}

func (tracedArgs) Kind() string { return "cli_traced" }

type tracedWorker struct {
	river.WorkerDefaults[tracedArgs]
}

func (*tracedWorker) Work(ctx context.Context, job *river.Job[tracedArgs]) error {
	return workers.InTx(ctx, job, func(context.Context, pgx.Tx) error { return nil })
}

// lineWith is the first line of s holding every one of parts, or "".
func lineWith(s string, parts ...string) string {
	for _, line := range strings.Split(s, "\n") {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			return line
		}
	}
	return ""
}

// TestDevTracePrintsSpans: dev --trace prints a line per span to stderr as it
// ends: the lease rounds, with their events, and a job's River work span with
// its shard, lease epoch and outcome, never the job's arguments.
func TestDevTracePrintsSpans(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	env := []string{"BETTER_COMPUTE_DATABASE_URL=" + db.URL, "BETTER_COMPUTE_LOG_LEVEL=warn",
		"BETTER_COMPUTE_LISTEN=127.0.0.1:0", "BETTER_COMPUTE_POLL_INTERVAL=20ms", "BETTER_COMPUTE_SHARDS=0"}
	app := cli.App{Modules: []cli.Module{{Name: "traced", Register: func(r *workers.Registry) error {
		return workers.AddWorker(r, &tracedWorker{})
	}}}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr clitest.Buffer
	done := make(chan int, 1)
	go func() {
		done <- cli.Run(ctx, app, []string{"dev", "--trace"}, cli.Env{Stdout: &stdout, Stderr: &stderr, Environ: clitest.WithStatementCache(env)})
	}()
	defer func() { t.Logf("stderr:\n%s", stderr.String()) }()

	workertest.WaitFor(t, 60*time.Second, "a lease round's span on stderr", func() bool {
		return lineWith(stderr.String(), "span bettercompute.lease.round ", "lease{", "lease.action=acquired", "shard=0") != ""
	})
	require.NoError(t, pg.InTx(context.Background(), db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		_, err := jobs.InsertTx(ctx, tx, tracedArgs{Payload: "cli-payload-93be"}, &river.InsertOpts{Queue: jobs.ShardQueue(0)})
		return err
	}))
	workertest.WaitFor(t, 60*time.Second, "the job's work span on stderr", func() bool {
		return lineWith(stderr.String(), "span river.work/cli_traced ", "shard=0", "lease.epoch=", "outcome=completed", "status=ok") != ""
	})
	require.NotContains(t, stderr.String(), "cli-payload-93be")

	cancel()
	select {
	case code := <-done:
		require.Equal(t, 0, code)
	case <-time.After(60 * time.Second):
		t.Fatal("dev did not stop")
	}
}

// TestDevTraceHelp: dev --help lists --trace.
func TestDevTraceHelp(t *testing.T) {
	t.Parallel()
	r := clitest.Run(t, context.Background(), cli.App{}, nil, "dev", "--help")
	require.Equal(t, 0, r.Code)
	require.Regexp(t, `--trace\s+print every span to stderr`, r.Stdout)
}

// TestBadOTELVariableFailsTheWorker: an unknown OTEL_TRACES_EXPORTER stops the
// worker before it starts, with INVALID_CONFIG naming the variable.
func TestBadOTELVariableFailsTheWorker(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a worker that starts runs until then
	defer cancel()
	r := clitest.Run(t, ctx, cli.App{}, append(dbEnv(db), "OTEL_TRACES_EXPORTER=jaeger"), "worker")
	require.Equal(t, 1, r.Code)
	require.Contains(t, r.Stderr, `INVALID_CONFIG: OTEL_TRACES_EXPORTER="jaeger"`)
	require.Equal(t, 0, db.MustCount(t, `SELECT count(*) FROM compute_leases`), "no lease taken")
}
