package outbox_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/outbox"
	"github.com/bettercompute/bettercompute/domain/outbox/outboxtest"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

func TestSinkState(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	for i := 0; i < 3; i++ {
		outboxtest.Append(t, db.Pool, "t", "k", i)
	}
	evs, last := outboxtest.ReadN(t, db.Pool, outbox.Cursor{}, 3)

	require.True(t, fault.Has(outbox.EnsureSink(ctx, db.Pool, "Bad Name", outbox.Start), fault.InvalidConfig))
	require.NoError(t, outbox.EnsureSink(ctx, db.Pool, "from-start", outbox.Start))
	require.NoError(t, outbox.EnsureSink(ctx, db.Pool, "from-end", outbox.End))
	// An existing sink keeps its cursor.
	require.NoError(t, outbox.EnsureSink(ctx, db.Pool, "from-start", outbox.End))

	s, err := outbox.GetSink(ctx, db.Pool, "from-start")
	require.NoError(t, err)
	require.True(t, s.Cursor.IsZero())
	require.EqualValues(t, 3, s.LagRows)
	require.Positive(t, s.LagAge)
	s, err = outbox.GetSink(ctx, db.Pool, "from-end")
	require.NoError(t, err)
	require.True(t, last.Less(s.Cursor), "the end is after every committed event")
	require.Zero(t, s.LagRows)

	// Pause, resume, reset; unknown sinks are NOT_FOUND naming the known ones.
	require.NoError(t, outbox.PauseSink(ctx, db.Pool, "from-start"))
	pos, err := outbox.SinkCursor(ctx, db.Pool, "from-start")
	require.NoError(t, err)
	require.True(t, pos.Paused)
	require.NoError(t, outbox.ResumeSink(ctx, db.Pool, "from-start"))
	err = outbox.PauseSink(ctx, db.Pool, "nope")
	require.True(t, fault.Has(err, fault.NotFound))
	require.ErrorContains(t, err, `unknown sink "nope": known sinks: from-end, from-start`)
	_, err = outbox.ResetSink(ctx, db.Pool, "nope", outbox.Start)
	require.True(t, fault.Has(err, fault.NotFound))

	c, err := outbox.ResetSink(ctx, db.Pool, "from-end", outbox.After(evs[0].ID))
	require.NoError(t, err)
	require.Equal(t, evs[0].ID, c)
	s, err = outbox.GetSink(ctx, db.Pool, "from-end")
	require.NoError(t, err)
	require.EqualValues(t, 2, s.LagRows)

	// The cursor advance is guarded by the position read before the delivery:
	// after a reset, even back to the same cursor, that delivery moves nothing.
	before, err := outbox.SinkCursor(ctx, db.Pool, "from-end")
	require.NoError(t, err)
	require.Equal(t, evs[0].ID, before.Cursor)
	_, err = outbox.ResetSink(ctx, db.Pool, "from-end", outbox.After(evs[0].ID))
	require.NoError(t, err)
	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		moved, err := outbox.AdvanceSinkTx(ctx, tx, "from-end", before, last, 3)
		require.False(t, moved)
		return err
	}))
	now, err := outbox.SinkCursor(ctx, db.Pool, "from-end")
	require.NoError(t, err)
	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		moved, err := outbox.AdvanceSinkTx(ctx, tx, "from-end", now, last, 2)
		require.True(t, moved)
		return err
	}))
	require.NoError(t, outbox.RecordSinkFailure(ctx, db.Pool, "from-start", "receiver down"))
	ss, err := outbox.ListSinks(ctx, db.Pool)
	require.NoError(t, err)
	require.Len(t, ss, 2)
	require.Equal(t, "from-end", ss[0].Name)
	require.Equal(t, last, ss[0].Cursor)
	require.EqualValues(t, 2, ss[0].Delivered)
	require.NotNil(t, ss[0].DeliveredAt)
	require.Equal(t, "receiver down", ss[1].LastError)
	require.Equal(t, 1, ss[1].Failures)

	// Reset clears failures.
	_, err = outbox.ResetSink(ctx, db.Pool, "from-start", outbox.End)
	require.NoError(t, err)
	s, err = outbox.GetSink(ctx, db.Pool, "from-start")
	require.NoError(t, err)
	require.Empty(t, s.LastError)
	require.Zero(t, s.Failures)
}
