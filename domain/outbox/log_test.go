package outbox_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/outbox"
	"github.com/bettercompute/bettercompute/domain/outbox/outboxtest"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// stored lists the keys of every stored event in (txid, seq) order.
func stored(t testing.TB, db pg.DBTX) []string {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT key FROM compute_events ORDER BY txid, seq`)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return out
}

func keys(evs []outbox.Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.Key
	}
	return out
}

func TestAppendWritesInTheCallersTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)

	// A rolled-back transaction writes nothing.
	errBoom := fault.New(fault.Conflict, "boom")
	err := pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		require.NoError(t, outbox.AppendTx(ctx, tx, outbox.Message{Topic: "t", Key: "rolled-back"}))
		return errBoom
	})
	require.ErrorIs(t, err, errBoom)
	require.Equal(t, 0, db.MustCount(t, `SELECT count(*) FROM compute_events`))

	// Several events of one call keep their order; payloads round-trip.
	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		return outbox.AppendTx(ctx, tx,
			outbox.Message{Topic: "t", Key: "a", Payload: map[string]int{"n": 1}},
			outbox.Message{Topic: "u", Key: "b", Payload: []byte(`[1,2]`)},
			outbox.Message{Topic: "t", Key: "c"})
	}))
	outboxtest.Append(t, db.Pool, "t", "d", "text")
	evs, end := outboxtest.ReadN(t, db.Pool, outbox.Cursor{}, 4)
	require.Equal(t, []string{"a", "b", "c", "d"}, keys(evs))
	require.JSONEq(t, `{"n":1}`, string(evs[0].Payload))
	require.JSONEq(t, `[1,2]`, string(evs[1].Payload))
	require.JSONEq(t, `null`, string(evs[2].Payload))
	require.Equal(t, evs[0].ID.Txid, evs[2].ID.Txid, "one transaction, one txid")
	require.Less(t, evs[0].ID.Seq, evs[1].ID.Seq)
	require.Equal(t, evs[3].ID, end)

	// A topic filter keeps those topics but moves past every scanned row.
	evs, _, scanned, err := outbox.Read(ctx, db.Pool, outbox.ReadOptions{Topics: []string{"u"}})
	require.NoError(t, err)
	require.Equal(t, []string{"b"}, keys(evs))
	require.Equal(t, 4, scanned)
	evs, next, _, err := outbox.Read(ctx, db.Pool, outbox.ReadOptions{Topics: []string{"u"}, Limit: 1})
	require.NoError(t, err)
	require.Empty(t, evs, "a row of another topic is moved past")
	require.Equal(t, evs0ID(t, db.Pool), next)
	_ = end

	// Bad input is INVALID_ARGUMENT and writes nothing.
	for _, m := range []outbox.Message{{Topic: ""}, {Topic: string(make([]byte, 201))}, {Topic: "t", Key: string(make([]byte, 513))}, {Topic: "t", Payload: func() {}}} {
		err := pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error { return outbox.AppendTx(ctx, tx, m) })
		require.True(t, fault.Has(err, fault.InvalidArgument), "%v", err)
	}
	require.Equal(t, 4, db.MustCount(t, `SELECT count(*) FROM compute_events`))
}

func TestCursorText(t *testing.T) {
	t.Parallel()
	c, err := outbox.ParseCursor("18446744073709551615:42")
	require.NoError(t, err)
	require.Equal(t, outbox.Cursor{Txid: 18446744073709551615, Seq: 42}, c)
	require.Equal(t, "18446744073709551615:42", c.String())
	for _, bad := range []string{"", "1", "a:1", "1:b", "1:-1", "-1:1"} {
		_, err := outbox.ParseCursor(bad)
		require.True(t, fault.Has(err, fault.InvalidArgument), bad)
	}
	for in, want := range map[string]string{"start": "start", "end": "end", "7:8": "7:8"} {
		p, err := outbox.ParsePosition(in)
		require.NoError(t, err)
		require.Equal(t, want, p.String())
	}
	_, err = outbox.ParsePosition("middle")
	require.True(t, fault.Has(err, fault.InvalidArgument))
	require.True(t, outbox.Cursor{Txid: 2, Seq: 9}.Less(outbox.Cursor{Txid: 10, Seq: 1}), "txid compares as a number, not as text")
}

// TestCommitOrderIsNotSeqOrder: the transaction holding the lower seq commits
// last. A reader polling all along never skips its row and never reads out of
// cursor order, while a reader without the xmin rule would have skipped it.
//
// Not parallel: its open transactions hold back every reader of the cluster.
func TestCommitOrderIsNotSeqOrder(t *testing.T) {
	ctx := context.Background()
	db := pgtest.New(t)

	// A poller reads continuously, following its cursor, from the start.
	var (
		mu     sync.Mutex
		polled []outbox.Event
	)
	stop := make(chan struct{})
	pollerDone := make(chan struct{})
	go func() {
		defer close(pollerDone)
		var c outbox.Cursor
		for {
			select {
			case <-stop:
				return
			default:
			}
			evs, next, _, err := outbox.Read(ctx, db.Pool, outbox.ReadOptions{After: c, Limit: 100})
			if err != nil {
				t.Errorf("poller: %v", err)
				return
			}
			mu.Lock()
			polled = append(polled, evs...)
			mu.Unlock()
			c = next
			time.Sleep(time.Millisecond)
		}
	}()
	polledKeys := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return keys(polled)
	}

	begin := func() pgx.Tx {
		tx, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Rollback(context.WithoutCancel(ctx)) })
		return tx
	}
	add := func(tx pgx.Tx, key string) {
		require.NoError(t, outbox.AppendTx(ctx, tx, outbox.Message{Topic: "t", Key: key}))
	}

	// Case 1: A appends first (lower txid, lower seq), B appends and commits,
	// then A commits.
	txA, txB := begin(), begin()
	add(txA, "a1")
	add(txB, "b1")
	require.NoError(t, txB.Commit(ctx))
	// B is committed and visible; a reader that trusted (txid, seq) alone would
	// read b1 now and move its cursor past a1 for ever.
	var naive int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM compute_events WHERE key = 'b1'`).Scan(&naive))
	require.Equal(t, 1, naive, "the hazard is real: b1 is visible while a1 is not committed")
	for i := 0; i < 5; i++ {
		evs, _, _, err := outbox.Read(ctx, db.Pool, outbox.ReadOptions{})
		require.NoError(t, err)
		require.Empty(t, evs, "nothing may be read past the running transaction A")
	}
	require.Empty(t, polledKeys())
	require.NoError(t, txA.Commit(ctx))
	waitFor(t, "a1 and b1", func() bool { return len(polledKeys()) == 2 })
	require.Equal(t, []string{"a1", "b1"}, polledKeys())

	// Case 2: B takes its txid first, A appends the lower seq with the higher
	// txid, B appends and commits, A commits last: the log reads b2 then a2, in
	// cursor order though not in seq order, and skips neither.
	txA, txB = begin(), begin()
	_, err := txB.Exec(ctx, `SELECT pg_current_xact_id()`)
	require.NoError(t, err)
	add(txA, "a2")
	add(txB, "b2")
	require.NoError(t, txB.Commit(ctx))
	waitFor(t, "b2", func() bool { return len(polledKeys()) == 3 })
	require.NoError(t, txA.Commit(ctx))
	waitFor(t, "a2", func() bool { return len(polledKeys()) == 4 })

	close(stop)
	<-pollerDone
	require.Equal(t, []string{"a1", "b1", "b2", "a2"}, polledKeys())
	mu.Lock()
	defer mu.Unlock()
	for i := 1; i < len(polled); i++ {
		require.True(t, polled[i-1].ID.Less(polled[i].ID), "cursor order: %v then %v", polled[i-1].ID, polled[i].ID)
	}
	var a2, b2 outbox.Event
	for _, e := range polled {
		switch e.Key {
		case "a2":
			a2 = e
		case "b2":
			b2 = e
		}
	}
	require.Less(t, a2.ID.Seq, b2.ID.Seq, "a2 has the lower seq")
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestPruneDeletesOnlyRowsEveryCursorPassed: retention never deletes an event
// some sink has not delivered, nor one inside the replay window, nor more than
// its batch.
func TestPruneDeletesOnlyRowsEveryCursorPassed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	var ids []outbox.Cursor
	for i := 0; i < 10; i++ {
		outboxtest.Append(t, db.Pool, "t", string(rune('a'+i)), i)
	}
	evs, _ := outboxtest.ReadN(t, db.Pool, outbox.Cursor{}, 10)
	for _, e := range evs {
		ids = append(ids, e.ID)
	}
	remaining := func() []string { return stored(t, db.Pool) }
	require.NoError(t, outbox.EnsureSink(ctx, db.Pool, "s1", outbox.After(ids[2])))
	require.NoError(t, outbox.EnsureSink(ctx, db.Pool, "s2", outbox.After(ids[6])))

	// Only rows both cursors passed (a, b, c) go.
	n, err := outbox.Prune(ctx, db.Pool, outbox.PruneOptions{})
	require.NoError(t, err)
	require.Equal(t, 3, n)
	require.Equal(t, []string{"d", "e", "f", "g", "h", "i", "j"}, remaining())

	// s1 moves past s2: now s2's cursor (g) bounds it; a batch of 2 deletes 2.
	_, err = outbox.ResetSink(ctx, db.Pool, "s1", outbox.After(ids[8]))
	require.NoError(t, err)
	n, err = outbox.Prune(ctx, db.Pool, outbox.PruneOptions{Batch: 2})
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Equal(t, []string{"f", "g", "h", "i", "j"}, remaining())
	n, err = outbox.Prune(ctx, db.Pool, outbox.PruneOptions{})
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Equal(t, []string{"h", "i", "j"}, remaining())

	// A paused sink still holds rows back.
	require.NoError(t, outbox.PauseSink(ctx, db.Pool, "s2"))
	n, err = outbox.Prune(ctx, db.Pool, outbox.PruneOptions{})
	require.NoError(t, err)
	require.Zero(t, n)

	// The replay window: both cursors at the end, only h is old enough.
	for _, s := range []string{"s1", "s2"} {
		_, err = outbox.ResetSink(ctx, db.Pool, s, outbox.End)
		require.NoError(t, err)
	}
	db.MustExec(t, `UPDATE compute_events SET created_at = created_at - interval '2 hours' WHERE key = 'h'`)
	n, err = outbox.Prune(ctx, db.Pool, outbox.PruneOptions{Keep: time.Hour})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, []string{"i", "j"}, remaining())

	// With no sinks, the rows of running transactions stay.
	db.MustExec(t, `DELETE FROM compute_sinks`)
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	require.NoError(t, outbox.AppendTx(ctx, tx, outbox.Message{Topic: "t", Key: "open"}))
	deleted := 0
	waitFor(t, "i and j pruned", func() bool {
		n, err := outbox.Prune(ctx, db.Pool, outbox.PruneOptions{})
		require.NoError(t, err)
		deleted += n
		return deleted == 2
	})
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, []string{"open"}, remaining())
}

// evs0ID is the cursor of the first stored event.
func evs0ID(t testing.TB, db pg.DBTX) outbox.Cursor {
	t.Helper()
	var txid string
	var seq int64
	require.NoError(t, db.QueryRow(context.Background(), `SELECT txid::text, seq FROM compute_events ORDER BY txid, seq LIMIT 1`).Scan(&txid, &seq))
	c, err := outbox.ParseCursor(txid + ":" + strconv.FormatInt(seq, 10))
	require.NoError(t, err)
	return c
}
