package backfill

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/platform/fault"
)

// TestNamesPostgreSQLRefusesAreRefusedFirst: a backfill name that is not valid
// UTF-8 or holds a NUL byte is refused before any statement is sent, and a
// caller's transaction goes on and commits: INVALID_ARGUMENT from Get,
// Resume, Pause and Cancel (it failed with INTERNAL_ERROR), and INVALID_CONFIG
// from Start, whose Backfill is a registered definition (Validate).
func TestNamesPostgreSQLRefusesAreRefusedFirst(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	for name, call := range map[string]func(ctx context.Context, tx pgx.Tx) error{
		"get, NUL name": func(ctx context.Context, tx pgx.Tx) error {
			_, err := Get(ctx, tx, "fill\x00")
			return err
		},
		"resume, invalid UTF-8 name": func(ctx context.Context, tx pgx.Tx) error {
			_, err := Resume(ctx, tx, "fill\xff")
			return err
		},
		"pause, NUL name": func(ctx context.Context, tx pgx.Tx) error {
			_, err := Pause(ctx, tx, "fill\x00")
			return err
		},
		"cancel, NUL name": func(ctx context.Context, tx pgx.Tx) error {
			_, err := Cancel(ctx, tx, "\x00")
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			err := db.RequireRefusal(t, fault.InvalidArgument, call)
			require.NotContains(t, err.Error(), "\x00", "the bad bytes are quoted, not echoed")
		})
	}
	b := fillBackfill("fill\x00", "no_table", nil, nil)
	db.RequireRefusal(t, fault.InvalidConfig, func(ctx context.Context, tx pgx.Tx) error {
		_, err := Start(ctx, tx, b)
		return err
	})
	require.Equal(t, 0, db.MustCount(t, `SELECT count(*) FROM compute_backfills`))
}

// TestBatchErrorWithBadTextIsRecorded: a batch's error that holds a NUL byte
// and invalid UTF-8 is the backfill's last_error with those bytes dropped or
// replaced; the write that records it failed with them before.
func TestBatchErrorWithBadTextIsRecorded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newDB(t)
	makeTable(t, db, "badtext_items", 100)
	b := fillBackfill("badtext_fill", "badtext_items", func(_ context.Context, call int) error {
		if call == 1 {
			return errors.New("row \x00seven \xff")
		}
		return nil
	}, nil)
	startWorker(t, db, registry(t, b), nil)
	_, err := Start(ctx, db.Pool, b)
	require.NoError(t, err)
	p := waitErrors(t, db, b.Name, 1)
	require.Equal(t, "attempt 1: backfill badtext_fill batch 0: row seven \uFFFD", *p.LastError)
	waitState(t, db, b.Name, Done, 60*time.Second)
}
