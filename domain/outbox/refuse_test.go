package outbox_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/outbox"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

// TestTextPostgreSQLRefusesIsRefusedFirst: an event topic or key that is not
// valid UTF-8 or holds a NUL byte, a payload jsonb refuses (a string holding a
// NUL byte, raw \u0000, raw bytes that are not JSON or not UTF-8), a sink name
// or read topic of that kind, are INVALID_ARGUMENT and send no statement: the
// caller's transaction goes on and commits, and nothing is written. Sent, each
// failed with INTERNAL_ERROR and aborted the caller's transaction.
func TestTextPostgreSQLRefusesIsRefusedFirst(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	require.NoError(t, outbox.EnsureSink(context.Background(), db.Pool, "audit", outbox.Start))
	appendTx := func(msgs ...outbox.Message) func(ctx context.Context, tx pgx.Tx) error {
		return func(ctx context.Context, tx pgx.Tx) error { return outbox.AppendTx(ctx, tx, msgs...) }
	}
	good := outbox.Message{Topic: "order.paid", Key: "o-1", Payload: map[string]int{"cents": 1}}
	for name, call := range map[string]func(ctx context.Context, tx pgx.Tx) error{
		"append, NUL topic":                appendTx(outbox.Message{Topic: "order\x00paid", Key: "o-1"}),
		"append, invalid UTF-8 topic":      appendTx(outbox.Message{Topic: "order\xc3", Key: "o-1"}),
		"append, NUL key":                  appendTx(outbox.Message{Topic: "order.paid", Key: "o-1\x00"}),
		"append, invalid UTF-8 key":        appendTx(outbox.Message{Topic: "order.paid", Key: "\xffo-1"}),
		"append, NUL in the payload":       appendTx(outbox.Message{Topic: "order.paid", Payload: map[string]string{"by": "a\x00"}}),
		"append, raw \\u0000 payload":      appendTx(outbox.Message{Topic: "order.paid", Payload: json.RawMessage(`{"by":"\u0000"}`)}),
		"append, raw payload not JSON":     appendTx(outbox.Message{Topic: "order.paid", Payload: []byte(`{"by":`)}),
		"append, raw payload not UTF-8":    appendTx(outbox.Message{Topic: "order.paid", Payload: []byte("\"\xff\"")}),
		"append many, one NUL key":         appendTx(good, outbox.Message{Topic: "order.paid", Key: "o-2\x00"}),
		"append many, one \\u0000 payload": appendTx(good, outbox.Message{Topic: "order.paid", Payload: json.RawMessage(`["\u0000"]`)}),
		"pause, NUL sink name":             func(ctx context.Context, tx pgx.Tx) error { return outbox.PauseSink(ctx, tx, "audit\x00") },
		"resume, invalid UTF-8 sink name":  func(ctx context.Context, tx pgx.Tx) error { return outbox.ResumeSink(ctx, tx, "audit\xff") },
		"reset, NUL sink name": func(ctx context.Context, tx pgx.Tx) error {
			_, err := outbox.ResetSink(ctx, tx, "audit\x00", outbox.End)
			return err
		},
		"get, NUL sink name": func(ctx context.Context, tx pgx.Tx) error {
			_, err := outbox.GetSink(ctx, tx, "audit\x00")
			return err
		},
		"cursor, NUL sink name": func(ctx context.Context, tx pgx.Tx) error {
			_, err := outbox.SinkCursor(ctx, tx, "audit\x00")
			return err
		},
		"read, NUL topic": func(ctx context.Context, tx pgx.Tx) error {
			_, _, _, err := outbox.Read(ctx, tx, outbox.ReadOptions{Topics: []string{"order.paid", "\x00"}})
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			err := db.RequireRefusal(t, fault.InvalidArgument, func(ctx context.Context, tx pgx.Tx) error {
				c := &statementCounter{Tx: tx}
				err := call(ctx, c)
				require.Zero(t, c.n, "no statement is sent")
				return err
			})
			require.NotContains(t, err.Error(), "\x00", "the bad bytes are quoted, not echoed")
		})
	}
	require.Equal(t, 0, db.MustCount(t, `SELECT count(*) FROM compute_events`))
	s, err := outbox.GetSink(context.Background(), db.Pool, "audit")
	require.NoError(t, err)
	require.False(t, s.Paused)
}
