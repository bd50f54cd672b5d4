package outboxworker

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/outbox"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

// TestRetentionJobPrunesWhatEverySinkPassed: the periodic retention job
// deletes the events every sink has delivered, and keeps those a paused sink
// has not.
func TestRetentionJobPrunesWhatEverySinkPassed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newDB(t)
	reg := workers.NewRegistry()
	require.NoError(t, Register(reg, &Options{PollEvery: 20 * time.Millisecond, Retain: time.Nanosecond,
		RetentionEvery: 100 * time.Millisecond, RetentionBatch: 3}))
	var fast, slow collector
	require.NoError(t, AddSink(reg, Sink{Name: "fast", Handle: fast.handle}))
	require.NoError(t, AddSink(reg, Sink{Name: "slow", Handle: slow.handle}))
	require.NoError(t, EnsureSinks(ctx, db.Pool, reg))
	require.NoError(t, outbox.PauseSink(ctx, db.Pool, "slow"))
	ids := appendEvents(t, db.Pool, "t", 10)
	// Leases that outlast a starved machine: the exact deliveries asserted
	// below would otherwise be legitimately repeated after a lost lease.
	workertest.Start(t, db.Pool, reg, steadyLeases)

	workertest.WaitFor(t, 30*time.Second, "fast delivered", func() bool { return len(fast.ids()) == 10 })
	workertest.WaitFor(t, 30*time.Second, "retention ran", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'outbox_retention' AND state = 'completed'`) >= 2
	})
	require.Equal(t, 10, db.MustCount(t, `SELECT count(*) FROM compute_events`), "the paused sink holds every event")

	// An operator moves the paused sink's cursor past 4 events: retention
	// removes exactly those (in batches of 3); once resumed and caught up, all.
	_, err := outbox.ResetSink(ctx, db.Pool, "slow", outbox.After(mustCursor(t, ids[3])))
	require.NoError(t, err)
	workertest.WaitFor(t, 30*time.Second, "pruned up to the slow cursor", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM compute_events`) == 6
	})
	require.Equal(t, ids[4:], storedIDs(t, db.Pool, "t"))
	require.NoError(t, outbox.ResumeSink(ctx, db.Pool, "slow"))
	workertest.WaitFor(t, 30*time.Second, "all pruned once both passed", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM compute_events`) == 0
	})
	require.Equal(t, ids[4:], slow.ids())
}

func mustCursor(t testing.TB, s string) outbox.Cursor {
	t.Helper()
	c, err := outbox.ParseCursor(s)
	require.NoError(t, err)
	return c
}
