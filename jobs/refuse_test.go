package jobs_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
)

type rawArgs struct {
	Payload json.RawMessage `json:"payload"`
}

func (rawArgs) Kind() string { return "raw_note" }

// TestRefusesTextPostgreSQLRefuses: a key that is not valid UTF-8 or holds a
// NUL byte (DirtyTx, InsertForKeyTx), and job args or metadata whose JSON jsonb
// refuses (InsertTx), are INVALID_ARGUMENT naming what is wrong, refused before
// any statement is sent: the caller's transaction goes on and commits. Sent,
// each would fail with INTERNAL_ERROR (SQLSTATE 22021 or 22P05) and abort it.
func TestRefusesTextPostgreSQLRefuses(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	for name, call := range map[string]func(ctx context.Context, tx pgx.Tx) error{
		"dirty, NUL key": func(ctx context.Context, tx pgx.Tx) error {
			return workers.DirtyTx(ctx, tx, "item", "a\x00b", nil)
		},
		"dirty, invalid UTF-8 key": func(ctx context.Context, tx pgx.Tx) error {
			return workers.DirtyTx(ctx, tx, "item", "caf\xe9", nil)
		},
		"insert for key, NUL key": func(ctx context.Context, tx pgx.Tx) error {
			_, err := workers.InsertForKeyTx(ctx, tx, "order\x00", shipArgs{OrderID: "order"}, nil)
			return err
		},
		"insert for key, invalid UTF-8 key": func(ctx context.Context, tx pgx.Tx) error {
			_, err := workers.InsertForKeyTx(ctx, tx, "order\xff", shipArgs{OrderID: "order"}, nil)
			return err
		},
		"insert for key, NUL in the args": func(ctx context.Context, tx pgx.Tx) error {
			_, err := workers.InsertForKeyTx(ctx, tx, "order-1", shipArgs{OrderID: "order\x00"}, nil)
			return err
		},
		"insert, \\u0000 in raw args": func(ctx context.Context, tx pgx.Tx) error {
			_, err := jobs.InsertTx(ctx, tx, rawArgs{Payload: json.RawMessage(`{"note":"a\u0000b"}`)}, nil)
			return err
		},
		"insert, \\u0000 in the metadata": func(ctx context.Context, tx pgx.Tx) error {
			_, err := jobs.InsertTx(ctx, tx, noteArgs{}, &river.InsertOpts{Metadata: []byte(`{"who":"\u0000"}`)})
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			err := db.RequireRefusal(t, fault.InvalidArgument, call)
			require.NotContains(t, err.Error(), "\x00", "the bad bytes are quoted, not echoed")
		})
	}
	require.Equal(t, 0, db.MustCount(t, `SELECT count(*) FROM river_job`))
	require.Equal(t, 0, db.MustCount(t, `SELECT count(*) FROM compute_dirty`))

	// The same calls with good text go through.
	err := pg.InTx(context.Background(), db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		if err := workers.DirtyTx(ctx, tx, "item", "café", nil); err != nil {
			return err
		}
		if _, err := workers.InsertForKeyTx(ctx, tx, "order-é", shipArgs{OrderID: "order-é"}, nil); err != nil {
			return err
		}
		_, err := jobs.InsertTx(ctx, tx, rawArgs{Payload: json.RawMessage(`{"note":"\\u0000 \ud83d\ude00"}`)}, &river.InsertOpts{Metadata: []byte(`{"who":"é"}`)})
		return err
	})
	require.NoError(t, err)
}
