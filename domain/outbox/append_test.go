package outbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/bettercompute/bettercompute/domain/outbox"
	"github.com/bettercompute/bettercompute/domain/outbox/outboxtest"
	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/platform/tracing"
)

// statementCounter is a pgx.Tx that counts the statements sent through it.
type statementCounter struct {
	pgx.Tx
	n int
}

func (c *statementCounter) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	c.n++
	return c.Tx.Exec(ctx, sql, args...)
}

func (c *statementCounter) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	c.n++
	return c.Tx.Query(ctx, sql, args...)
}

func (c *statementCounter) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	c.n++
	return c.Tx.QueryRow(ctx, sql, args...)
}

func (c *statementCounter) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	c.n += b.Len()
	return c.Tx.SendBatch(ctx, b)
}

// TestAppendIsOneStatement: an Append, of one event or of several, is one
// statement in the caller's transaction (one round trip), and its rows carry
// that transaction's txid.
func TestAppendIsOneStatement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	for _, msgs := range [][]outbox.Message{
		{{Topic: "one", Key: "k", Payload: map[string]int{"n": 1}}},
		{{Topic: "many", Key: "a"}, {Topic: "many", Key: "b"}, {Topic: "many", Key: "c"}},
	} {
		require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
			var txid string
			require.NoError(t, tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text`).Scan(&txid))
			c := &statementCounter{Tx: tx}
			require.NoError(t, outbox.AppendTx(ctx, c, msgs...))
			require.Equal(t, 1, c.n, "statements sent by one AppendTx of %d events", len(msgs))
			var n int
			require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM compute_events WHERE txid = $1::xid8 AND topic = $2`,
				txid, msgs[0].Topic).Scan(&n))
			require.Equal(t, len(msgs), n, "the rows carry the caller's txid")
			return nil
		}))
	}
}

// TestAppendProcedure: compute_append_event, the statement behind a one-event
// Append, keeps its INSERT planned per connection. The kept plan follows a
// change of compute_now() (the sim clock switched on and off), and the
// procedure bounds topic and key as the table's CHECK constraints did, for a
// caller that writes events from SQL.
func TestAppendProcedure(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{MaxConns: 1}) // one connection: one kept plan
	appendAt := func(key string) time.Time {
		t.Helper()
		require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
			return outbox.AppendTx(ctx, tx, outbox.Message{Topic: "clock", Key: key})
		}))
		var at time.Time
		require.NoError(t, db.QueryRow(ctx, `SELECT created_at FROM compute_events WHERE key = $1`, key).Scan(&at))
		return at
	}
	// PL/pgSQL moves to a generic plan after five calls: go well past that.
	for i := range 10 {
		at := appendAt("system-" + strings.Repeat("x", i))
		require.WithinDuration(t, time.Now(), at, time.Minute)
	}
	sim := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	db.MustExec(t, `SELECT compute_use_sim_clock($1)`, sim)
	require.True(t, sim.Equal(appendAt("sim")), "created_at follows the sim clock on a connection that kept the plan")
	db.MustExec(t, `SELECT compute_set_sim_clock($1)`, sim.Add(time.Hour))
	require.True(t, sim.Add(time.Hour).Equal(appendAt("sim-moved")))
	db.MustExec(t, `SELECT compute_use_system_clock()`)
	require.WithinDuration(t, time.Now(), appendAt("system-again"), time.Minute)

	// Bounds, in characters (AppendTx checks bytes first, so it never gets here).
	for _, c := range []struct{ topic, key string }{
		{"", ""},
		{strings.Repeat("é", 201), ""},
		{"t", strings.Repeat("é", 513)},
	} {
		_, err := db.Exec(ctx, `CALL compute_append_event($1, $2, 'null')`, c.topic, c.key)
		require.Error(t, err)
		require.Equal(t, "23514", pg.SQLState(err), "%v", err)
	}
	_, err := db.Exec(ctx, `CALL compute_append_event($1, $2, $3)`, strings.Repeat("é", 200), strings.Repeat("é", 512), `{"a":1}`)
	require.NoError(t, err)
	_, err = db.Exec(ctx, `CALL compute_append_event('t', NULL, 'null')`)
	require.Equal(t, "23502", pg.SQLState(err), "%v", err)
	_, err = db.Exec(ctx, `CALL compute_append_event('t', 'k', 'not json')`)
	require.Equal(t, "22P02", pg.SQLState(err), "%v", err)
	require.Equal(t, 14, db.MustCount(t, `SELECT count(*) FROM compute_events`))
}

// TestAppendRecordsItsCause: an event records the traceparent of AppendTx's
// sampled span (one event or several), NULL without one or with an unsampled
// one, and Read returns it; a malformed cause written from SQL is stored as
// NULL and the event appended.
func TestAppendRecordsItsCause(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	span := func(flags trace.TraceFlags) context.Context {
		return trace.ContextWithSpanContext(ctx, trace.NewSpanContext(trace.SpanContextConfig{
			TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5, 6}, TraceFlags: flags}))
	}
	sampled := span(trace.FlagsSampled)
	cause := tracing.Cause(sampled)
	require.Len(t, cause, 55)
	for _, c := range []struct {
		ctx   context.Context
		topic string
		n     int
	}{{sampled, "traced", 1}, {sampled, "traced-many", 3}, {span(0), "unsampled", 2}, {ctx, "no-span", 1}} {
		msgs := make([]outbox.Message, c.n)
		for i := range msgs {
			msgs[i] = outbox.Message{Topic: c.topic}
		}
		require.NoError(t, pg.InTx(c.ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error { return outbox.AppendTx(ctx, tx, msgs...) }))
	}
	_, err := db.Exec(ctx, `CALL compute_append_event('malformed', '', 'null', 'garbage')`)
	require.NoError(t, err)

	events, _ := outboxtest.ReadN(t, db.Pool, outbox.Cursor{}, 8) // readable once the cluster's older transactions ended
	got := map[string][]string{}
	for _, e := range events {
		got[e.Topic] = append(got[e.Topic], e.Cause)
	}
	require.Equal(t, map[string][]string{
		"traced": {cause}, "traced-many": {cause, cause, cause}, "unsampled": {"", ""}, "no-span": {""}, "malformed": {""},
	}, got)
	require.Equal(t, 4, db.MustCount(t, `SELECT count(*) FROM compute_events WHERE cause IS NULL`))
}

// TestAppendRecordsItsTenant: an event records the tenant AppendTx's context
// names (one event or several), none without one; a suspended or deleted
// tenant's events are appended; a bad name is refused with nothing appended.
func TestAppendRecordsItsTenant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	appendN := func(ctx context.Context, topic string, n int) error {
		msgs := make([]outbox.Message, n)
		for i := range msgs {
			msgs[i] = outbox.Message{Topic: topic}
		}
		return pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error { return outbox.AppendTx(ctx, tx, msgs...) })
	}
	acme := jobs.WithTenant(ctx, "acme")
	require.NoError(t, appendN(acme, "one", 1))
	require.NoError(t, appendN(acme, "many", 3))
	require.NoError(t, appendN(ctx, "none", 1))
	db.MustExec(t, `SELECT compute_tenant_use('held'), compute_tenant_use('gone')`)
	db.MustExec(t, `UPDATE compute_tenants SET state = 'suspended' WHERE name = 'held'`)
	db.MustExec(t, `UPDATE compute_tenants SET state = 'deleted' WHERE name = 'gone'`)
	require.NoError(t, appendN(jobs.WithTenant(ctx, "held"), "held", 2))
	require.NoError(t, appendN(jobs.WithTenant(ctx, "gone"), "gone", 1))
	for _, n := range []int{1, 2} {
		err := appendN(jobs.WithTenant(ctx, "bad name"), "bad", n)
		require.Equal(t, fault.InvalidArgument, fault.CodeOf(err), "%v", err)
	}

	events, _ := outboxtest.ReadN(t, db.Pool, outbox.Cursor{}, 8)
	got := map[string][]string{}
	for _, e := range events {
		got[e.Topic] = append(got[e.Topic], e.Tenant)
	}
	require.Equal(t, map[string][]string{
		"one": {"acme"}, "many": {"acme", "acme", "acme"}, "none": {""}, "held": {"held", "held"}, "gone": {"gone"},
	}, got)
}
