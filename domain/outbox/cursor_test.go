package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/outbox"
	"github.com/bettercompute/bettercompute/domain/outbox/outboxtest"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

// openTail opens a Tail at p and returns it with the gap it opened with.
func openTail(t testing.TB, db pg.DBTX, p outbox.Position, o outbox.TailOptions) (*outbox.Tail, *outbox.Gap) {
	t.Helper()
	tail, gap, err := outbox.OpenTail(context.Background(), db, p, o)
	require.NoError(t, err)
	return tail, gap
}

// tailKeys calls Next until it has read the event keyed last, and returns the
// keys it read and the gaps Next reported. Every test database shares one
// cluster, so a committed event may take a moment to become readable (see
// readN).
func tailKeys(t testing.TB, db pg.DBTX, tail *outbox.Tail, last string) ([]string, []outbox.Gap) {
	t.Helper()
	var (
		out  []string
		gaps []outbox.Gap
	)
	deadline := time.Now().Add(20 * time.Second)
	for {
		b, err := tail.Next(context.Background(), db)
		require.NoError(t, err)
		if b.Gap != nil {
			gaps = append(gaps, *b.Gap)
		}
		for _, e := range b.Events {
			out = append(out, e.Key)
			if e.Key == last {
				return out, gaps
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("read %v, never %s", out, last)
		}
		if b.Scanned == 0 {
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// TestTailReadsEveryEventOnceInOrder: a Tail at Start, End or after a cursor
// reads every later event of its topics once, in order, and moves its cursor
// past rows of other topics, so a reader resuming there need not scan them
// again.
func TestTailReadsEveryEventOnceInOrder(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	for _, k := range []string{"o0", "o1", "o2"} {
		outboxtest.Append(t, db.Pool, "orders", k, nil)
		outboxtest.Append(t, db.Pool, "other", k, nil)
	}

	tail, gap := openTail(t, db.Pool, outbox.Start, outbox.TailOptions{Topics: []string{"orders"}, Limit: 2})
	require.Nil(t, gap, "Start never opens with a gap")
	require.True(t, tail.Cursor().IsZero(), "nothing pruned: Start is the start of the log")
	keys, gaps := tailKeys(t, db.Pool, tail, "o2")
	require.Equal(t, []string{"o0", "o1", "o2"}, keys)
	require.Empty(t, gaps)

	// The row after o2 is of another topic: the cursor moves past it.
	evs, end := outboxtest.ReadN(t, db.Pool, outbox.Cursor{}, 6)
	require.Equal(t, "other", evs[5].Topic)
	for tail.Cursor() != end {
		b, err := tail.Next(context.Background(), db.Pool)
		require.NoError(t, err)
		require.Empty(t, b.Events)
		require.NotZero(t, b.Scanned, "the row is readable (readN read it)")
	}

	// After a cursor: the events after it. At the end: only events appended
	// from now on.
	after, gap := openTail(t, db.Pool, outbox.After(evs[1].ID), outbox.TailOptions{})
	require.Nil(t, gap)
	require.Equal(t, evs[1].ID, after.Cursor())
	atEnd, gap := openTail(t, db.Pool, outbox.End, outbox.TailOptions{})
	require.Nil(t, gap)
	outboxtest.Append(t, db.Pool, "orders", "new", nil)
	keys, _ = tailKeys(t, db.Pool, after, "new")
	require.Equal(t, []string{"o1", "o1", "o2", "o2", "new"}, keys)
	keys, _ = tailKeys(t, db.Pool, atEnd, "new")
	require.Equal(t, []string{"new"}, keys)
}

// TestTailOpenedBehindTheHorizonHasAGap: a Tail opened after a cursor whose
// later events retention deleted opens at the horizon with a Gap naming it and
// the earliest stored event, and then reads every stored event after it once.
// At or after the horizon, or at Start, there is no gap; Start opens at the
// horizon.
func TestTailOpenedBehindTheHorizonHasAGap(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	ids := outboxtest.AppendIDs(t, db.Pool, outbox.Cursor{}, "e", 6)
	require.NoError(t, outbox.EnsureSink(ctx, db.Pool, "keep", outbox.After(ids[2])))
	n, err := outbox.Prune(ctx, db.Pool, outbox.PruneOptions{})
	require.NoError(t, err)
	require.Equal(t, 3, n)
	outboxtest.Append(t, db.Pool, "t", "sentinel", nil)
	rest := []string{"e3", "e4", "e5", "sentinel"}

	for _, from := range []outbox.Cursor{ids[0], ids[1], {}} {
		tail, gap := openTail(t, db.Pool, outbox.After(from), outbox.TailOptions{Topics: []string{"t"}, Limit: 2})
		require.Equal(t, &outbox.Gap{After: from, Through: ids[2], Earliest: ids[3]}, gap, from)
		require.Equal(t, ids[2], tail.Cursor(), "the Tail goes on after the horizon")
		keys, gaps := tailKeys(t, db.Pool, tail, "sentinel")
		require.Equal(t, rest, keys, "every stored event after the horizon, once, in order")
		require.Empty(t, gaps)
	}

	for _, tc := range []struct {
		from    outbox.Position
		opening outbox.Cursor
		want    []string
	}{
		{outbox.After(ids[2]), ids[2], rest},
		{outbox.After(ids[3]), ids[3], rest[1:]},
		{outbox.Start, ids[2], rest},
	} {
		tail, gap := openTail(t, db.Pool, tc.from, outbox.TailOptions{Limit: 2})
		require.Nil(t, gap, tc.from)
		require.Equal(t, tc.opening, tail.Cursor(), tc.from)
		keys, gaps := tailKeys(t, db.Pool, tail, "sentinel")
		require.Equal(t, tc.want, keys, tc.from)
		require.Empty(t, gaps)
	}
}

// TestTailCheckHorizon: an idle Tail that retention passed learns it from
// CheckHorizon, once, and moves to the horizon; a Tail at Start that has read
// nothing follows the horizon without a gap.
func TestTailCheckHorizon(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	outboxtest.Append(t, db.Pool, "t", "first", nil)
	_, first := outboxtest.ReadN(t, db.Pool, outbox.Cursor{}, 1)

	tail, _ := openTail(t, db.Pool, outbox.Start, outbox.TailOptions{})
	keys, _ := tailKeys(t, db.Pool, tail, "first")
	require.Equal(t, []string{"first"}, keys)
	fresh, _ := openTail(t, db.Pool, outbox.Start, outbox.TailOptions{})
	require.True(t, fresh.Cursor().IsZero())
	gap, err := tail.CheckHorizon(ctx, db.Pool)
	require.NoError(t, err)
	require.Nil(t, gap, "nothing pruned")
	require.Equal(t, first, tail.Cursor())

	ids := outboxtest.AppendIDs(t, db.Pool, first, "e", 3)
	pruneAll(t, db.Pool, outbox.PruneOptions{}, 4) // no sink: first, e0, e1, e2
	outboxtest.Append(t, db.Pool, "t", "new", nil)
	evs, _ := outboxtest.ReadN(t, db.Pool, ids[2], 1)

	gap, err = tail.CheckHorizon(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, &outbox.Gap{After: first, Through: ids[2], Earliest: evs[0].ID}, gap)
	require.Equal(t, ids[2], tail.Cursor())
	gap, err = tail.CheckHorizon(ctx, db.Pool)
	require.NoError(t, err)
	require.Nil(t, gap, "reported once")
	keys, gaps := tailKeys(t, db.Pool, tail, "new")
	require.Equal(t, []string{"new"}, keys)
	require.Empty(t, gaps)

	gap, err = fresh.CheckHorizon(ctx, db.Pool)
	require.NoError(t, err)
	require.Nil(t, gap, "Start has lost nothing")
	require.Equal(t, ids[2], fresh.Cursor(), "a Tail at Start follows the horizon")
}

// TestTailOvertakenByRetentionHasAGap: a Tail has read e0 when retention
// deletes e1..e3. Its next read would jump from e0 to e4; instead, the read sees
// the horizon in its own snapshot, and Next reports the gap with e4. A Tail at
// Start that has read nothing is not overtaken: it reads what is retained.
func TestTailOvertakenByRetentionHasAGap(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	fresh, _ := openTail(t, db.Pool, outbox.Start, outbox.TailOptions{})
	ids := outboxtest.AppendIDs(t, db.Pool, outbox.Cursor{}, "e", 5)
	tail, gap := openTail(t, db.Pool, outbox.After(ids[0]), outbox.TailOptions{Limit: 1})
	require.Nil(t, gap)

	require.NoError(t, outbox.EnsureSink(ctx, db.Pool, "keep", outbox.After(ids[3])))
	pruneAll(t, db.Pool, outbox.PruneOptions{}, 4)

	b, err := tail.Next(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, &outbox.Gap{After: ids[0], Through: ids[3], Earliest: ids[4]}, b.Gap)
	require.Equal(t, 1, b.Scanned)
	require.Len(t, b.Events, 1)
	require.Equal(t, ids[4], b.Events[0].ID)
	require.Equal(t, ids[4], tail.Cursor())

	keys, gaps := tailKeys(t, db.Pool, fresh, "e4")
	require.Equal(t, []string{"e4"}, keys)
	require.Empty(t, gaps, "Start has lost nothing")
}
