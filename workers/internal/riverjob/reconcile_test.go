package riverjob_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/platform/tracing"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/internal/riverjob"
)

func TestDirtyRefusesBadInputWithInvalidArgument(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct{ kind, key string }{
		{"No Such Kind", "k"},
		{"", "k"},
		{"1kind", "k"},
		{"item", ""},
		{"item", strings.Repeat("k", riverjob.MaxKeyLen+1)},
	} {
		err := workers.DirtyTx(ctx, nil, tc.kind, tc.key, nil)
		require.Equal(t, fault.InvalidArgument, fault.CodeOf(err), "kind %q, key of %d bytes: %v", tc.kind, len(tc.key), err)
	}
	err := workers.DirtyTx(ctx, nil, "item", "k", &workers.DirtyOpts{Delay: workers.MaxDirtyDelay + time.Second})
	require.Equal(t, fault.InvalidArgument, fault.CodeOf(err), "%v", err)
}

func TestReconcileArgsThatCannotBeWorked(t *testing.T) {
	t.Parallel()
	var r riverjob.Reconcile
	require.NoError(t, json.Unmarshal([]byte(`{"reconciler":"item","key":"a"}`), &r))
	for _, bad := range []string{`{"reconciler":"item"}`, `{"reconciler":"Item","key":"a"}`, `{"key":"a"}`} {
		require.Equal(t, fault.InvalidArgument, fault.CodeOf(json.Unmarshal([]byte(bad), &r)), bad)
	}
}

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

	keys := []string{"a", "order-42", "ünïcödé ✓", strings.Repeat("x", riverjob.MaxKeyLen)}
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

func traceparent(t, s int) string {
	return fmt.Sprintf("00-%032x-%016x-01", t, s)
}

func sampledCtx(t, s int) context.Context {
	var tid trace.TraceID
	var sid trace.SpanID
	binary.BigEndian.PutUint64(tid[8:], uint64(t))
	binary.BigEndian.PutUint64(sid[:], uint64(s))
	return trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled}))
}

func TestMarkDirtyRecordsCauses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	inTx := func(ctx context.Context, fn func(tx pgx.Tx)) {
		t.Helper()
		require.NoError(t, pg.InTx(ctx, db.Pool, func(_ context.Context, tx pgx.Tx) error { fn(tx); return nil }))
	}
	causes := func(col, key string) []string {
		t.Helper()
		var links []string
		require.NoError(t, db.QueryRow(ctx, `SELECT `+col+` FROM compute_dirty WHERE kind = 'item' AND key = $1`, key).Scan(&links))
		return links
	}
	gen := func(key string) int {
		return db.MustCount(t, `SELECT gen FROM compute_dirty WHERE kind = 'item' AND key = $1`, key)
	}

	// A trigger's call (two arguments) in a transaction whose setting is set.
	inTx(ctx, func(tx pgx.Tx) {
		_, err := tx.Exec(ctx, `SELECT set_config('bettercompute.traceparent', $1, true)`, traceparent(1, 1))
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `SELECT compute_mark_dirty('item', 'k')`)
		require.NoError(t, err)
	})
	require.Equal(t, []string{traceparent(1, 1)}, causes("trace_links", "k"))
	// The setting ended with its transaction: a call without one adds nothing.
	db.MustExec(t, `SELECT compute_mark_dirty('item', 'k', 0)`)
	require.Equal(t, []string{traceparent(1, 1)}, causes("trace_links", "k"))
	// DirtyTx passes its context's span; jobs.TraceTx sets the setting from it.
	inTx(ctx, func(tx pgx.Tx) {
		require.NoError(t, workers.DirtyTx(sampledCtx(2, 2), tx, "item", "k", nil))
		require.NoError(t, workers.DirtyTx(sampledCtx(2, 2), tx, "item", "k", nil)) // the same span: kept once
		require.NoError(t, jobs.TraceTx(sampledCtx(3, 3), tx))
		_, err := tx.Exec(ctx, `SELECT compute_mark_dirty('item', 'k', 0, NULL)`)
		require.NoError(t, err)
	})
	require.Equal(t, []string{traceparent(1, 1), traceparent(2, 2), traceparent(3, 3)}, causes("trace_links", "k"))
	// Malformed causes, passed or set, are ignored; the dirty is done.
	before := gen("k")
	for _, bad := range []string{"garbage", "01-" + traceparent(4, 4)[3:], traceparent(4, 4) + "x", ""} {
		db.MustExec(t, `SELECT compute_mark_dirty('item', 'k', 0, NULL, $1)`, bad)
		inTx(ctx, func(tx pgx.Tx) {
			_, err := tx.Exec(ctx, `SELECT set_config('bettercompute.traceparent', $1, true), compute_mark_dirty('item', 'k')`, bad)
			require.NoError(t, err, "a malformed cause %q", bad)
		})
	}
	require.Equal(t, before+8, gen("k"), "every dirty with a malformed cause was done")
	require.Equal(t, []string{traceparent(1, 1), traceparent(2, 2), traceparent(3, 3)}, causes("trace_links", "k"))

	// At most MaxCauses, the first ones.
	var want []string
	for i := 1; i <= tracing.MaxCauses+8; i++ {
		db.MustExec(t, `SELECT compute_mark_dirty(kind => 'item', key => 'many', trace_parent => $1)`, traceparent(9, i))
		if i <= tracing.MaxCauses {
			want = append(want, traceparent(9, i))
		}
	}
	require.Equal(t, want, causes("trace_links", "many"))
	db.MustExec(t, `SELECT compute_mark_dirty('item', 'none')`)
	require.Nil(t, causes("trace_links", "none"), "no cause: NULL")

	// The claim moves the causes to the run; a dirty after it starts afresh,
	// and the run reads both.
	shard := jobs.ShardOf("k", pgtest.DefaultShardCount)
	db.MustExec(t, `DELETE FROM compute_dirty WHERE key <> 'k'`)
	db.MustExec(t, `INSERT INTO compute_leases (name, owner, epoch, expires_at) VALUES ($1, 'w#1', 1, compute_now() + interval '1 hour')`,
		fmt.Sprintf("shard/%d", shard))
	var job int64
	var kind, key string
	var g int64
	require.NoError(t, db.QueryRow(ctx, jobs.ClaimDirtySQL, shard, fmt.Sprintf("shard/%d", shard), "w#1", int64(1),
		[]string{"item"}, []int{32}, 32, time.Now(), jobs.ShardQueue(shard)).Scan(&job, &kind, &key, &g))
	require.Equal(t, "k", key)
	require.Nil(t, causes("trace_links", "k"), "claimed: the causes moved to the run")
	require.Equal(t, []string{traceparent(1, 1), traceparent(2, 2), traceparent(3, 3)}, causes("trace_claimed", "k"))
	db.MustExec(t, `SELECT compute_mark_dirty('item', 'k', 0, NULL, $1)`, traceparent(5, 5))
	require.Equal(t, []string{traceparent(5, 5)}, causes("trace_links", "k"), "a dirty after the claim starts a fresh list")
	var read []string
	require.NoError(t, db.QueryRow(ctx, riverjob.ReadClaimedSQL, "item", job, "").Scan(&key, &g, new(time.Time), &read))
	require.Equal(t, []string{traceparent(1, 1), traceparent(2, 2), traceparent(3, 3), traceparent(5, 5)}, read)
}
