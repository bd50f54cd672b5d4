package outbox_test

import (
	"context"
	"errors"
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

// horizon reads the retention horizon.
func horizon(t testing.TB, db pg.DBTX) outbox.Horizon {
	t.Helper()
	h, err := outbox.ReadHorizon(context.Background(), db)
	require.NoError(t, err)
	through, err := outbox.PrunedThrough(context.Background(), db)
	require.NoError(t, err)
	require.Equal(t, h.Through, through)
	return h
}

// pruneAll prunes until want events are deleted in all (the xmin rule may hold
// rows of just-ended transactions back for a moment: see readN), and fails if
// more were.
func pruneAll(t testing.TB, db pg.DBTX, o outbox.PruneOptions, want int) {
	t.Helper()
	deleted := 0
	waitFor(t, "pruned", func() bool {
		n, err := outbox.Prune(context.Background(), db, o)
		require.NoError(t, err)
		deleted += n
		return deleted >= want
	})
	require.Equal(t, want, deleted)
}

// TestPruneRecordsTheHorizon: Prune records the last event it deleted in its
// own transaction, deletes only a prefix of the log (so everything at or before
// the horizon is gone and everything after it is stored), and never moves the
// horizon back.
func TestPruneRecordsTheHorizon(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)

	h := horizon(t, db.Pool)
	require.Equal(t, outbox.Horizon{}, h, "nothing pruned, nothing stored")
	ids := outboxtest.AppendIDs(t, db.Pool, outbox.Cursor{}, "e", 8)
	h = horizon(t, db.Pool)
	require.True(t, h.Through.IsZero())
	require.Equal(t, ids[0], h.Earliest)
	require.False(t, h.Lost(outbox.Cursor{}), "nothing pruned: nobody lost anything")

	// A sink after e2: Prune deletes e0..e2 and the horizon is e2.
	require.NoError(t, outbox.EnsureSink(ctx, db.Pool, "keep", outbox.After(ids[2])))
	n, err := outbox.Prune(ctx, db.Pool, outbox.PruneOptions{})
	require.NoError(t, err)
	require.Equal(t, 3, n)
	h = horizon(t, db.Pool)
	require.Equal(t, outbox.Horizon{Through: ids[2], Earliest: ids[3], Pruned: 3}, h)
	require.True(t, h.Lost(outbox.Cursor{}))
	require.True(t, h.Lost(ids[1]))
	require.False(t, h.Lost(ids[2]), "at the horizon: everything after it is stored")
	require.False(t, h.Lost(ids[5]))
	require.Equal(t, []string{"e3", "e4", "e5", "e6", "e7"}, stored(t, db.Pool))

	// A pass that deletes nothing leaves it.
	n, err = outbox.Prune(ctx, db.Pool, outbox.PruneOptions{})
	require.NoError(t, err)
	require.Zero(t, n)
	require.Equal(t, ids[2], horizon(t, db.Pool).Through)

	// Rolled back with the caller's transaction, like the delete.
	_, err = outbox.ResetSink(ctx, db.Pool, "keep", outbox.After(ids[3]))
	require.NoError(t, err)
	errBoom := errors.New("boom")
	err = pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		n, err := outbox.Prune(ctx, tx, outbox.PruneOptions{})
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Equal(t, ids[3], horizon(t, tx).Through, "seen inside the transaction")
		return errBoom
	})
	require.ErrorIs(t, err, errBoom)
	require.Equal(t, outbox.Horizon{Through: ids[2], Earliest: ids[3], Pruned: 3}, horizon(t, db.Pool))

	// Prefix only: an old event behind a young one stays until the young one
	// is old too, so the horizon never passes a stored event.
	_, err = outbox.ResetSink(ctx, db.Pool, "keep", outbox.End)
	require.NoError(t, err)
	db.MustExec(t, `UPDATE compute_events SET created_at = created_at - interval '2 hours' WHERE key IN ('e3', 'e5')`)
	n, err = outbox.Prune(ctx, db.Pool, outbox.PruneOptions{Keep: time.Hour})
	require.NoError(t, err)
	require.Equal(t, 1, n, "e3 only: e4 is young and e5 waits behind it")
	require.Equal(t, []string{"e4", "e5", "e6", "e7"}, stored(t, db.Pool))
	require.Equal(t, outbox.Horizon{Through: ids[3], Earliest: ids[4], Pruned: 4}, horizon(t, db.Pool))

	// Bounded by the batch.
	n, err = outbox.Prune(ctx, db.Pool, outbox.PruneOptions{Batch: 2})
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Equal(t, outbox.Horizon{Through: ids[5], Earliest: ids[6], Pruned: 6}, horizon(t, db.Pool))

	// Never back: with the horizon moved past e6 by hand, pruning e6 leaves
	// the horizon where it is (and still counts).
	db.MustExec(t, `UPDATE compute_events_pruned SET through_txid = $1::text::xid8, through_seq = $2`,
		strconv.FormatUint(ids[7].Txid, 10), ids[7].Seq)
	n, err = outbox.Prune(ctx, db.Pool, outbox.PruneOptions{Batch: 1})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	h = horizon(t, db.Pool)
	require.Equal(t, ids[7], h.Through)
	require.EqualValues(t, 7, h.Pruned)

	// Everything pruned: no earliest event.
	n, err = outbox.Prune(ctx, db.Pool, outbox.PruneOptions{})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	h = horizon(t, db.Pool)
	require.Equal(t, outbox.Horizon{Through: ids[7], Pruned: 8}, h)

	// Prune's argument needs read committed.
	err = pg.InTxWith(ctx, db.Pool, pg.TxOptions{Isolation: pg.RepeatableRead}, func(ctx context.Context, tx pgx.Tx) error {
		_, err := outbox.Prune(ctx, tx, outbox.PruneOptions{})
		return err
	})
	require.True(t, fault.Has(err, fault.InvalidArgument), "%v", err)
}

// TestResetSinkRefusesAPrunedPosition: a reset to a cursor whose later events
// retention deleted is INVALID_ARGUMENT, names the horizon and the earliest
// stored event, and changes nothing; start, end, the horizon itself and later
// cursors are accepted.
func TestResetSinkRefusesAPrunedPosition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	ids := outboxtest.AppendIDs(t, db.Pool, outbox.Cursor{}, "e", 5)
	require.NoError(t, outbox.EnsureSink(ctx, db.Pool, "s", outbox.After(ids[1])))
	n, err := outbox.Prune(ctx, db.Pool, outbox.PruneOptions{})
	require.NoError(t, err)
	require.Equal(t, 2, n)
	before, err := outbox.SinkCursor(ctx, db.Pool, "s")
	require.NoError(t, err)

	for _, c := range []outbox.Cursor{{}, ids[0], {Txid: ids[1].Txid, Seq: ids[1].Seq - 1}} {
		_, err = outbox.ResetSink(ctx, db.Pool, "s", outbox.After(c))
		require.True(t, fault.Has(err, fault.InvalidArgument), "%v", err)
		require.EqualError(t, err, "INVALID_ARGUMENT: sink s cannot be reset to "+c.String()+
			": retention has deleted the events after it through "+ids[1].String()+
			" (the earliest available is "+ids[2].String()+"); reset it to start (--to start) to deliver every retained event, or to "+
			ids[1].String()+" (--to "+ids[1].String()+") to deliver what follows the deleted ones")
		after, err := outbox.SinkCursor(ctx, db.Pool, "s")
		require.NoError(t, err)
		require.Equal(t, before, after, "the cursor and its reset generation are unchanged")
	}
	// NOT_FOUND comes first for an unknown sink.
	_, err = outbox.ResetSink(ctx, db.Pool, "nope", outbox.After(ids[0]))
	require.True(t, fault.Has(err, fault.NotFound), "%v", err)

	// Inside the caller's transaction the refusal undoes only its savepoint.
	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		_, err := outbox.ResetSink(ctx, tx, "s", outbox.After(ids[0]))
		require.True(t, fault.Has(err, fault.InvalidArgument), "%v", err)
		c, err := outbox.ResetSink(ctx, tx, "s", outbox.After(ids[3]))
		require.Equal(t, ids[3], c)
		return err
	}))

	for _, tc := range []struct {
		to   outbox.Position
		want outbox.Cursor
	}{{outbox.After(ids[1]), ids[1]}, {outbox.After(ids[4]), ids[4]}, {outbox.Start, outbox.Cursor{}}} {
		c, err := outbox.ResetSink(ctx, db.Pool, "s", tc.to)
		require.NoError(t, err, tc.to)
		require.Equal(t, tc.want, c)
	}
	c, err := outbox.ResetSink(ctx, db.Pool, "s", outbox.End)
	require.NoError(t, err)
	require.True(t, ids[4].Less(c))

	// With everything pruned, the message says nothing is stored.
	pruneAll(t, db.Pool, outbox.PruneOptions{}, 3)
	_, err = outbox.ResetSink(ctx, db.Pool, "s", outbox.After(ids[3]))
	require.ErrorContains(t, err, "through "+ids[4].String()+" (none is stored yet)")
}

// lockWaiters counts the sessions of db's database waiting for a lock.
func lockWaiters(t testing.TB, db *pgtest.DB) int {
	t.Helper()
	return db.MustCount(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`)
}

// TestPruneAndResetSinkTakeTurns shows both orders of a reset and a prune that
// overlap: a reset that waits for a prune sees its horizon and is refused; a
// prune that waits for a reset sees the new cursor and keeps its events.
func TestPruneAndResetSinkTakeTurns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	ids := outboxtest.AppendIDs(t, db.Pool, outbox.Cursor{}, "a", 3)
	require.NoError(t, outbox.EnsureSink(ctx, db.Pool, "s", outbox.End))
	end, err := outbox.SinkCursor(ctx, db.Pool, "s")
	require.NoError(t, err)

	// A prune in progress (not committed) holds the horizon: the reset waits,
	// then reads the horizon the prune left, and is refused.
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	n, err := outbox.Prune(ctx, tx, outbox.PruneOptions{})
	require.NoError(t, err)
	require.Equal(t, 3, n)
	resetErr := make(chan error, 1)
	go func() {
		_, err := outbox.ResetSink(ctx, db.Pool, "s", outbox.After(ids[0]))
		resetErr <- err
	}()
	waitFor(t, "the reset to wait for the prune", func() bool { return lockWaiters(t, db) == 1 })
	require.NoError(t, tx.Commit(ctx))
	err = <-resetErr
	require.True(t, fault.Has(err, fault.InvalidArgument), "%v", err)
	pos, err := outbox.SinkCursor(ctx, db.Pool, "s")
	require.NoError(t, err)
	require.Equal(t, end, pos)

	// A reset in progress holds the horizon: the prune waits, then sees the new
	// cursor and deletes nothing after it.
	ids = outboxtest.AppendIDs(t, db.Pool, ids[2], "b", 3)
	tx, err = db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	c, err := outbox.ResetSink(ctx, tx, "s", outbox.After(ids[0]))
	require.NoError(t, err)
	require.Equal(t, ids[0], c)
	pruned := make(chan int, 1)
	go func() {
		n, err := outbox.Prune(ctx, db.Pool, outbox.PruneOptions{})
		if err != nil {
			t.Errorf("prune: %v", err)
		}
		pruned <- n
	}()
	waitFor(t, "the prune to wait for the reset", func() bool { return lockWaiters(t, db) == 1 })
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, 1, <-pruned, "b0 only: the cursor is there")
	require.Equal(t, []string{"b1", "b2"}, stored(t, db.Pool))
	require.Equal(t, ids[0], horizon(t, db.Pool).Through)
}

// TestResetSinkRacingPruneNeverLosesEvents races a reset to an old, still
// stored cursor against a prune that would delete past it, many times: either
// the reset is refused, or every event after its cursor survives. The sink's
// cursor never ends behind the horizon.
func TestResetSinkRacingPruneNeverLosesEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	require.NoError(t, outbox.EnsureSink(ctx, db.Pool, "s", outbox.End))
	var last outbox.Cursor
	accepted, refused := 0, 0
	// Both orders must have been seen: at least 60 rounds, and on until each
	// outcome has occurred (bounded).
	for i := 0; i < 60 || accepted == 0 || refused == 0; i++ {
		require.Less(t, i, 1000, "after %d rounds: resets accepted %d, refused %d; both outcomes never occurred", i, accepted, refused)
		ids := outboxtest.AppendIDs(t, db.Pool, last, "r", 3)
		last = ids[2]
		_, err := outbox.ResetSink(ctx, db.Pool, "s", outbox.End)
		require.NoError(t, err)

		var (
			wg       sync.WaitGroup
			resetErr error
			pruneErr error
		)
		start := make(chan struct{})
		wg.Add(2)
		go func() {
			defer wg.Done()
			<-start
			_, resetErr = outbox.ResetSink(ctx, db.Pool, "s", outbox.After(ids[0]))
		}()
		go func() {
			defer wg.Done()
			<-start
			_, pruneErr = outbox.Prune(ctx, db.Pool, outbox.PruneOptions{})
		}()
		close(start)
		wg.Wait()
		require.NoError(t, pruneErr)

		pos, err := outbox.SinkCursor(ctx, db.Pool, "s")
		require.NoError(t, err)
		h := horizon(t, db.Pool)
		require.False(t, pos.Cursor.Less(h.Through), "round %d: the sink's cursor %s is behind the horizon %s", i, pos.Cursor, h.Through)
		if resetErr == nil {
			accepted++
			require.Equal(t, ids[0], pos.Cursor)
			var after int
			require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM compute_events WHERE (txid, seq) > ($1::text::xid8, $2)`,
				strconv.FormatUint(ids[0].Txid, 10), ids[0].Seq).Scan(&after))
			require.Equal(t, 2, after, "round %d: every event after the accepted cursor is stored", i)
		} else {
			refused++
			require.True(t, fault.Has(resetErr, fault.InvalidArgument), "%v", resetErr)
			require.False(t, h.Through.Less(ids[0]), "refused only behind the horizon")
		}
	}
	t.Logf("resets accepted %d, refused %d", accepted, refused)
	require.Positive(t, accepted, "a reset won the race")
	require.Positive(t, refused, "a prune won the race")
}
