package jobs_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/fault"
)

// TestDirtyRefusesBadInputWithInvalidArgument: a bad kind or key is the caller's
// error, INVALID_ARGUMENT, refused before any statement is sent (tx is not used).
func TestDirtyRefusesBadInputWithInvalidArgument(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct{ kind, key string }{
		{"No Such Kind", "k"},
		{"", "k"},
		{"1kind", "k"},
		{"item", ""},
		{"item", strings.Repeat("k", jobs.MaxKeyLen+1)},
	} {
		err := jobs.DirtyTx(ctx, nil, tc.kind, tc.key, nil)
		require.Equal(t, fault.InvalidArgument, fault.CodeOf(err), "kind %q, key of %d bytes: %v", tc.kind, len(tc.key), err)
	}
}

// TestReconcileArgsThatCannotBeWorked: args without a valid kind or a key fail
// to decode with INVALID_ARGUMENT, which workers turn into a cancelled job.
func TestReconcileArgsThatCannotBeWorked(t *testing.T) {
	t.Parallel()
	var r jobs.Reconcile
	require.NoError(t, json.Unmarshal([]byte(`{"reconciler":"item","key":"a"}`), &r))
	for _, bad := range []string{`{"reconciler":"item"}`, `{"reconciler":"Item","key":"a"}`, `{"key":"a"}`} {
		require.Equal(t, fault.InvalidArgument, fault.CodeOf(json.Unmarshal([]byte(bad), &r)), bad)
	}
}
