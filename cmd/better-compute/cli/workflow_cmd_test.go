package cli_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/cmd/better-compute/cli"
	"github.com/bettercompute/bettercompute/cmd/better-compute/cli/clitest"
	"github.com/bettercompute/bettercompute/domain/workflow"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/workertest"
	"github.com/bettercompute/bettercompute/workers/workflowworker"
)

// The test application's workflows: wfcli_order (reserve, charge — which
// fails while its order is in wfcli_declined —, then finish or await the
// signal paid; release compensates a cancel, followed by refund with
// undo_twice; its Init refuses an input without an order) and wfcli_ping (one
// step).

type wfOrderIn struct {
	Order     string `json:"order"`
	AwaitPaid bool   `json:"await_paid,omitempty"`
	UndoTwice bool   `json:"undo_twice,omitempty"`
}

type wfOrderState struct {
	Order string   `json:"order"`
	Trail []string `json:"trail"`
}

type wfOrderOut struct {
	Order    string `json:"order"`
	Paid     bool   `json:"paid"`
	Amount   int    `json:"amount,omitempty"`
	Released bool   `json:"released,omitempty"`
}

func wfOrder() *workflow.Workflow[wfOrderIn, wfOrderState, wfOrderOut] {
	type call = workflow.Call[wfOrderState]
	return &workflow.Workflow[wfOrderIn, wfOrderState, wfOrderOut]{
		Kind: "wfcli_order",
		Init: func(in wfOrderIn) (wfOrderState, error) {
			if in.Order == "" {
				return wfOrderState{}, fault.New(fault.InvalidArgument, "an order needs its id (order)")
			}
			return wfOrderState{Order: in.Order}, nil
		},
		Steps: []workflow.Step[wfOrderState]{
			{Name: "reserve", Tx: func(ctx context.Context, tx pgx.Tx, c *call) (workflow.Next, error) {
				c.State.Trail = append(c.State.Trail, "reserve")
				return workflow.Goto("charge"), nil
			}},
			{Name: "charge", Tx: func(ctx context.Context, tx pgx.Tx, c *call) (workflow.Next, error) {
				var declined bool
				if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM wfcli_declined WHERE order_id = $1)`, c.State.Order).Scan(&declined); err != nil {
					return workflow.Next{}, err
				}
				if declined {
					return workflow.Fail("card declined for " + c.State.Order), nil
				}
				c.State.Trail = append(c.State.Trail, "charge")
				var in wfOrderIn
				if err := json.Unmarshal(c.Input, &in); err != nil {
					return workflow.Next{}, err
				}
				if in.AwaitPaid {
					return workflow.AwaitSignal("paid", 24*time.Hour, "confirm", "expire"), nil
				}
				return workflow.Finish(wfOrderOut{Order: c.State.Order}), nil
			}},
			{Name: "confirm", Tx: func(ctx context.Context, tx pgx.Tx, c *call) (workflow.Next, error) {
				var p struct {
					Amount int `json:"amount"`
				}
				if err := c.Signal.Decode(&p); err != nil {
					return workflow.Next{}, err
				}
				c.State.Trail = append(c.State.Trail, "confirm")
				return workflow.Finish(wfOrderOut{Order: c.State.Order, Paid: true, Amount: p.Amount}), nil
			}},
			{Name: "expire", Tx: func(ctx context.Context, tx pgx.Tx, c *call) (workflow.Next, error) {
				return workflow.Finish(wfOrderOut{Order: c.State.Order}), nil
			}},
			{Name: "release", Tx: func(ctx context.Context, tx pgx.Tx, c *call) (workflow.Next, error) {
				c.State.Trail = append(c.State.Trail, "release")
				var in wfOrderIn
				if err := json.Unmarshal(c.Input, &in); err != nil {
					return workflow.Next{}, err
				}
				if in.UndoTwice {
					return workflow.Goto("refund"), nil
				}
				return workflow.Finish(wfOrderOut{Order: c.State.Order, Released: true}), nil
			}},
			{Name: "refund", Tx: func(ctx context.Context, tx pgx.Tx, c *call) (workflow.Next, error) {
				c.State.Trail = append(c.State.Trail, "refund")
				return workflow.Finish(wfOrderOut{Order: c.State.Order, Released: true}), nil
			}},
		},
		Signals:    []string{"paid"},
		Compensate: "release",
	}
}

func wfPing() *workflow.Workflow[struct{}, struct{}, string] {
	return &workflow.Workflow[struct{}, struct{}, string]{
		Kind: "wfcli_ping",
		Steps: []workflow.Step[struct{}]{{Name: "pong", Tx: func(context.Context, pgx.Tx, *workflow.Call[struct{}]) (workflow.Next, error) {
			return workflow.Finish("pong"), nil
		}}},
	}
}

// wfApp is an application whose module registers the two workflows.
func wfApp() cli.App {
	return cli.App{Name: "wfshop", Modules: []cli.Module{{
		Name: "wfcli",
		Migrations: fstest.MapFS{"0001_declined.sql": {Data: []byte(
			`CREATE TABLE wfcli_declined (order_id text PRIMARY KEY);`)}},
		Register: func(r *workers.Registry) error {
			return workers.AddWorkflow(r, wfOrder())
		},
	}, {
		Name: "wfping",
		Register: func(r *workers.Registry) error {
			return workers.AddWorkflow(r, wfPing())
		},
	}}}
}

// wfEnv is a migrated database for wfApp.
func wfEnv(t *testing.T) (*pgtest.DB, []string) {
	t.Helper()
	db := pgtest.New(t)
	env := dbEnv(db)
	r := clitest.Run(t, context.Background(), wfApp(), env, "migrate")
	require.Equal(t, 0, r.Code, r.Stderr)
	return db, env
}

// wfWorker starts a worker runtime on the application's registry (built-in
// modules included, as the worker command builds it).
func wfWorker(t *testing.T, db *pgtest.DB) *workers.Runtime {
	t.Helper()
	reg, err := wfApp().Registry()
	require.NoError(t, err)
	return workertest.Start(t, db.Pool, reg, nil)
}

// wfRun runs `workflow args…` of wfApp.
func wfRun(t *testing.T, env []string, args ...string) clitest.Result {
	t.Helper()
	return clitest.Run(t, context.Background(), wfApp(), env, append([]string{"workflow"}, args...)...)
}

// wfWait waits until workflow id has status want.
func wfWait(t *testing.T, db *pgtest.DB, id string, want workflow.Status) *workflow.Info {
	t.Helper()
	var i *workflow.Info
	workertest.WaitFor(t, 30*time.Second, "workflow "+id+" "+string(want), func() bool {
		var err error
		i, err = workflow.Get(context.Background(), db.Pool, id)
		return err == nil && i.Status == want
	})
	return i
}

func wfHistory(t *testing.T, db *pgtest.DB, id string) []workflow.HistoryRow {
	t.Helper()
	h, err := workflow.History(context.Background(), db.Pool, id)
	require.NoError(t, err)
	return h
}

// showField is the value of a field line of workflow show ("NAME:  value").
func showField(t *testing.T, stdout, name string) string {
	t.Helper()
	for _, l := range strings.Split(stdout, "\n") {
		if v, ok := strings.CutPrefix(l, name+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("workflow show printed no %s line", name)
	return ""
}

// TestWorkflowCommandArguments: bad arguments are INVALID_ARGUMENT, one line,
// before anything runs; --help names every verb.
func TestWorkflowCommandArguments(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// The URL points nowhere: every refusal comes before the database.
	env := []string{"BETTER_COMPUTE_DATABASE_URL=postgres://nobody:pw@127.0.0.1:1/none", "BETTER_COMPUTE_LOG_LEVEL=warn"}
	for _, tc := range []struct {
		args []string
		says string
	}{
		// A flag the command does not know is a parse error: exit 2.
		{[]string{"show", "-nope"}, "flag provided but not defined"},
		{nil, "workflow needs a verb: list"},
		{[]string{"frobnicate"}, `unknown verb "frobnicate"`},
		{[]string{"list", "extra"}, "workflow list takes no arguments"},
		{[]string{"list", "--status", "sleepy"}, "want one of running, sleeping, waiting, cancelling, completed, failed, cancelled"},
		{[]string{"list", "--limit", "0"}, "--limit 0: want 1 to 1000"},
		{[]string{"list", "--limit", "5000"}, "--limit 5000"},
		{[]string{"list", "--before", "bad id"}, "bad workflow id"},
		{[]string{"show"}, "workflow show takes ID"},
		{[]string{"show", "a", "b"}, "workflow show takes ID"},
		{[]string{"show", "bad id!"}, `bad workflow id "bad id!"`},
		{[]string{"show", "x", "--kind", "k"}, "--kind does not apply"},
		{[]string{"start", "wfcli_order"}, "workflow start takes KIND JSON"},
		{[]string{"start", "wfcli_order", "{order: 1}"}, "is not valid JSON"},
		{[]string{"start", "wfcli_order", "{}", "--id", "../x"}, "workflow start --id"},
		{[]string{"start", "wfcli_order", "{}", "--reason", "r"}, "--reason does not apply"},
		{[]string{"signal", "x"}, "workflow signal takes ID NAME [JSON]"},
		{[]string{"signal", "x", "paid", "{"}, "the payload \"{\" is not valid JSON"},
		{[]string{"cancel", "x", "y"}, "workflow cancel takes ID"},
		{[]string{"retry"}, "workflow retry takes ID"},
		{[]string{"retry", "x", "--json"}, "--json does not apply"},
		// Decided from the binary's definitions, before the database.
		{[]string{"start", "nope", "{}"}, `unknown workflow kind "nope": this binary defines wfcli_order, wfcli_ping`},
		{[]string{"start", "wfcli_order", `{"order": 5}`}, "the input of workflow wfcli_order does not decode"},
		{[]string{"start", "wfcli_order", `{"await_paid": true}`}, "an order needs its id (order)"},
	} {
		exit := 1
		if strings.HasPrefix(tc.says, "flag provided") {
			exit = 2
		}
		r := wfRun(t, env, tc.args...)
		last := requireOneLineError(t, r, "INVALID_ARGUMENT", exit)
		require.Contains(t, last, tc.says, "%v", tc.args)
		require.Empty(t, r.Stdout, "%v", tc.args)
	}

	r := clitest.Run(t, ctx, wfApp(), nil, "workflow", "--help")
	require.Equal(t, 0, r.Code, r.Stderr)
	for _, s := range []string{"list [--kind K]", "show ID", "start KIND JSON [--id ID]", "signal ID NAME [JSON] [--dedup KEY]",
		"cancel ID [--reason R]", "retry ID", "--dedup", "--reason", "--json", "--status"} {
		require.Contains(t, r.Stdout, s)
	}
	r = clitest.Run(t, ctx, wfApp(), nil, "--help")
	require.Equal(t, 0, r.Code)
	require.Regexp(t, `(?m)^\s+workflow\s+look at and steer durable workflows`, r.Stdout)
}

// TestWorkflowCommandStart: start prints the id; the same id and input again
// is the same workflow, other input is CONFLICT; no --id gives a new random id;
// list filters by kind and status and pages. No worker runs: the workflows
// wait at their first step.
func TestWorkflowCommandStart(t *testing.T) {
	t.Parallel()
	db, env := wfEnv(t)

	r := wfRun(t, env, "start", "wfcli_order", `{"order": "o-1"}`, "--id", "o-1")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Equal(t, "o-1\n", r.Stdout)
	r = wfRun(t, env, "start", "--id", "o-1", "wfcli_order", `{ "order":"o-1" }`)
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Equal(t, "o-1\n", r.Stdout, "the same start again is the same workflow")
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM compute_workflows WHERE id = 'o-1'`))
	r = wfRun(t, env, "start", "wfcli_order", `{"order": "o-2"}`, "--id", "o-1")
	last := requireOneLineError(t, r, "CONFLICT", 1)
	require.Contains(t, last, "workflow o-1 already exists")
	r = wfRun(t, env, "start", "wfcli_ping", `{}`, "--id", "o-1")
	requireOneLineError(t, r, "CONFLICT", 1)

	r = wfRun(t, env, "start", "wfcli_ping", `{}`)
	require.Equal(t, 0, r.Code, r.Stderr)
	ping := strings.TrimSpace(r.Stdout)
	require.Regexp(t, `^wf_[0-9a-f]{24}$`, ping)
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM compute_workflows WHERE id = '`+ping+`' AND kind = 'wfcli_ping' AND status = 'running'`))
	// A River job waits for the first step, in a shard queue.
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM river_job j JOIN compute_workflows w ON w.job_id = j.id
		WHERE w.id = '`+ping+`' AND j.kind = 'workflow_step' AND j.queue LIKE 'shard_%'`))

	r = wfRun(t, env, "list")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Regexp(t, `(?m)^ID\s+KIND\s+STATUS\s+STEP\s+SEQ\s+UPDATED\s+ERROR$`, r.Stdout)
	require.Regexp(t, `(?m)^o-1\s+wfcli_order\s+running\s+reserve\s+1\s+\S+ ago\s+-$`, r.Stdout)
	require.Regexp(t, `(?m)^`+ping+`\s+wfcli_ping\s+running\s+pong\s+1\s`, r.Stdout)
	r = wfRun(t, env, "list", "--kind", "wfcli_ping")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, ping)
	require.NotContains(t, r.Stdout, "o-1")
	r = wfRun(t, env, "list", "--status", "completed")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Equal(t, "no workflows with status completed\n", r.Stdout)
	r = wfRun(t, env, "list", "--limit", "1")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, ping, "newest first")
	require.NotContains(t, r.Stdout, "o-1 ")
	require.Contains(t, r.Stdout, "the next page: --before "+ping)
	r = wfRun(t, env, "list", "--before", ping, "--json")
	require.Equal(t, 0, r.Code, r.Stderr)
	var page []workflow.Info
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &page))
	require.Len(t, page, 1)
	require.Equal(t, "o-1", page[0].ID)
	require.Equal(t, workflow.Running, page[0].Status)
	require.JSONEq(t, `{"order":"o-1"}`, string(page[0].Input))

	// A signal before the workflow waits for it stays in its inbox; a repeat
	// with the same dedup key counts once.
	r = wfRun(t, env, "signal", "o-1", "paid", `{"amount": 7}`, "--dedup", "pay-1")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Regexp(t, `^sent signal paid to workflow o-1 \(signal id \d+\)\n$`, r.Stdout)
	r = wfRun(t, env, "signal", "o-1", "paid", `{"amount": 99}`, "--dedup", "pay-1")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Equal(t, "duplicate: workflow o-1 already has a signal with dedup key pay-1; not stored again\n", r.Stdout)
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM compute_workflow_signals WHERE workflow_id = 'o-1' AND payload = '{"amount": 7}'`))
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM compute_workflow_signals WHERE workflow_id = 'o-1'`))
	r = wfRun(t, env, "signal", "o-1", "refund")
	last = requireOneLineError(t, r, "INVALID_ARGUMENT", 1)
	require.Contains(t, last, "does not take signal refund")

	// show before any step ran.
	r = wfRun(t, env, "show", "o-1")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "status:    running\n")
	require.JSONEq(t, `{"order":"o-1"}`, showField(t, r.Stdout, "input"))
	require.Contains(t, r.Stdout, "history: none yet")
	r = wfRun(t, env, "show", "nope")
	requireOneLineError(t, r, "NOT_FOUND", 1)
}

// TestWorkflowCommandLifecycle runs workflows on a worker and steers them
// with the command: show's history with the River job ids, a signal that
// resumes a waiting workflow (and its duplicate), cancel with compensation, and
// retry of a failed workflow resuming at its failed step.
func TestWorkflowCommandLifecycle(t *testing.T) {
	t.Parallel()
	db, env := wfEnv(t)
	rt := wfWorker(t, db)

	// Runs to the end.
	r := wfRun(t, env, "start", "wfcli_order", `{"order": "done-1"}`, "--id", "done-1")
	require.Equal(t, 0, r.Code, r.Stderr)
	wfWait(t, db, "done-1", workflow.Completed)
	hist := wfHistory(t, db, "done-1")
	require.Len(t, hist, 2)
	r = wfRun(t, env, "show", "done-1")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "workflow:  done-1\n")
	require.Contains(t, r.Stdout, "status:    completed\n")
	require.JSONEq(t, `{"order":"done-1","paid":false}`, showField(t, r.Stdout, "result"))
	require.JSONEq(t, `{"order":"done-1","trail":["reserve","charge"]}`, showField(t, r.Stdout, "state"))
	require.Regexp(t, `(?m)^SEQ\s+STEP\s+OUTCOME\s+NEXT STEP\s+ATTEMPT\s+JOB\s+EPOCH\s+STARTED\s+COMMITTED\s+TOOK\s+ERROR$`, r.Stdout)
	for _, h := range hist {
		require.NotNil(t, h.JobID)
		require.NotNil(t, h.LeaseEpoch)
		next := h.NextStep
		if next == "" {
			next = "-"
		}
		row := `(?m)^` + strconv.FormatInt(h.Seq, 10) + `\s+` + h.Step + `\s+` + h.Outcome + `\s+` + next + `\s+1\s+` +
			strconv.FormatInt(*h.JobID, 10) + `\s+` + strconv.FormatInt(*h.LeaseEpoch, 10) +
			`\s+\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z\s+\d{4}-\d\d-\d\dT\S+Z\s+\S+\s+-$`
		require.Regexp(t, row, r.Stdout)
	}
	require.Equal(t, "reserve", hist[0].Step)
	require.Equal(t, "goto", hist[0].Outcome)
	require.Equal(t, "charge", hist[1].Step)
	require.Equal(t, "completed", hist[1].Outcome)
	// The job ids are the River jobs that ran the steps: one job, since
	// reserve goes to charge at once and the job runs charge inline.
	require.Equal(t, *hist[0].JobID, *hist[1].JobID, "charge ran inline in reserve's job")
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'workflow_step' AND id = `+
		strconv.FormatInt(*hist[0].JobID, 10)))

	r = wfRun(t, env, "show", "done-1", "--json")
	require.Equal(t, 0, r.Code, r.Stderr)
	var detail struct {
		Workflow workflow.Info         `json:"workflow"`
		History  []workflow.HistoryRow `json:"history"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &detail))
	require.Equal(t, workflow.Completed, detail.Workflow.Status)
	require.JSONEq(t, `{"order":"done-1","paid":false}`, string(detail.Workflow.Result))
	require.Len(t, detail.History, 2)
	require.Equal(t, *hist[1].JobID, *detail.History[1].JobID)
	require.NotNil(t, detail.History[1].Took)

	// A signal resumes a waiting workflow.
	r = wfRun(t, env, "start", "wfcli_order", `{"order": "paid-1", "await_paid": true}`, "--id", "paid-1")
	require.Equal(t, 0, r.Code, r.Stderr)
	wfWait(t, db, "paid-1", workflow.Waiting)
	r = wfRun(t, env, "show", "paid-1")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Regexp(t, `status:    waiting for signal paid until \S+ \(in \S+\), then step confirm \(step expire at the deadline\)`, r.Stdout)
	r = wfRun(t, env, "signal", "paid-1", "refund", `{}`)
	last := requireOneLineError(t, r, "INVALID_ARGUMENT", 1)
	require.Contains(t, last, "does not take signal refund")
	r = wfRun(t, env, "signal", "nope", "paid")
	requireOneLineError(t, r, "NOT_FOUND", 1)
	r = wfRun(t, env, "signal", "paid-1", "paid", `{"amount": 42}`, "--dedup", "pay-1")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Regexp(t, `^sent signal paid to workflow paid-1 \(signal id \d+\)\n$`, r.Stdout)
	i := wfWait(t, db, "paid-1", workflow.Completed)
	require.JSONEq(t, `{"order":"paid-1","paid":true,"amount":42}`, string(i.Result))
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM compute_workflow_signals WHERE workflow_id = 'paid-1'`))
	r = wfRun(t, env, "signal", "paid-1", "paid")
	last = requireOneLineError(t, r, "CONFLICT", 1)
	require.Contains(t, last, "is completed")

	// Cancel a waiting workflow: its compensation runs once, then it is cancelled.
	r = wfRun(t, env, "start", "wfcli_order", `{"order": "gone-1", "await_paid": true}`, "--id", "gone-1")
	require.Equal(t, 0, r.Code, r.Stderr)
	wfWait(t, db, "gone-1", workflow.Waiting)
	r = wfRun(t, env, "cancel", "gone-1", "--reason", "customer left")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Equal(t, "cancelling workflow gone-1 (was waiting at step confirm): its compensation step release runs once, then it is cancelled\n", r.Stdout)
	i = wfWait(t, db, "gone-1", workflow.Cancelled)
	require.Equal(t, "customer left", i.Error)
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM compute_workflows WHERE id = 'gone-1' AND state->'trail' ? 'release'`))
	r = wfRun(t, env, "cancel", "gone-1")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Equal(t, "workflow gone-1 is already cancelled: nothing to do\n", r.Stdout)
	r = wfRun(t, env, "cancel", "done-1")
	last = requireOneLineError(t, r, "CONFLICT", 1)
	require.Contains(t, last, "workflow done-1 is completed")
	r = wfRun(t, env, "show", "gone-1")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "error:     customer left\n")
	require.Regexp(t, `(?m)^\d+\s+confirm\s+cancelled\s+release\s+-\s+-\s+-\s.*customer left$`, r.Stdout, "the cancel ran no job")
	require.Regexp(t, `(?m)^\d+\s+release\s+cancelled\s+-\s`, r.Stdout)

	// A declined charge fails the workflow; retry resumes it at that step.
	db.MustExec(t, `INSERT INTO wfcli_declined VALUES ('bad-1')`)
	r = wfRun(t, env, "start", "wfcli_order", `{"order": "bad-1"}`, "--id", "bad-1")
	require.Equal(t, 0, r.Code, r.Stderr)
	i = wfWait(t, db, "bad-1", workflow.Failed)
	require.Equal(t, "charge", i.Step)
	r = wfRun(t, env, "list", "--status", "failed")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Regexp(t, `(?m)^bad-1\s+wfcli_order\s+failed\s+charge\s+\d+\s+\S+ ago\s+card declined for bad-1$`, r.Stdout)
	require.NotContains(t, r.Stdout, "done-1")
	r = wfRun(t, env, "show", "bad-1")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "status:    failed at step charge (workflow retry resumes it there)\n")
	r = wfRun(t, env, "retry", "done-1")
	last = requireOneLineError(t, r, "CONFLICT", 1)
	require.Contains(t, last, "workflow done-1 is completed")
	db.MustExec(t, `DELETE FROM wfcli_declined`)
	r = wfRun(t, env, "retry", "bad-1")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Regexp(t, `^retrying workflow bad-1 at step charge, with fresh attempts \(seq \d+\)\n$`, r.Stdout)
	i = wfWait(t, db, "bad-1", workflow.Completed)
	require.JSONEq(t, `{"order":"bad-1","paid":false}`, string(i.Result))
	outcomes := []string{}
	for _, h := range wfHistory(t, db, "bad-1") {
		outcomes = append(outcomes, h.Step+":"+h.Outcome)
	}
	require.Equal(t, []string{"reserve:goto", "charge:failed", "charge:retried", "charge:completed"}, outcomes)
	r = wfRun(t, env, "show", "bad-1")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Regexp(t, `(?m)^\d+\s+charge\s+failed\s+-\s+1\s+\d+\s+\d+\s+\S+\s+\S+\s+\S+\s+card declined for bad-1$`, r.Stdout)
	require.Regexp(t, `(?m)^\d+\s+charge\s+retried\s+charge\s+-\s+-\s+-\s`, r.Stdout, "a retry ran no job")

	// A waiting workflow whose step job was cancelled by hand (in River UI,
	// say) gets a new job where it stands; one whose job is live has nothing
	// to retry.
	r = wfRun(t, env, "start", "wfcli_order", `{"order": "stuck-1", "await_paid": true}`, "--id", "stuck-1")
	require.Equal(t, 0, r.Code, r.Stderr)
	i = wfWait(t, db, "stuck-1", workflow.Waiting)
	r = wfRun(t, env, "retry", "stuck-1")
	last = requireOneLineError(t, r, "CONFLICT", 1)
	require.Contains(t, last, "there is nothing to retry")
	_, err := rt.Client().JobCancel(context.Background(), *i.JobID)
	require.NoError(t, err)
	r = wfRun(t, env, "retry", "stuck-1")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Regexp(t, `^workflow stuck-1 \(waiting at step confirm\) had no live step job: it has a new one, job \d+ \(seq \d+\)\n$`, r.Stdout)
	r = wfRun(t, env, "signal", "stuck-1", "paid", `{"amount": 5}`)
	require.Equal(t, 0, r.Code, r.Stderr)
	i = wfWait(t, db, "stuck-1", workflow.Completed)
	require.JSONEq(t, `{"order":"stuck-1","paid":true,"amount":5}`, string(i.Result))

	// The list by status sees each outcome.
	r = wfRun(t, env, "list", "--status", "completed", "--json")
	require.Equal(t, 0, r.Code, r.Stderr)
	var done []workflow.Info
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &done))
	var ids []string
	for _, w := range done {
		ids = append(ids, w.ID)
	}
	require.ElementsMatch(t, []string{"done-1", "paid-1", "bad-1", "stuck-1"}, ids)
}

// TestWorkflowCommandCancelReason: the reason of a cancel is the workflow's
// error from the cancel on: while its compensation waits to run (cancelling),
// through a compensation of two steps (release, then refund), and once it is
// cancelled; and at once for a kind without compensation. list, list --json,
// show, show --json and serve's HTML page of the workflow each show it.
func TestWorkflowCommandCancelReason(t *testing.T) {
	t.Parallel()
	db, env := wfEnv(t)
	const user, pass = "ops", "cancel-Pa55word"
	base := serveApp(t, wfApp(), append(dbEnv(db), "BETTER_COMPUTE_LISTEN=127.0.0.1:0",
		"BETTER_COMPUTE_AUTH_USER="+user, "BETTER_COMPUTE_AUTH_PASSWORD="+pass))

	// No worker yet: the compensation waits.
	wfStart(t, db.Pool, "wfcli_order", `{"order": "undo-1", "undo_twice": true}`, "undo-1")
	wfStart(t, db.Pool, "wfcli_ping", `{}`, "ping-1")
	r := wfRun(t, env, "cancel", "undo-1", "--reason", "customer left")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Equal(t, "cancelling workflow undo-1 (was running at step reserve): its compensation step release runs once, then it is cancelled\n", r.Stdout)
	r = wfRun(t, env, "cancel", "ping-1", "--reason", "not needed")
	require.Equal(t, 0, r.Code, r.Stderr)

	requireReason := func(id string, status workflow.Status, step, reason string) {
		t.Helper()
		r := wfRun(t, env, "list")
		require.Equal(t, 0, r.Code, r.Stderr)
		require.Regexp(t, `(?m)^`+id+`\s+wfcli_\w+\s+`+string(status)+`\s+`+step+`\s+\d+\s+\S+ ago\s+`+reason+`$`, r.Stdout)
		r = wfRun(t, env, "list", "--json")
		require.Equal(t, 0, r.Code, r.Stderr)
		var page []workflow.Info
		require.NoError(t, json.Unmarshal([]byte(r.Stdout), &page))
		found := false
		for _, w := range page {
			if w.ID == id {
				found = true
				require.Equal(t, status, w.Status)
				require.Equal(t, reason, w.Error, "list --json")
			}
		}
		require.True(t, found, "list --json has no %s: %s", id, r.Stdout)
		r = wfRun(t, env, "show", id)
		require.Equal(t, 0, r.Code, r.Stderr)
		require.Equal(t, reason, showField(t, r.Stdout, "error"), "show")
		r = wfRun(t, env, "show", id, "--json")
		require.Equal(t, 0, r.Code, r.Stderr)
		var detail struct {
			Workflow workflow.Info `json:"workflow"`
		}
		require.NoError(t, json.Unmarshal([]byte(r.Stdout), &detail))
		require.Equal(t, status, detail.Workflow.Status)
		require.Equal(t, reason, detail.Workflow.Error, "show --json")
		html := wfGet(t, base, "workflows/"+id, user, pass)
		require.Equal(t, http.StatusOK, html.status, html.body)
		require.Contains(t, html.body, `<tr><th>Error</th><td class="err">`+reason+`</td></tr>`, "the HTML page")
	}
	requireReason("undo-1", workflow.Cancelling, "release", "customer left")
	requireReason("ping-1", workflow.Cancelled, "pong", "not needed")

	// The compensation runs (release, then refund): the reason stays.
	wfWorker(t, db)
	i := wfWait(t, db, "undo-1", workflow.Cancelled)
	require.JSONEq(t, `{"order":"undo-1","trail":["release","refund"]}`, string(i.State))
	requireReason("undo-1", workflow.Cancelled, "refund", "customer left")
	outcomes := []string{}
	for _, h := range wfHistory(t, db, "undo-1") {
		outcomes = append(outcomes, h.Step+":"+h.Outcome+":"+h.Error)
	}
	require.Equal(t, []string{"reserve:cancelled:customer left", "release:goto:customer left", "refund:cancelled:customer left"}, outcomes)
}

// wfStart starts a workflow of wfApp's registry directly, as an application
// would (tests of the HTTP routes).
func wfStart(t *testing.T, db *pg.Pool, kind, input, id string) {
	t.Helper()
	reg, err := wfApp().Registry()
	require.NoError(t, err)
	require.NoError(t, pg.InTx(context.Background(), db, func(ctx context.Context, tx pgx.Tx) error {
		def, err := workflowworker.Lookup(reg, kind)
		if err != nil {
			return err
		}
		_, err = def.StartJSONTx(ctx, tx, json.RawMessage(input), &workflow.StartOpts{ID: id})
		return err
	}))
}
