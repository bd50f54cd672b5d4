package outbox_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/outbox"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

// TestEventPayloadIntoJSONB is an application writing the payload of an event
// it was handed (a json.RawMessage) straight into its own json and jsonb
// columns, and a map[string]any too, with no cast in the SQL: directly, and
// through a real PgBouncer in transaction mode. The pool's statements run in
// QueryExecModeExec, where pgx picks a parameter's type from the Go value; a
// value sent as bytea would fail with 22P02 (invalid input syntax for type
// json), and a map would not encode at all. With the statement cache the
// prepared statement's parameter types decide, and the same values go in.
func TestEventPayloadIntoJSONB(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	direct := pgtest.New(t)
	direct.MustExec(t, `CREATE TABLE app_audit (id text PRIMARY KEY, body jsonb NOT NULL, raw json NOT NULL)`)
	viaURL := pgtest.PgBouncer(t, direct)
	for name, o := range map[string]pg.Options{
		"direct":                  {URL: direct.URL},
		"direct, statement cache": {URL: direct.URL, StatementCache: true},
		"pgbouncer":               {URL: viaURL},
	} {
		t.Run(name, func(t *testing.T) {
			o.MaxConns, o.StatementTimeout = 4, 5*time.Second
			db, err := pg.Open(ctx, o)
			require.NoError(t, err)
			defer db.Close()

			key := "order-" + name
			require.NoError(t, pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
				return outbox.AppendTx(ctx, tx, outbox.Message{Topic: "order.paid", Key: key,
					Payload: map[string]any{"order": key, "cents": 1250, "lines": []string{"a", "b"}}})
			}))
			// Read it as a sink would, once it is readable (every older
			// transaction of the shared test cluster ended).
			var e outbox.Event
			require.Eventually(t, func() bool {
				evs, _, _, err := outbox.Read(ctx, db, outbox.ReadOptions{Topics: []string{"order.paid"}})
				require.NoError(t, err)
				for _, ev := range evs {
					if ev.Key == key {
						e = ev
					}
				}
				return e.Key == key
			}, 20*time.Second, 5*time.Millisecond)
			require.Equal(t, key, e.Key)
			var _ json.RawMessage = e.Payload // what a handler is handed

			require.NoError(t, pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `INSERT INTO app_audit (id, body, raw) VALUES ($1, $2, $3)`, e.ID.String(), e.Payload, e.Payload)
				return err
			}), "a json.RawMessage goes into jsonb and json as it is")
			var cents int
			var kind string
			require.NoError(t, db.QueryRow(ctx, `SELECT (body->>'cents')::int, jsonb_typeof(body) FROM app_audit WHERE id = $1`, e.ID.String()).Scan(&cents, &kind))
			require.Equal(t, 1250, cents)
			require.Equal(t, "object", kind, "stored as a JSON object, not a string or bytes")

			// Operators that take jsonb take the payload too, and a map is jsonb.
			_, err = db.Exec(ctx, `UPDATE app_audit SET body = body || $2 WHERE id = $1`, e.ID.String(), map[string]any{"seen": true})
			require.NoError(t, err)
			var n int
			require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM app_audit WHERE body @> $1 AND id = $2`, e.Payload, e.ID.String()).Scan(&n))
			require.Equal(t, 1, n)
			var seen bool
			require.NoError(t, db.QueryRow(ctx, `SELECT (body->>'seen')::bool FROM app_audit WHERE id = $1`, e.ID.String()).Scan(&seen))
			require.True(t, seen)
		})
	}
}
