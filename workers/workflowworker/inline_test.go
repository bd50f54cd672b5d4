package workflowworker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/workflow"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/workertest"
	"github.com/bettercompute/bettercompute/workers/workflowworker"
)

// chainWorkflow is kind with n transactional steps s1 … sn: each writes its
// effect row (wf_effects) and goes to the next at once; sn finishes with the
// count. hook, if set, runs in each step's transaction before it returns.
func chainWorkflow(kind string, n int, hook func(ctx context.Context, tx pgx.Tx, c *workflow.Call[orderState]) error) *workflow.Workflow[orderIn, orderState, int] {
	steps := make([]workflow.Step[orderState], n)
	for i := range steps {
		steps[i] = workflow.Step[orderState]{Name: fmt.Sprintf("s%d", i+1), Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[orderState]) (workflow.Next, error) {
			if err := effect(ctx, tx, c); err != nil {
				return workflow.Next{}, err
			}
			if hook != nil {
				if err := hook(ctx, tx, c); err != nil {
					return workflow.Next{}, err
				}
			}
			if i+1 == n {
				return workflow.Finish(c.State.Steps), nil
			}
			return workflow.Goto(fmt.Sprintf("s%d", i+2)), nil
		}}
	}
	return &workflow.Workflow[orderIn, orderState, int]{Kind: kind, Steps: steps}
}

// startChains starts a runtime for defs on a fresh database, with opts.
func startChains(t *testing.T, opts workflowworker.Options, defs ...workflow.Definition) *env {
	t.Helper()
	db := pgtest.New(t)
	db.MustExec(t, effectsDDL)
	reg := workers.NewRegistry()
	require.NoError(t, workflowworker.Register(reg, &opts))
	for _, d := range defs {
		require.NoError(t, addWorkflow(reg, d))
	}
	return &env{db: db, rt: workertest.Start(t, db.Pool, reg, nil), reg: reg}
}

// jobSteps are the steps each step job of workflow id ran, by job id, from
// the history (which names the job of every step).
func jobSteps(t *testing.T, db *pgtest.DB, id string) map[int64][]string {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT job_id, array_agg(step ORDER BY seq) FROM compute_workflow_history
		WHERE workflow_id = $1 GROUP BY job_id`, id)
	require.NoError(t, err)
	out := map[int64][]string{}
	for rows.Next() {
		var job int64
		var steps []string
		require.NoError(t, rows.Scan(&job, &steps))
		out[job] = steps
	}
	require.NoError(t, rows.Err())
	return out
}

// requireChainOnce checks that workflow id completed with each of its n steps
// committed exactly once, in order.
func requireChainOnce(t *testing.T, db *pgtest.DB, id string, n int) {
	t.Helper()
	require.Equal(t, n, db.MustCount(t, `SELECT count(*) FROM wf_effects WHERE workflow_id = $1 AND n = 1`, id))
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM wf_effects WHERE workflow_id = $1 AND n <> 1`, id), "a step committed twice")
	want := make([]string, n)
	for i := range want {
		want[i] = fmt.Sprintf("s%d", i+1)
	}
	var got []string
	require.NoError(t, db.QueryRow(context.Background(), `SELECT array_agg(step ORDER BY seq) FROM compute_workflow_history WHERE workflow_id = $1`, id).Scan(&got))
	require.Equal(t, want, got)
}

// TestConsecutiveStepsRunInlineInOneJob: ten steps that each Goto the next run
// in one job execution, each in its own fenced transaction with its own
// history row naming that job; the job's metadata lists them, and no other
// step job exists.
func TestConsecutiveStepsRunInlineInOneJob(t *testing.T) {
	t.Parallel()
	e := startChains(t, workflowworker.Options{}, chainWorkflow("chain", 10, nil))
	id := startWF(t, e.db.Pool, "chain", orderIn{}, "c-1")
	i := wait(t, e.db.Pool, id)
	require.Equal(t, workflow.Completed, i.Status, i.Error)
	require.JSONEq(t, `10`, string(i.Result))
	requireChainOnce(t, e.db, id, 10)

	byJob := jobSteps(t, e.db, id)
	require.Len(t, byJob, 1, "one job ran the ten steps: %v", byJob)
	var job int64
	var meta []byte
	require.NoError(t, e.db.QueryRow(context.Background(), `SELECT id, metadata->'`+workflowworker.JobStepsKey+`' FROM river_job
		WHERE args->>'workflow_id' = $1`, id).Scan(&job, &meta))
	require.Contains(t, byJob, job)
	var listed []struct {
		Seq  int64  `json:"seq"`
		Step string `json:"step"`
	}
	require.NoError(t, json.Unmarshal(meta, &listed))
	require.Len(t, listed, 10)
	for n, s := range listed {
		require.Equal(t, int64(n+1), s.Seq)
		require.Equal(t, fmt.Sprintf("s%d", n+1), s.Step)
	}
	require.Equal(t, 1, e.db.MustCount(t, `SELECT count(*) FROM river_job WHERE args->>'workflow_id' = $1 AND state = 'completed'`, id))
}

// TestTheInlineBudgetHandsOverToANewJob: with a budget of 4 steps a job, ten
// steps take three jobs (4, 4 and 2 steps), one after the other; with a
// budget of 1 every step has a job of its own, as before inline steps.
func TestTheInlineBudgetHandsOverToANewJob(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		budget int
		jobs   []int
	}{{4, []int{4, 4, 2}}, {1, []int{1, 1, 1, 1, 1, 1, 1, 1, 1, 1}}} {
		t.Run(fmt.Sprintf("steps=%d", tc.budget), func(t *testing.T) {
			t.Parallel()
			e := startChains(t, workflowworker.Options{InlineSteps: tc.budget}, chainWorkflow("chain", 10, nil))
			id := startWF(t, e.db.Pool, "chain", orderIn{}, "c-1")
			require.Equal(t, workflow.Completed, wait(t, e.db.Pool, id).Status)
			requireChainOnce(t, e.db, id, 10)
			rows, err := e.db.Query(context.Background(), `SELECT count(*) FROM compute_workflow_history
				WHERE workflow_id = $1 GROUP BY job_id ORDER BY min(seq)`, id)
			require.NoError(t, err)
			sizes, err := pgx.CollectRows(rows, pgx.RowTo[int])
			require.NoError(t, err)
			require.Equal(t, tc.jobs, sizes)
			require.Equal(t, len(tc.jobs), e.db.MustCount(t, `SELECT count(*) FROM river_job WHERE args->>'workflow_id' = $1`, id))
		})
	}
}

// TestAnInlineStepThatFailsRetriesInAJobOfItsOwn: a step run inline that
// fails is handed to a new job for its seq, with the failed attempt counted
// (River's attempt 1 and its error), and retried after its backoff: every
// step still commits once, and the step's history row says attempt 2.
func TestAnInlineStepThatFailsRetriesInAJobOfItsOwn(t *testing.T) {
	t.Parallel()
	failed := false
	wf := chainWorkflow("chain", 5, func(ctx context.Context, tx pgx.Tx, c *workflow.Call[orderState]) error {
		if c.Step == "s3" && !failed {
			failed = true
			return fmt.Errorf("the gateway is down")
		}
		return nil
	})
	wf.Steps[2].Retry = workflow.Retry{Attempts: 3, Backoff: 10 * time.Millisecond}
	e := startChains(t, workflowworker.Options{}, wf)
	id := startWF(t, e.db.Pool, "chain", orderIn{}, "c-1")
	require.Equal(t, workflow.Completed, wait(t, e.db.Pool, id).Status)
	requireChainOnce(t, e.db, id, 5)
	var attempt int
	require.NoError(t, e.db.QueryRow(context.Background(), `SELECT attempt FROM compute_workflow_history WHERE workflow_id = $1 AND step = 's3'`, id).Scan(&attempt))
	require.Equal(t, 2, attempt, "the inline failure counts as the step's first attempt")
	var errs int
	require.NoError(t, e.db.QueryRow(context.Background(), `SELECT coalesce(array_length(errors, 1), 0) FROM river_job
		WHERE args->>'workflow_id' = $1 AND args->>'step' = 's3'`, id).Scan(&errs))
	require.Equal(t, 1, errs, "the new job carries the failed attempt's error")
	require.Equal(t, [][]string{{"s1", "s2"}, {"s3", "s4", "s5"}}, orderedJobSteps(t, e.db, id))
}

// orderedJobSteps are jobSteps in the order the jobs ran.
func orderedJobSteps(t *testing.T, db *pgtest.DB, id string) [][]string {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT array_agg(step ORDER BY seq) FROM compute_workflow_history
		WHERE workflow_id = $1 GROUP BY job_id ORDER BY min(seq)`, id)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[[]string])
	require.NoError(t, err)
	return out
}

// TestALeaseLostDuringAnInlineRunFencesTheNextStep: in the middle of an
// inline run the shard's lease expires while step s2 runs, and another owner
// takes it (the takeover waits for s2's transaction, whose fence holds the
// lease FOR KEY SHARE). No step after s2 commits while the other owner holds
// the lease (the next one's fence fails, or the run stops at the lease); once
// the lease comes back the workflow resumes at the first step not committed,
// and every step commits once.
func TestALeaseLostDuringAnInlineRunFencesTheNextStep(t *testing.T) {
	t.Parallel()
	var db *pgtest.DB
	stolen := make(chan error, 1)
	wf := chainWorkflow("chain", 6, func(ctx context.Context, tx pgx.Tx, c *workflow.Call[orderState]) error {
		if c.Step != "s2" {
			time.Sleep(20 * time.Millisecond) // the steps after s2 leave the takeover time to land
			return nil
		}
		if c.Attempt != 1 || len(stolen) > 0 {
			return nil
		}
		const shard = `(SELECT 'shard/' || substr(queue, length('shard_') + 1) FROM river_job WHERE args->>'workflow_id' = 'c-1' LIMIT 1)`
		// The lease expires now (a change no fence waits for), so the next
		// step's fence fails whatever the timing; the takeover then waits for
		// s2's transaction and holds the lease for 2 s.
		if _, err := db.Exec(ctx, `UPDATE compute_leases SET expires_at = compute_now() - interval '1 second' WHERE name = `+shard); err != nil {
			return err
		}
		go func() {
			_, err := db.Exec(context.Background(), `UPDATE compute_leases SET owner = 'thief#1', epoch = epoch + 1,
				expires_at = compute_now() + interval '2 seconds' WHERE name = `+shard)
			stolen <- err
		}()
		return nil
	})
	e := startChains(t, workflowworker.Options{}, wf)
	db = e.db
	id := startWF(t, e.db.Pool, "chain", orderIn{}, "c-1")
	require.NoError(t, <-stolen)
	written := e.db.MustCount(t, `SELECT count(*) FROM wf_effects WHERE workflow_id = $1`, id)
	require.Less(t, written, 6, "the lease was taken before the run ended")
	time.Sleep(500 * time.Millisecond) // well inside the other owner's 2 s
	require.Equal(t, written, e.db.MustCount(t, `SELECT count(*) FROM wf_effects WHERE workflow_id = $1`, id),
		"nothing is written while the lease is another owner's")
	i := wait(t, e.db.Pool, id)
	require.Equal(t, workflow.Completed, i.Status, i.Error)
	requireChainOnce(t, e.db, id, 6)
	require.Greater(t, e.db.MustCount(t, `SELECT count(DISTINCT lease_epoch) FROM compute_workflow_history WHERE workflow_id = $1`, id), 1,
		"the steps after the takeover ran under the lease taken back")
}

// TestInlineStepsBehindPgBouncer: inline runs through PgBouncer in transaction
// mode, many workflows at once.
func TestInlineStepsBehindPgBouncer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	direct := pgtest.New(t)
	direct.MustExec(t, effectsDDL)
	via, err := pg.Open(ctx, pg.Options{URL: pgtest.PgBouncer(t, direct), MaxConns: 20})
	require.NoError(t, err)
	t.Cleanup(via.Close)
	reg := workers.NewRegistry()
	require.NoError(t, addWorkflow(reg, chainWorkflow("chain", 8, nil)))
	workertest.Start(t, via, reg, nil)
	ids := make([]string, 50)
	require.NoError(t, pg.InTx(ctx, via, func(ctx context.Context, tx pgx.Tx) error {
		for n := range ids {
			var err error
			if ids[n], err = startKind(ctx, tx, "chain", orderIn{}, &workflow.StartOpts{ID: fmt.Sprintf("p-%02d", n)}); err != nil {
				return err
			}
		}
		return nil
	}))
	for _, id := range ids {
		require.Equal(t, workflow.Completed, wait(t, via, id).Status)
		requireChainOnce(t, direct, id, 8)
	}
	require.Greater(t, direct.MustCount(t, `SELECT count(*) FROM river_job WHERE metadata ? '`+workflowworker.JobStepsKey+`'`), 0,
		"some jobs ran several steps")
}

// TestAStartInThisProcessDoesNotWaitForAPoll: with a poll interval of a
// minute, a workflow started through this process's pool runs as soon as its
// start commits (the runtime's producer of its shard is woken in process),
// and a signal that resumes it wakes it the same way; a start rolled back
// wakes nothing and runs nothing.
func TestAStartInThisProcessDoesNotWaitForAPoll(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	db.MustExec(t, effectsDDL)
	reg := workers.NewRegistry()
	require.NoError(t, addWorkflow(reg, chainWorkflow("chain", 3, nil)))
	require.NoError(t, addWorkflow(reg, orderWorkflow()))
	workertest.Start(t, db.Pool, reg, &workers.Options{PollInterval: time.Minute})
	workertest.WaitFor(t, 10*time.Second, "the runtime holds its shards", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM compute_leases WHERE name LIKE 'shard/%'`) == db.MustCount(t, `SELECT shard_count FROM compute_settings`)
	})
	time.Sleep(200 * time.Millisecond) // River's first fetch of each queue is done

	rolledBack := pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := startKind(ctx, tx, "chain", orderIn{}, &workflow.StartOpts{ID: "gone"}); err != nil {
			return err
		}
		return fmt.Errorf("changed my mind")
	})
	require.Error(t, rolledBack)

	began := time.Now()
	id := startWF(t, db.Pool, "chain", orderIn{}, "w-1")
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	i, err := workflow.Wait(wctx, db.Pool, id, 5*time.Millisecond)
	require.NoError(t, err, "the start waited for a poll a minute away")
	require.Equal(t, workflow.Completed, i.Status)
	t.Logf("start to finish of 3 steps with a 1 min poll: %s", time.Since(began).Round(time.Millisecond))

	order := startWF(t, db.Pool, "order", orderIn{Order: "o"}, "o-1")
	waitStatus(t, db.Pool, order, workflow.Waiting)
	signal(t, db.Pool, order, "paid", map[string]int{"amount": 3}, "")
	i, err = workflow.Wait(wctx, db.Pool, order, 5*time.Millisecond)
	require.NoError(t, err, "the signal waited for a poll a minute away")
	require.Equal(t, workflow.Completed, i.Status)
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM compute_workflows WHERE id = 'gone'`))
}
