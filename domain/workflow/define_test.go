package workflow_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/workflow"
	"github.com/bettercompute/bettercompute/platform/fault"
)

func step(name string) workflow.Step[int] {
	return workflow.Step[int]{Name: name, Tx: func(context.Context, pgx.Tx, *workflow.Call[int]) (workflow.Next, error) {
		return workflow.Finish(nil), nil
	}}
}

// TestValidateRefusesBadDefinitions: each flaw is INVALID_CONFIG naming it.
func TestValidateRefusesBadDefinitions(t *testing.T) {
	ok := func() *workflow.Workflow[int, int, int] {
		return &workflow.Workflow[int, int, int]{Kind: "good", Steps: []workflow.Step[int]{step("a"), step("b")}, Signals: []string{"go"}}
	}
	require.NoError(t, ok().Validate())
	for name, c := range map[string]struct {
		mutate func(w *workflow.Workflow[int, int, int])
		want   string
	}{
		"bad kind": {func(w *workflow.Workflow[int, int, int]) { w.Kind = "Bad-Kind" }, "workflow kind"},
		"no steps": {func(w *workflow.Workflow[int, int, int]) { w.Steps = nil }, "has no steps"},
		"twice":    {func(w *workflow.Workflow[int, int, int]) { w.Steps = append(w.Steps, step("a")) }, "defined twice"},
		"both kinds": {func(w *workflow.Workflow[int, int, int]) {
			w.Steps[0].External = func(context.Context, *workflow.Call[int]) (workflow.Next, error) { return workflow.Next{}, nil }
		}, "exactly one of Tx and External"},
		"neither kind":   {func(w *workflow.Workflow[int, int, int]) { w.Steps[0].Tx = nil }, "exactly one of Tx and External"},
		"bad on error":   {func(w *workflow.Workflow[int, int, int]) { w.Steps[0].OnError = "zzz" }, "OnError step zzz"},
		"bad compensate": {func(w *workflow.Workflow[int, int, int]) { w.Compensate = "zzz" }, "compensation step zzz"},
		"bad signal":     {func(w *workflow.Workflow[int, int, int]) { w.Signals = []string{"no spaces"} }, "signal name"},
		"negative retry": {func(w *workflow.Workflow[int, int, int]) { w.Steps[1].Retry.Attempts = -1 }, "negative retry"},
	} {
		w := ok()
		c.mutate(w)
		err := w.Validate()
		require.True(t, fault.Has(err, fault.InvalidConfig), "%s: %v", name, err)
		require.Contains(t, err.Error(), c.want, name)
	}
}

func TestRetryDelayDoublesUpToItsMaximum(t *testing.T) {
	r := workflow.Retry{Backoff: 100 * time.Millisecond, MaxBackoff: time.Second}
	var got []time.Duration
	for a := 1; a <= 6; a++ {
		got = append(got, r.Delay(a))
	}
	require.Equal(t, []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond, time.Second, time.Second}, got)
	require.Equal(t, time.Second, workflow.Retry{}.Delay(1), "the default backoff")
}

func TestIDsAreChecked(t *testing.T) {
	for _, id := range []string{"order-42", "a", "tenant:7/order@x.y_z", workflow.NewID()} {
		require.NoError(t, workflow.ValidateID(id), id)
	}
	for _, id := range []string{"", "-lead", "has space", "semi;colon", string(make([]byte, 256))} {
		require.True(t, fault.Has(workflow.ValidateID(id), fault.InvalidArgument), "%q", id)
	}
	require.NotEqual(t, workflow.NewID(), workflow.NewID())
}
