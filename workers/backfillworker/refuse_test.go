package backfillworker

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/backfill"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/workers"
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
			_, err := backfill.Get(ctx, tx, "fill\x00")
			return err
		},
		"resume, invalid UTF-8 name": func(ctx context.Context, tx pgx.Tx) error {
			_, err := backfill.Resume(ctx, tx, "fill\xff")
			return err
		},
		"pause, NUL name": func(ctx context.Context, tx pgx.Tx) error {
			_, err := backfill.Pause(ctx, tx, "fill\x00")
			return err
		},
		"cancel, NUL name": func(ctx context.Context, tx pgx.Tx) error {
			_, err := backfill.Cancel(ctx, tx, "\x00")
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			err := db.RequireRefusal(t, fault.InvalidArgument, call)
			require.NotContains(t, err.Error(), "\x00", "the bad bytes are quoted, not echoed")
		})
	}
	b := fillBackfill("fill\x00", "no_table", nil, nil)
	db.RequireRefusal(t, fault.InvalidArgument, func(ctx context.Context, tx pgx.Tx) error {
		_, err := startBackfill(ctx, tx, b) // backfill.Start of a name no registry would take
		return err
	})
	require.Equal(t, fault.InvalidConfig, fault.CodeOf(Add(workers.NewRegistry(), b)), "the registry refuses it first")
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
	_, err := startBackfill(ctx, db.Pool, b)
	require.NoError(t, err)
	p := waitErrors(t, db, b.Name, 1)
	require.Equal(t, "attempt 1: backfill badtext_fill batch 0: row seven \uFFFD", *p.LastError)
	waitState(t, db, b.Name, backfill.Done, 60*time.Second)
}
