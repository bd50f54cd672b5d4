package workers_test

import (
	"context"
	"encoding/json"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/workflow"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

// tallyState is the example's TallyState (also its result).
type tallyState struct {
	N   int   `json:"n"`
	Got int   `json:"got"`
	Sum int64 `json:"sum"`
}

// TestWorkflowProcessSIGSTOPMidStepTakesSignals: a worker process is paused
// (SIGSTOP) inside the first step of the example's tally workflow, its
// transaction open and the workflow's row locked; 25 signals sent to the
// workflow meanwhile each return at once (none waits for the paused step, whose
// transaction the server would only end at its 60 s idle timeout). Woken
// (SIGCONT), the step commits its await, and the workflow consumes all 25
// signals, one step each, and completes: none was lost.
func TestWorkflowProcessSIGSTOPMidStepTakesSignals(t *testing.T) {
	t.Parallel()
	db := appDB(t)
	ctx := context.Background()
	// open holds its transaction 2 s (the pause comes inside that); the
	// idle-in-transaction timeout is the statement timeout, 60 s; a 10 s lease
	// outlives the pause.
	w := startWorker(t, db, "EXAMPLE_TALLY_HOLD=2s", "BETTER_COMPUTE_STATEMENT_TIMEOUT=60s",
		"BETTER_COMPUTE_LEASE_TTL=10s", "BETTER_COMPUTE_LEASE_RENEW=1s")
	workertest.WaitFor(t, 20*time.Second, "the worker holds every shard", func() bool { return leasesOf(t, db, w) == 16 })

	const n = 25
	const id = "tally-1"
	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		_, err := startKind(ctx, tx, "example_tally", map[string]int{"n": n}, &workflow.StartOpts{ID: id})
		return err
	}))
	// The step is inside its transaction once its effect insert has run and it
	// sleeps: its connection is idle in transaction, its last query the insert.
	inStep := func() int {
		return db.MustCount(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND state = 'idle in transaction' AND query LIKE 'INSERT INTO example_workflow_effects%'`)
	}
	workertest.WaitFor(t, 20*time.Second, "the worker is inside step open", func() bool { return inStep() == 1 })
	require.NoError(t, w.cmd.Process.Signal(syscall.SIGSTOP))
	pausedAt := time.Now()

	var total, slowest time.Duration
	var sum int64
	for i := range n {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		began := time.Now()
		err := pg.InTx(sctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
			_, err := workflow.SignalTx(ctx, tx, id, "add", map[string]int64{"amount": int64(i + 1)}, nil)
			return err
		})
		took := time.Since(began)
		cancel()
		require.NoError(t, err, "signal %d, sent while the worker is paused mid-step, did not return in 5 s", i)
		require.Less(t, took, time.Second, "signal %d waited for the paused step", i)
		total += took
		slowest = max(slowest, took)
		sum += int64(i + 1)
	}
	// The signals were all sent while the step's transaction stayed open.
	require.Equal(t, 1, inStep(), "the paused step's transaction ended before the signals were sent")
	require.Equal(t, n, db.MustCount(t, `SELECT count(*) FROM compute_workflow_signals WHERE workflow_id = $1 AND consumed_at IS NULL`, id))
	paused := time.Since(pausedAt)
	require.NoError(t, w.cmd.Process.Signal(syscall.SIGCONT))

	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	i, err := workflow.Wait(wctx, db.Pool, id, 20*time.Millisecond)
	require.NoError(t, err, "the tally did not complete after SIGCONT: a signal was lost")
	require.Equal(t, workflow.Completed, i.Status, "%s", i.Error)
	var got tallyState
	require.NoError(t, json.Unmarshal(i.Result, &got))
	require.Equal(t, tallyState{N: n, Got: n, Sum: sum}, got)
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM compute_workflow_signals WHERE workflow_id = $1 AND consumed_at IS NULL`, id))
	require.Equal(t, n, db.MustCount(t, `SELECT count(DISTINCT consumed_seq) FROM compute_workflow_signals WHERE workflow_id = $1`, id),
		"each signal consumed by a step of its own")
	require.Equal(t, 1, db.MustCount(t, `SELECT n FROM example_workflow_effects WHERE workflow_id = $1 AND step = 'open'`, id),
		"open committed once")
	t.Logf("%d signals sent to a workflow whose step's transaction a paused (SIGSTOP) worker held open: %s in all, the slowest %s; paused %s; all %d consumed after SIGCONT",
		n, total.Round(time.Millisecond), slowest.Round(time.Millisecond), paused.Round(time.Millisecond), n)
}
