package demo

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/outbox"
	"github.com/bettercompute/bettercompute/platform/migrate"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/outboxworker"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

// TestOutboxDemo runs dev's outbox demo on a worker: its orders' events reach
// the log sink (and so the event stream), and its confirmations are
// dispatched and deleted.
func TestOutboxDemo(t *testing.T) {
	t.Parallel()
	confirmations := newDemoConfirmations()
	m := outboxModule(confirmations)
	ms, err := migrate.FromFS(m.Name, m.Migrations)
	require.NoError(t, err)
	db := pgtest.New(t, pgtest.Options{Groups: []migrate.Group{{Owner: m.Name, Migrations: ms}}})
	reg := workers.NewRegistry()
	require.NoError(t, outboxworker.Register(reg, &outboxworker.Options{PollEvery: 20 * time.Millisecond}))
	require.NoError(t, m.Register(reg))
	rt := workertest.Start(t, db.Pool, reg, nil)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); runOutboxDemo(ctx, rt.Log(), db.Pool, confirmations, 50*time.Millisecond) }()
	workertest.WaitFor(t, 30*time.Second, "demo orders", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM demo_outbox_orders`) >= 5
	})
	cancel()
	<-done
	// Both counts in one statement, so in one snapshot: a cancelled order's
	// COMMIT can still land on the server after the demo returned, and then two
	// statements could each see a different number of orders.
	var orders, events int
	require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM demo_outbox_orders),
		(SELECT count(*) FROM compute_events WHERE topic = $1)`, DemoOutboxTopic).Scan(&orders, &events))
	require.Equal(t, orders, events, "one event per order, in its transaction")
	workertest.WaitFor(t, 30*time.Second, "the log sink delivered every event", func() bool {
		s, err := outbox.GetSink(context.Background(), db.Pool, "demo_log")
		require.NoError(t, err)
		return s.Delivered == int64(db.MustCount(t, `SELECT count(*) FROM demo_outbox_orders`)) && s.LagRows == 0
	})
	workertest.WaitFor(t, 30*time.Second, "every confirmation dispatched", func() bool {
		_, err := confirmations.Reconcile(context.Background(), db.Pool)
		require.NoError(t, err)
		return db.MustCount(t, `SELECT count(*) FROM demo_outbox_confirmations`) == 0
	})
}
