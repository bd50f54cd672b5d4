package jobs_test

import (
	"context"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
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
	err := jobs.DirtyTx(ctx, nil, "item", "k", &jobs.DirtyOpts{Delay: jobs.MaxDirtyDelay + time.Second})
	require.Equal(t, fault.InvalidArgument, fault.CodeOf(err), "%v", err)
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

// TestMarkDirtyFromSQL: compute_mark_dirty, the SQL face of DirtyTx, refuses a
// bad kind, key or delay with SQLSTATE 22023 (INVALID_ARGUMENT once translated)
// and writes nothing; a good call writes the row DirtyTx would, in the key's
// shard by the same FNV-1a as Go (compute_key_hash agrees with KeyHash).
func TestMarkDirtyFromSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	for _, bad := range []struct {
		kind, key any
		delay     any
	}{
		{"No Such Kind", "k", 0.0},
		{"", "k", 0.0},
		{nil, "k", 0.0},
		{"item", "", 0.0},
		{"item", nil, 0.0},
		{"item", strings.Repeat("é", 257), 0.0}, // 514 bytes
		{"item", "k", -1.0},
		{"item", "k", math.Inf(1)},
		{"item", "k", math.NaN()},
		{"item", "k", nil},
	} {
		_, err := db.Exec(ctx, `SELECT compute_mark_dirty($1::text, $2::text, $3::float8)`, bad.kind, bad.key, bad.delay)
		require.Error(t, err, "%v", bad)
		require.Equal(t, "22023", pg.SQLState(err), "%v: %v", bad, err)
		require.Equal(t, fault.InvalidArgument, fault.CodeOf(pg.Translate(err)), "%v", bad)
	}
	_, err := db.Exec(ctx, `SELECT compute_mark_dirty('item', 'k', 0, 4294967296)`)
	require.Equal(t, "22023", pg.SQLState(err), "a key_hash beyond 32 bits: %v", err)
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM compute_dirty`), "a refused call writes nothing")

	keys := []string{"a", "order-42", "ünïcödé ✓", strings.Repeat("x", jobs.MaxKeyLen)}
	for _, k := range keys {
		var h int64
		require.NoError(t, db.QueryRow(ctx, `SELECT compute_key_hash($1)`, k).Scan(&h))
		require.Equal(t, int64(jobs.KeyHash(k)), h, "FNV-1a of %q", k)
		db.MustExec(t, `SELECT compute_mark_dirty('item', $1)`, k) // delay defaults to 0
		require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM compute_dirty WHERE kind = 'item' AND key = $1
			AND shard = $2 AND gen = 1 AND job_id IS NULL AND not_before <= compute_now()`, k, jobs.ShardOf(k, pgtest.DefaultShardCount)), k)
	}
	// Named arguments and a delay; the earlier not-before wins.
	db.MustExec(t, `SELECT compute_mark_dirty(kind => 'item', key => 'later', delay_seconds => 3600)`)
	db.MustExec(t, `SELECT compute_mark_dirty(kind => 'item', key => 'later', delay_seconds => 60)`)
	db.MustExec(t, `SELECT compute_mark_dirty(kind => 'item', key => 'later', delay_seconds => 600)`)
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM compute_dirty WHERE key = 'later' AND gen = 3
		AND not_before BETWEEN compute_now() + interval '59 seconds' AND compute_now() + interval '61 seconds'`))
}
