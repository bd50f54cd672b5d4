package jobs_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/tracing"
)

// TestDirtyRefusesBadInputWithInvalidArgument: a bad kind or key is the caller's
// error, INVALID_ARGUMENT, refused before any statement is sent (tx is not used).
// TestReconcileArgsThatCannotBeWorked: args without a valid kind or a key fail
// to decode with INVALID_ARGUMENT, which workers turn into a cancelled job.
// TestMarkDirtyFromSQL: compute_mark_dirty, the SQL face of DirtyTx, refuses a
// bad kind, key or delay with SQLSTATE 22023 (INVALID_ARGUMENT once translated)
// and writes nothing; a good call writes the row DirtyTx would, in the key's
// shard by the same FNV-1a as Go (compute_key_hash agrees with KeyHash).
// fnv1a32 is FNV-1a, 32 bits, written out from its definition (offset basis
// 2166136261, prime 16777619), apart from the hash/fnv that KeyHash uses.
func fnv1a32(s string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= 16777619
	}
	return h
}

// TestShardOfIsFNV1aModCount: a key's shard is FNV-1a(key) mod the shard count,
// for every count, and pinned to literal values (FNV-1a's published vectors for
// "a" and "foobar" among them): a changed hash would move every key of a
// running deployment to another shard.
func TestShardOfIsFNV1aModCount(t *testing.T) {
	t.Parallel()
	// Literal: key, its hash, and its shard among 1, 7, 16, 256 and 4096 shards.
	for _, p := range []struct {
		key    string
		hash   uint32
		shards [5]int
	}{
		{"a", 0xe40c292c, [5]int{0, 5, 12, 44, 2348}},
		{"foobar", 0xbf9cf968, [5]int{0, 0, 8, 104, 2408}},
		{"order-42", 0x572446f4, [5]int{0, 4, 4, 244, 1780}},
		{"item-07", 0xd5377a0c, [5]int{0, 4, 12, 12, 2572}},
		{"ünïcödé ✓", 0x3483e249, [5]int{0, 3, 9, 73, 585}},
	} {
		require.Equal(t, p.hash, jobs.KeyHash(p.key), "KeyHash(%q)", p.key)
		for i, count := range []int{1, 7, 16, 256, 4096} {
			require.Equal(t, p.shards[i], jobs.ShardOf(p.key, count), "ShardOf(%q, %d)", p.key, count)
		}
	}
	// Computed: many keys, many counts.
	for i := 0; i < 2000; i++ {
		key := fmt.Sprintf("key-%d", i)
		if i%3 == 0 {
			key = strings.Repeat("é", i%257) + key
		}
		require.Equal(t, fnv1a32(key), jobs.KeyHash(key), "KeyHash(%q)", key)
		for _, count := range []int{1, 2, 3, 7, 16, 100, 1024, 4096} {
			require.Equal(t, int(fnv1a32(key)%uint32(count)), jobs.ShardOf(key, count), "ShardOf(%q, %d)", key, count)
		}
	}
}

// traceparent is a W3C traceparent of trace t, span s (sampled).
// sampledCtx is a context whose span (trace t, span s) is sampled, as an
// application's request's would be.
// TestMarkDirtyRecordsCauses: compute_mark_dirty records each caller's cause
// on the key's row, once each and in order, at most tracing.MaxCauses: the
// one passed (DirtyTx's), or else the transaction's bettercompute.traceparent
// (TraceTx's, or set_config's: what a trigger's call records). A malformed one
// is ignored and the dirty done. The claim moves the causes to its run, so a
// later dirty starts a fresh list, and the run reads both.
// TestDirtyCausesCostNothingWithoutASampledSpan: what DirtyTx (and AppendTx,
// StartTx, SignalTx) add to a call when the context has no sampled span is
// one check, without an allocation: the cause is a nil argument (NULL).
func TestDirtyCausesCostNothingWithoutASampledSpan(t *testing.T) {
	unsampled := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1}}))
	for _, ctx := range []context.Context{context.Background(), unsampled} {
		var c any
		require.Zero(t, testing.AllocsPerRun(1000, func() { c = tracing.CauseOrNil(ctx) }))
		require.Nil(t, c)
	}
}
