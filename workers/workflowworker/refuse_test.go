package workflowworker_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/workflow"
	"github.com/bettercompute/bettercompute/platform/fault"
)

// TestTextPostgreSQLRefusesIsRefusedFirst: a workflow id, signal name, dedup
// key, cancel reason or list filter that is not valid UTF-8 or holds a NUL
// byte, and an input or signal payload whose JSON jsonb refuses (a string
// holding a NUL byte, raw \u0000), are INVALID_ARGUMENT before any statement
// is sent: the caller's transaction goes on and commits, nothing is written,
// and the workflow is untouched. Sent, each failed with INTERNAL_ERROR and
// aborted the caller's transaction.
func TestTextPostgreSQLRefusesIsRefusedFirst(t *testing.T) {
	t.Parallel()
	e := start(t, orderWorkflow())
	id := startWF(t, e.db.Pool, "order", orderIn{Order: "x"}, "x1")
	waitStatus(t, e.db.Pool, id, workflow.Waiting)

	startTx := func(in any, id string) func(ctx context.Context, tx pgx.Tx) error {
		return func(ctx context.Context, tx pgx.Tx) error {
			_, err := startKind(ctx, tx, "order", in, &workflow.StartOpts{ID: id})
			return err
		}
	}
	signalTx := func(name string, payload any, dedup string) func(ctx context.Context, tx pgx.Tx) error {
		return func(ctx context.Context, tx pgx.Tx) error {
			_, err := workflow.SignalTx(ctx, tx, id, name, payload, &workflow.SignalOpts{DedupKey: dedup})
			return err
		}
	}
	for name, call := range map[string]func(ctx context.Context, tx pgx.Tx) error{
		"start, NUL id":                startTx(orderIn{Order: "y"}, "y\x00"),
		"start, invalid UTF-8 id":      startTx(orderIn{Order: "y"}, "y\xff"),
		"start, NUL in the input":      startTx(orderIn{Order: "y\x00"}, "y1"),
		"start, raw \\u0000 input":     startTx(json.RawMessage(`{"order":"\u0000"}`), "y2"),
		"start, lone surrogate input":  startTx(json.RawMessage(`{"order":"\ud800"}`), "y3"),
		"signal, NUL name":             signalTx("paid\x00", nil, ""),
		"signal, NUL dedup key":        signalTx("paid", nil, "k\x00"),
		"signal, invalid UTF-8 dedup":  signalTx("paid", nil, "k\xc3"),
		"signal, NUL in the payload":   signalTx("paid", map[string]string{"by": "\x00"}, ""),
		"signal, raw \\u0000 payload":  signalTx("paid", json.RawMessage(`{"amount":1,"by":"\u0000"}`), "k"),
		"cancel, NUL reason":           func(ctx context.Context, tx pgx.Tx) error { return workflow.CancelTx(ctx, tx, id, "fraud\x00") },
		"cancel, invalid UTF-8 reason": func(ctx context.Context, tx pgx.Tx) error { return workflow.CancelTx(ctx, tx, id, "fraud\xe9") },
		"list, NUL kind": func(ctx context.Context, tx pgx.Tx) error {
			_, err := workflow.List(ctx, tx, workflow.ListOpts{Kind: "order\x00"})
			return err
		},
		"list, invalid UTF-8 before": func(ctx context.Context, tx pgx.Tx) error {
			_, err := workflow.List(ctx, tx, workflow.ListOpts{Before: "x\xff"})
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			err := e.db.RequireRefusal(t, fault.InvalidArgument, call)
			require.NotContains(t, err.Error(), "\x00", "the bad bytes are quoted, not echoed")
		})
	}
	require.Equal(t, 1, e.db.MustCount(t, `SELECT count(*) FROM compute_workflows`))
	require.Equal(t, 0, e.db.MustCount(t, `SELECT count(*) FROM compute_workflow_signals`))
	i, err := workflow.Get(context.Background(), e.db.Pool, id)
	require.NoError(t, err)
	require.Equal(t, workflow.Waiting, i.Status)
}

// TestAStepsBadTextFailsItsWorkflow: a step whose new state jsonb would refuse
// (a string holding a NUL byte) fails its workflow at its first attempt, as
// any state the workflow cannot store (INVALID_ARGUMENT), instead of failing
// at the database attempt after attempt; and a step's error that holds a NUL
// byte and invalid UTF-8 is recorded, those bytes dropped or replaced, instead
// of failing the very write that records it and leaving the workflow with no
// job.
func TestAStepsBadTextFailsItsWorkflow(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	badState := &workflow.Workflow[struct{}, string, int]{
		Kind: "bad_state",
		Steps: []workflow.Step[string]{
			{Name: "set", Retry: workflow.Retry{Attempts: 3, Backoff: 10 * time.Millisecond},
				Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[string]) (workflow.Next, error) {
					runs.Add(1)
					*c.State = "a\x00b"
					return workflow.Goto("done"), nil
				}},
			{Name: "done", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[string]) (workflow.Next, error) {
				return workflow.Finish(1), nil
			}},
		},
	}
	badError := &workflow.Workflow[struct{}, int, int]{
		Kind: "bad_error",
		Steps: []workflow.Step[int]{
			{Name: "charge", Retry: workflow.Retry{Attempts: 1},
				Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[int]) (workflow.Next, error) {
					return workflow.Next{}, errors.New("card \x00declined \xff")
				}},
		},
	}
	e := start(t, badState, badError)

	i := wait(t, e.db.Pool, startWF(t, e.db.Pool, "bad_state", struct{}{}, "s-1"))
	require.Equal(t, workflow.Failed, i.Status)
	require.Contains(t, i.Error, `the state of workflow s-1 holds \u0000 in a string`)
	require.Equal(t, int32(1), runs.Load(), "refused at the first attempt, not retried")

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	i, err := workflow.Wait(ctx, e.db.Pool, startWF(t, e.db.Pool, "bad_error", struct{}{}, "e-1"), 20*time.Millisecond)
	require.NoError(t, err, "the failure is recorded")
	require.Equal(t, workflow.Failed, i.Status)
	require.Contains(t, i.Error, "card declined \uFFFD")
}
