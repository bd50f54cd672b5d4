package workflowworker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/workflow"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

// These tests hold a step's fenced transaction open (the real step worker's,
// with the instance row locked by LockTx) and signal the workflow meanwhile:
// the signal must not wait for the step, and must not be lost by the await
// the step then commits, whichever of the two commits first.

// gate holds the step of one workflow in its transaction until released.
type gate struct {
	entered chan struct{} // closed when the step is inside its transaction
	release chan struct{} // closed by the test to let it go on
	once    sync.Once
}

var gates sync.Map // workflow id -> *gate

func newGate(id string) *gate {
	g := &gate{entered: make(chan struct{}), release: make(chan struct{})}
	gates.Store(id, g)
	return g
}

type gateIn struct {
	// Finish makes step hold finish the workflow instead of awaiting "go".
	Finish bool `json:"finish,omitempty"`
	// Timeout is the await's (none by default; the sim clock never reaches
	// it, but its job is due then, on River's clock).
	Timeout time.Duration `json:"timeout,omitempty"`
}

// gateWorkflow: step hold waits in its transaction for its gate, then awaits
// "go" with no deadline (or finishes, with Finish); got finishes with the
// signal's n. Nothing but a signal's wake-up resumes the await: no deadline,
// so no timer sweep, and its job is scheduled an hour out.
func gateWorkflow() *workflow.Workflow[gateIn, struct{}, int] {
	return &workflow.Workflow[gateIn, struct{}, int]{
		Kind: "gate",
		Steps: []workflow.Step[struct{}]{
			{Name: "hold", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[struct{}]) (workflow.Next, error) {
				v, _ := gates.Load(c.WorkflowID)
				g := v.(*gate)
				g.once.Do(func() { close(g.entered) })
				select {
				case <-g.release:
				case <-ctx.Done():
					return workflow.Next{}, ctx.Err()
				}
				var in gateIn
				if err := json.Unmarshal(c.Input, &in); err != nil {
					return workflow.Next{}, err
				}
				if in.Finish {
					return workflow.Finish(0), nil
				}
				return workflow.AwaitSignal("go", in.Timeout, "got", "got"), nil
			}},
			{Name: "got", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[struct{}]) (workflow.Next, error) {
				if c.TimedOut {
					return workflow.Finish(-1), nil
				}
				var p struct {
					N int `json:"n"`
				}
				if err := c.Signal.Decode(&p); err != nil {
					return workflow.Next{}, err
				}
				return workflow.Finish(p.N), nil
			}},
		},
		Signals: []string{"go"},
	}
}

// holdStep starts gate workflow id and returns once its step hold is inside
// its fenced transaction, having checked that the transaction holds the
// workflow's row (a NOWAIT lock of it fails).
func holdStep(t *testing.T, e *env, id string, in gateIn) *gate {
	t.Helper()
	g := newGate(id)
	startWF(t, e.db.Pool, "gate", in, id)
	select {
	case <-g.entered:
	case <-time.After(time.Minute):
		t.Fatalf("step hold of %s never ran", id)
	}
	_, err := e.db.Pool.Exec(context.Background(), `SELECT 1 FROM compute_workflows WHERE id = $1 FOR NO KEY UPDATE NOWAIT`, id)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr) && pgErr.Code == "55P03", "the step's transaction does not hold the row of %s: %v", id, err)
	return g
}

// signalOpen sends "go" with n to id in a transaction it leaves open, and
// returns it with how long SignalTx took (at most 5 s: a SignalTx that waits
// for the step fails).
func signalOpen(t *testing.T, e *env, id string, n int) (pgx.Tx, time.Duration, workflow.SignalResult) {
	t.Helper()
	ctx := context.Background()
	tx, err := e.db.Pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	began := time.Now()
	res, err := workflow.SignalTx(sctx, tx, id, "go", map[string]int{"n": n}, nil)
	took := time.Since(began)
	require.NoError(t, err, "SignalTx to %s while its step runs", id)
	return tx, took, res
}

// backendPID is the server process of tx's connection.
func backendPID(t *testing.T, tx pgx.Tx) int {
	t.Helper()
	var pid int
	require.NoError(t, tx.QueryRow(context.Background(), `SELECT pg_backend_pid()`).Scan(&pid))
	return pid
}

// waitCommitBlockedBy waits until a transaction's COMMIT waits for the
// backend pid (true), or until workflow id's seq has moved past 1 (false: the
// step committed without waiting), up to 10 s.
func waitCommitBlockedBy(t *testing.T, e *env, pid int, id string) bool {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if e.db.MustCount(t, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid)) AND query ILIKE 'commit%'`, pid) > 0 {
			return true
		}
		if e.db.MustCount(t, `SELECT count(*) FROM compute_workflows WHERE id = $1 AND seq > 1`, id) > 0 {
			return false
		}
	}
	t.Fatalf("the step of %s neither committed nor waited for the signal's transaction in 10 s", id)
	return false
}

// finish waits for workflow id to finish, up to 10 s: far below the hour its
// await's job is scheduled for, so a lost wake-up fails it.
func finish(t *testing.T, e *env, id string) *workflow.Info {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	i, err := workflow.Wait(ctx, e.db.Pool, id, 10*time.Millisecond)
	require.NoError(t, err, "workflow %s did not finish: its signal was lost", id)
	return i
}

// TestSignalDuringAStepReturnsAtOnceAndResumesTheAwait: while a step of the
// workflow holds its fenced transaction (and the workflow's row) open,
// SignalTx returns at once; the await the step then commits is resumed by
// that signal, whether the signal committed before the step's COMMIT, or only
// after it (the step's COMMIT waits for the signal's transaction, then wakes
// the await).
func TestSignalDuringAStepReturnsAtOnceAndResumesTheAwait(t *testing.T) {
	t.Parallel()
	e := start(t, gateWorkflow())
	ctx := context.Background()

	// The signal commits while the step still runs.
	g := holdStep(t, e, "gate-before", gateIn{})
	tx, took, res := signalOpen(t, e, "gate-before", 7)
	require.Positive(t, res.ID)
	require.NoError(t, tx.Commit(ctx))
	close(g.release)
	i := finish(t, e, "gate-before")
	require.Equal(t, workflow.Completed, i.Status, i.Error)
	require.JSONEq(t, `7`, string(i.Result))
	require.Less(t, took, time.Second)
	t.Logf("SignalTx while the step holds the row: %s (signal committed before the step)", took)

	// The signal's transaction is still open when the step's COMMIT begins:
	// that COMMIT waits for it, then sees the signal.
	g = holdStep(t, e, "gate-after", gateIn{})
	tx, took, res = signalOpen(t, e, "gate-after", 8)
	require.Positive(t, res.ID)
	pid := backendPID(t, tx)
	close(g.release)
	require.True(t, waitCommitBlockedBy(t, e, pid, "gate-after"),
		"the step committed its await without waiting for the signal in flight")
	require.NoError(t, tx.Commit(ctx))
	i = finish(t, e, "gate-after")
	require.Equal(t, workflow.Completed, i.Status, i.Error)
	require.JSONEq(t, `8`, string(i.Result))
	require.Less(t, took, time.Second)
	t.Logf("SignalTx while the step holds the row: %s (signal committed after the step's COMMIT began)", took)

	// An await whose deadline is near (its job inserted available, due at the
	// deadline): the signal already in the inbox makes it due at once.
	g = holdStep(t, e, "gate-short", gateIn{Timeout: 4 * time.Second})
	tx, _, _ = signalOpen(t, e, "gate-short", 9)
	require.NoError(t, tx.Commit(ctx))
	close(g.release)
	i = finish(t, e, "gate-short")
	require.JSONEq(t, `9`, string(i.Result))
	require.Equal(t, 1, e.db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'workflow_step'
		AND args->>'workflow_id' = 'gate-short' AND args->>'seq' = '2' AND scheduled_at <= created_at`),
		"the await's job was not made due at once")
	require.Zero(t, e.db.MustCount(t, `SELECT count(*) FROM compute_workflow_signals WHERE consumed_at IS NULL`))
}

// TestSignalDuringAFinishingStep: a signal sent while the step that finishes
// the workflow runs returns at once, accepted: it commits before the finish
// (whose COMMIT waits for it) and stays in the inbox, unconsumed. Once the
// finish has committed, a signal is CONFLICT.
func TestSignalDuringAFinishingStep(t *testing.T) {
	t.Parallel()
	e := start(t, gateWorkflow())
	ctx := context.Background()
	const id = "gate-finish"
	g := holdStep(t, e, id, gateIn{Finish: true})
	tx, took, res := signalOpen(t, e, id, 1)
	require.Positive(t, res.ID)
	require.Less(t, took, time.Second)
	pid := backendPID(t, tx)
	close(g.release)
	require.True(t, waitCommitBlockedBy(t, e, pid, id), "the finish committed without waiting for the signal in flight")
	info, err := workflow.Get(ctx, e.db.Pool, id)
	require.NoError(t, err)
	require.Equal(t, workflow.Running, info.Status, "the finish committed before the signal it waits for")
	require.NoError(t, tx.Commit(ctx))
	i := finish(t, e, id)
	require.Equal(t, workflow.Completed, i.Status)
	require.Equal(t, 1, e.db.MustCount(t, `SELECT count(*) FROM compute_workflow_signals WHERE workflow_id = $1 AND consumed_at IS NULL`, id))

	err = pg.InTx(ctx, e.db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		_, err := workflow.SignalTx(ctx, tx, id, "go", nil, nil)
		return err
	})
	require.True(t, fault.Has(err, fault.Conflict), "a signal after the finish: %v", err)
	t.Logf("SignalTx while the finishing step holds the row: %s", took)
}

// TestARepeatedSignalDuringItsConsumptionDoesNotDeadlock: a repeat of a
// signal (same dedup key) sent while the step that consumes the first one is
// between its consuming UPDATE and its COMMIT waits for that step, and is a
// duplicate; the step commits. The step's transaction is played by hand, as
// the step worker writes it: the row locked FOR NO KEY UPDATE (LockTx), the
// signal's row updated (consumeSQL), the workflow's row updated with a wait
// (which arms the barrier), COMMIT. Before the fix the repeat took the row
// FOR KEY SHARE, then waited in its insert's unique check for the step, whose
// COMMIT waited for that lock: deadlock (40P01), as docs/workflows.md's checkout
// program met it when paid twice.
func TestARepeatedSignalDuringItsConsumptionDoesNotDeadlock(t *testing.T) {
	t.Parallel()
	e := start(t, gateWorkflow())
	ctx := context.Background()
	const id = "gate-repeat"
	g := holdStep(t, e, id, gateIn{})
	close(g.release)
	waitStatus(t, e.db.Pool, id, workflow.Waiting)

	step, err := e.db.Pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = step.Rollback(ctx) })
	_, err = step.Exec(ctx, `SELECT 1 FROM compute_workflows WHERE id = $1 FOR NO KEY UPDATE`, id)
	require.NoError(t, err)
	first := signal(t, e.db.Pool, id, "go", map[string]int{"n": 5}, "pay")
	require.Positive(t, first.ID)
	_, err = step.Exec(ctx, `UPDATE compute_workflow_signals SET consumed_at = NULL WHERE id = $1`, first.ID)
	require.NoError(t, err)
	_, err = step.Exec(ctx, `UPDATE compute_workflows SET wait = wait WHERE id = $1`, id)
	require.NoError(t, err)
	stepPID := backendPID(t, step)

	type result struct {
		res workflow.SignalResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		var res workflow.SignalResult
		err := pg.InTx(ctx, e.db.Pool, func(ctx context.Context, tx pgx.Tx) error {
			var err error
			res, err = workflow.SignalTx(ctx, tx, id, "go", map[string]int{"n": 6}, &workflow.SignalOpts{DedupKey: "pay"})
			return err
		})
		done <- result{res, err}
	}()
	require.Eventually(t, func() bool {
		return e.db.MustCount(t, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`, stepPID) > 0
	}, 10*time.Second, 5*time.Millisecond, "the repeated signal never waited for the consuming step")
	require.NoError(t, step.Commit(ctx), "the consuming step's COMMIT")
	select {
	case r := <-done:
		require.NoError(t, r.err, "the repeated signal")
		require.True(t, r.res.Duplicate)
	case <-time.After(10 * time.Second):
		t.Fatal("the repeated signal did not return after the step committed")
	}
	i := finish(t, e, id)
	require.JSONEq(t, `5`, string(i.Result))
	require.Equal(t, 1, e.db.MustCount(t, `SELECT count(*) FROM compute_workflow_signals WHERE workflow_id = $1`, id))
}

// TestAStepsCommitWaitsForASignalNoLongerThanItsStatementTimeout: a sender
// that keeps its transaction open after SignalTx holds up the COMMIT of the
// step that awaits (its barrier waits for the signal), but no longer than the
// step's statement timeout (2 s here): that COMMIT fails with a lock timeout,
// nothing of the step is written, and the step is retried; once the signal
// commits, the step commits its await and the signal resumes it.
func TestAStepsCommitWaitsForASignalNoLongerThanItsStatementTimeout(t *testing.T) {
	t.Parallel()
	e := startOn(t, pgtest.New(t, pgtest.Options{StatementTimeout: 2 * time.Second}), gateWorkflow())
	ctx := context.Background()
	const id = "gate-slow-sender"
	g := holdStep(t, e, id, gateIn{})
	tx, _, _ := signalOpen(t, e, id, 5)
	// A sender the server does not time out (the pool's transactions end at
	// its idle-in-transaction timeout, the statement timeout too).
	_, err := tx.Exec(ctx, `SET LOCAL idle_in_transaction_session_timeout = 0`)
	require.NoError(t, err)
	pid := backendPID(t, tx)
	close(g.release)
	require.True(t, waitCommitBlockedBy(t, e, pid, id), "the step committed its await without waiting for the signal in flight")
	var timedOut string
	for deadline := time.Now().Add(20 * time.Second); timedOut == ""; time.Sleep(50 * time.Millisecond) {
		require.True(t, time.Now().Before(deadline), "the step's COMMIT waited for the open signal past its statement timeout")
		require.NoError(t, e.db.QueryRow(ctx, `SELECT coalesce(string_agg(e->>'error', '; '), '') FROM river_job j, unnest(j.errors) e
			WHERE j.kind = 'workflow_step' AND j.args->>'workflow_id' = $1`, id).Scan(&timedOut))
	}
	require.Contains(t, timedOut, "lock timeout")
	require.Zero(t, e.db.MustCount(t, `SELECT count(*) FROM compute_workflow_history WHERE workflow_id = $1`, id))
	require.NoError(t, tx.Commit(ctx))
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	i, err := workflow.Wait(wctx, e.db.Pool, id, 20*time.Millisecond)
	require.NoError(t, err, "the signal was lost")
	require.Equal(t, workflow.Completed, i.Status, i.Error)
	require.JSONEq(t, `5`, string(i.Result))
	t.Logf("the step's COMMIT gave up on the open signal: %s", timedOut)
}

type tallyIn struct {
	N int `json:"n"`
}

type tally struct {
	N   int `json:"n"`
	Got int `json:"got"`
	Sum int `json:"sum"`
}

// inSteps tells each tally's sender that a step of its workflow runs, having
// consumed the number of signals it sends (workflow id -> chan int).
var inSteps sync.Map

// tallyWorkflow awaits "add" (no deadline) until it has consumed N of them,
// one per step, and finishes with their count and sum. Each step, once it has
// consumed its signal, tells the workflow's sender (inSteps), then holds its
// transaction a random 0 to 2 ms before it commits the next await.
func tallyWorkflow() *workflow.Workflow[tallyIn, tally, tally] {
	await := workflow.AwaitSignal("add", 0, "add", "")
	running := func(ctx context.Context, tx pgx.Tx, c *workflow.Call[tally]) error {
		if ch, ok := inSteps.Load(c.WorkflowID); ok {
			select {
			case ch.(chan int) <- c.State.Got:
			default:
			}
		}
		_, err := tx.Exec(ctx, `SELECT pg_sleep($1)`, float64(rand.IntN(2000))/1e6)
		return err
	}
	return &workflow.Workflow[tallyIn, tally, tally]{
		Kind: "tally",
		Init: func(in tallyIn) (tally, error) { return tally{N: in.N}, nil },
		Steps: []workflow.Step[tally]{
			{Name: "open", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[tally]) (workflow.Next, error) {
				return await, running(ctx, tx, c)
			}},
			{Name: "add", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[tally]) (workflow.Next, error) {
				var p struct {
					N int `json:"n"`
				}
				if err := c.Signal.Decode(&p); err != nil {
					return workflow.Next{}, err
				}
				c.State.Got++
				c.State.Sum += p.N
				if c.State.Got == c.State.N {
					return workflow.Finish(c.State), nil
				}
				return await, running(ctx, tx, c)
			}},
		},
		Signals: []string{"add"},
	}
}

// TestSignalsRacingAwaitsLoseNoWakeUp: 16 workflows each await "add" 30
// times in a loop. Each has a sender that sends its next signal while the
// step that will commit the next await runs: it waits for that step to start,
// then after a random 0 to 3 ms sends the signal, holding its transaction a
// random 0 to 3 ms more before it commits; the step commits 0 to 2 ms after
// it started. So each of the 480 signals races the await it must resume (it
// commits before the step reads, or between that read and the step's COMMIT,
// or after it), and it is the only signal the workflow gets until that await
// resumes: a lost wake-up stops the workflow for good. Every workflow consumes
// its 30 and completes within a minute; nothing else would resume a lost
// wake-up in that time (the awaits have no deadline, so no timer sweep, and
// their jobs are scheduled an hour out).
func TestSignalsRacingAwaitsLoseNoWakeUp(t *testing.T) {
	t.Parallel()
	const (
		flows = 16
		each  = 30
	)
	e := start(t, tallyWorkflow())
	ctx := context.Background()
	ids := make([]string, flows)
	steps := make([]chan int, flows)
	for f := range ids {
		ids[f] = fmt.Sprintf("tally-%02d", f)
		steps[f] = make(chan int, 4)
		inSteps.Store(ids[f], steps[f])
	}
	began := time.Now()
	for f := range ids {
		startWF(t, e.db.Pool, "tally", tallyIn{N: each}, ids[f])
	}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		slowest time.Duration
	)
	errs := make(chan error, flows)
	for f := range flows {
		wg.Go(func() {
			for k := 1; k <= each; k++ {
				// The step that has consumed k-1 signals runs (a retry of an
				// earlier one may say an older count: skipped).
				for got := -1; got != k-1; {
					select {
					case got = <-steps[f]:
					case <-time.After(time.Minute):
						errs <- fmt.Errorf("workflow %s: no step ran after signal %d in a minute: its wake-up was lost", ids[f], k-1)
						return
					}
				}
				time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
				hold := time.Duration(rand.IntN(3000)) * time.Microsecond
				err := pg.InTx(ctx, e.db.Pool, func(ctx context.Context, tx pgx.Tx) error {
					began := time.Now()
					_, err := workflow.SignalTx(ctx, tx, ids[f], "add", map[string]int{"n": k}, nil)
					mu.Lock()
					slowest = max(slowest, time.Since(began))
					mu.Unlock()
					time.Sleep(hold)
					return err
				})
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for _, id := range ids {
		out, err := tallyWorkflow().Wait(wctx, e.db.Pool, id, 20*time.Millisecond)
		require.NoError(t, err, "workflow %s did not consume its %d signals: a wake-up was lost", id, each)
		require.Equal(t, tally{N: each, Got: each, Sum: each * (each + 1) / 2}, out)
	}
	require.Zero(t, e.db.MustCount(t, `SELECT count(*) FROM compute_workflow_signals WHERE consumed_at IS NULL`))
	require.Equal(t, flows*each, e.db.MustCount(t, `SELECT count(DISTINCT (workflow_id, consumed_seq)) FROM compute_workflow_signals`),
		"each signal consumed by a step of its own")
	t.Logf("%d workflows x %d signals, each sent while the step committing the await it resumes ran: all consumed in %s (slowest SignalTx %s)",
		flows, each, time.Since(began).Round(time.Millisecond), slowest.Round(time.Millisecond))
}
