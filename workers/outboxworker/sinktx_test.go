package outboxworker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/outbox"
	"github.com/bettercompute/bettercompute/domain/outbox/outboxtest"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/internal/lease"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

// applier is a HandleTx sink that inserts one row per event into applied, a
// table with no unique constraint: a batch whose writes committed twice shows
// as two rows of one event.
type applier struct {
	mu    sync.Mutex
	calls [][]string // the event IDs of each call, in order
	// leftovers counts the rows of a call's events that were already in applied
	// when the call began: rows of an earlier attempt that should have rolled
	// back.
	leftovers int
	// fail, when set, runs after the inserts, in the handler's transaction.
	fail func(ctx context.Context, tx pgx.Tx, call int, ids []string) error
}

func (a *applier) handleTx(ctx context.Context, tx pgx.Tx, events []Event) error {
	ids := make([]string, len(events))
	for i, e := range events {
		ids[i] = e.ID.String()
	}
	a.mu.Lock()
	a.calls = append(a.calls, ids)
	call := len(a.calls)
	a.mu.Unlock()
	var before int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM applied WHERE event_id = ANY($1::text[])`, ids).Scan(&before); err != nil {
		return err
	}
	a.mu.Lock()
	a.leftovers += before
	a.mu.Unlock()
	if _, err := tx.Exec(ctx, `INSERT INTO applied (event_id, at) SELECT id, clock_timestamp() FROM unnest($1::text[]) AS u(id)`, ids); err != nil {
		return err
	}
	if a.fail != nil {
		return a.fail(ctx, tx, call, ids)
	}
	return nil
}

func (a *applier) snapshot() (calls [][]string, leftovers int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([][]string(nil), a.calls...), a.leftovers
}

// newAppliedDB is newDB with the applied table (no unique constraint).
func newAppliedDB(t *testing.T) *pgtest.DB {
	t.Helper()
	db := newDB(t)
	db.MustExec(t, `CREATE TABLE applied (event_id text NOT NULL, at timestamptz NOT NULL)`)
	return db
}

// appendReadable appends n events of topic "t" and returns their IDs once a
// delivery can read them all, so that its batches have their full size.
func appendReadable(t *testing.T, db *pgtest.DB, n int) []string {
	t.Helper()
	cs := outboxtest.AppendIDs(t, db.Pool, outbox.Cursor{}, "k", n)
	ids := make([]string, n)
	for i, c := range cs {
		ids[i] = c.String()
	}
	return ids
}

// requireAppliedOnce asserts that applied holds exactly one row of each of ids
// and nothing else.
func requireAppliedOnce(t *testing.T, db *pgtest.DB, ids []string) {
	t.Helper()
	require.Equal(t, len(ids), db.MustCount(t, `SELECT count(*) FROM applied`), "one row per event")
	require.Equal(t, len(ids), db.MustCount(t, `SELECT count(DISTINCT event_id) FROM applied`), "every event")
	rows, err := db.Query(context.Background(), `SELECT event_id FROM applied`)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.ElementsMatch(t, ids, got)
}

// TestHandleTxAppliesEachEventOnceDespiteFailures: every batch's first attempt
// inserts its rows and then fails (an error, or a panic for the second batch);
// the failure rolls the inserts back with the cursor, is recorded on the sink,
// and the retry applies the batch: one row per event in the end, both through
// intermediate advances and the job's last one.
func TestHandleTxAppliesEachEventOnceDespiteFailures(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newAppliedDB(t)
	ids := appendReadable(t, db, 7) // batches of 3: two intermediate, one last

	var (
		a        applier
		mu       sync.Mutex
		attempts = map[string]int{} // by the batch's first event
		failed   []string           // what each failed attempt recorded on the sink
		seen     []string           // the sink's last error, as each retry saw it
	)
	a.fail = func(ctx context.Context, tx pgx.Tx, call int, batch []string) error {
		mu.Lock()
		attempts[batch[0]]++
		first := attempts[batch[0]] == 1
		n := len(failed) + 1
		if first {
			msg := fmt.Sprintf("projection failed #%d", n)
			if n == 2 {
				failed = append(failed, "sink projection: handler panicked: "+msg)
				mu.Unlock()
				panic(msg)
			}
			failed = append(failed, msg)
			mu.Unlock()
			return errors.New(msg)
		}
		mu.Unlock()
		var last *string
		if err := tx.QueryRow(ctx, `SELECT last_error FROM compute_sinks WHERE name = 'projection'`).Scan(&last); err != nil {
			return err
		}
		mu.Lock()
		seen = append(seen, derefOr(last, "<none>"))
		mu.Unlock()
		return nil
	}
	reg := fastRegistry(t)
	require.NoError(t, AddSink(reg, Sink{Name: "projection", BatchSize: 3, HandleTx: a.handleTx}))
	workertest.Start(t, db.Pool, reg, steadyLeases)

	workertest.WaitFor(t, 30*time.Second, "cursor at the end", func() bool { return sinkCursor(t, db.Pool, "projection") == ids[6] })
	requireAppliedOnce(t, db, ids)

	calls, leftovers := a.snapshot()
	b1, b2, b3 := ids[0:3], ids[3:6], ids[6:7]
	require.Equal(t, [][]string{b1, b1, b2, b2, b3, b3}, calls, "each batch failed once, then was retried whole")
	require.Zero(t, leftovers, "no retry found rows of the failed attempt")
	mu.Lock()
	require.Equal(t, []string{"projection failed #1", "sink projection: handler panicked: projection failed #2", "projection failed #3"}, failed)
	require.Equal(t, failed, seen, "each failure was recorded on the sink before its retry")
	mu.Unlock()
	s, err := outbox.GetSink(ctx, db.Pool, "projection")
	require.NoError(t, err)
	require.Zero(t, s.Failures, "the successful advance cleared the failures")
	require.Equal(t, int64(7), s.Delivered)
	require.GreaterOrEqual(t, db.MustCount(t, `SELECT max(attempt) FROM river_job WHERE kind = 'outbox_deliver' AND args->>'sink' = 'projection'`), 2,
		"retried by River")
}

func derefOr(s *string, def string) string {
	if s == nil {
		return def
	}
	return *s
}

// TestHandleTxResetDuringDeliveryCommitsNoneOfTheBatch: an operator resets the
// sink (to start) after the handler wrote its batch and before the cursor
// moves. The advance does not move, so the handler's writes roll back; the
// delivery job still ends cleanly (completed, no error), and the next delivery
// applies every event from the start, once. Both the intermediate advance and
// the job's last one (which also releases the lease and completes the job in
// that transaction).
func TestHandleTxResetDuringDeliveryCommitsNoneOfTheBatch(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		batchSize int
	}{
		{"intermediate batch", 2},
		{"last batch", 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := newAppliedDB(t)
			ids := appendReadable(t, db, 5)
			var a applier
			reg := fastRegistry(t)
			require.NoError(t, AddSink(reg, Sink{Name: "projection", BatchSize: tc.batchSize, HandleTx: a.handleTx}))
			var (
				mu    sync.Mutex
				reset bool
			)
			// In the delivery's transaction, after the handler, before the
			// advance. The reset touches only the sink's row, which that
			// transaction has not locked yet.
			mustState(reg).afterHandle = func(sink string, events []Event) {
				mu.Lock()
				defer mu.Unlock()
				if reset {
					return
				}
				reset = true
				if _, err := outbox.ResetSink(context.WithoutCancel(ctx), db.Pool, sink, outbox.Start); err != nil {
					t.Errorf("reset: %v", err)
				}
			}
			workertest.Start(t, db.Pool, reg, steadyLeases)

			workertest.WaitFor(t, 30*time.Second, "cursor at the end", func() bool { return sinkCursor(t, db.Pool, "projection") == ids[4] })
			requireAppliedOnce(t, db, ids)
			calls, leftovers := a.snapshot()
			require.GreaterOrEqual(t, len(calls), 2)
			require.Equal(t, ids[0], calls[0][0])
			require.Equal(t, ids[0], calls[1][0], "after the reset the batch was delivered again from the start")
			require.Zero(t, leftovers, "the redelivery found none of the rolled-back batch's rows")
			workertest.WaitFor(t, 10*time.Second, "every delivery job completed without an error", func() bool {
				return db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'outbox_deliver'
					AND (state <> 'completed' OR coalesce(array_length(errors, 1), 0) > 0)`) == 0
			})
			require.GreaterOrEqual(t, db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'outbox_deliver'`), 2,
				"the reset delivery and the next one")
		})
	}
}

// TestHandleTxFencedDeliveryCommitsNothing: the sink's lease changes owner
// during the first batch's transaction. That transaction, fenced before the
// change, commits (a real takeover, which changes the epoch, would have waited
// for it to end; changing the owner alone does not wait and fences the same
// way). The second batch's transaction finds the lease gone: FENCED before its
// handler runs, none of its writes, the cursor where the first batch left it.
// Once the intruder lets go, the rest is applied, each event once.
func TestHandleTxFencedDeliveryCommitsNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newAppliedDB(t)
	ids := appendReadable(t, db, 6) // batches of 2
	var a applier
	reg := fastRegistry(t)
	require.NoError(t, AddSink(reg, Sink{Name: "projection", BatchSize: 2, HandleTx: a.handleTx}))
	st, _ := stateOf(reg)
	var (
		mu     sync.Mutex
		stolen bool
		codes  []fault.Code
	)
	st.afterHandle = func(sink string, _ []Event) {
		mu.Lock()
		defer mu.Unlock()
		if stolen {
			return
		}
		stolen = true
		_, err := db.Exec(context.WithoutCancel(ctx), `UPDATE compute_leases
SET owner = 'intruder', expires_at = clock_timestamp() + interval '1 minute' WHERE name = $1`, outbox.SinkLease(sink))
		if err != nil {
			t.Errorf("steal the lease: %v", err)
		}
	}
	st.afterAdvance = func(_ string, err error) {
		mu.Lock()
		defer mu.Unlock()
		codes = append(codes, fault.CodeOf(err))
	}
	workertest.Start(t, db.Pool, reg, steadyLeases)

	workertest.WaitFor(t, 30*time.Second, "the second batch's advance is fenced", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(codes) > 0
	})
	mu.Lock()
	require.Equal(t, fault.Fenced, codes[0])
	mu.Unlock()
	require.Equal(t, ids[1], sinkCursor(t, db.Pool, "projection"), "the first batch moved the cursor, the fenced one did not")
	requireAppliedOnce(t, db, ids[:2])
	calls, _ := a.snapshot()
	require.Equal(t, [][]string{ids[0:2]}, calls, "the fence came before the handler")

	var intruder lease.Lease
	require.NoError(t, db.QueryRow(ctx, `SELECT name, owner, epoch FROM compute_leases WHERE name = $1`, outbox.SinkLease("projection")).
		Scan(&intruder.Name, &intruder.Owner, &intruder.Epoch))
	require.Equal(t, "intruder", intruder.Owner)
	require.NoError(t, lease.Release(ctx, db.Pool, intruder))

	workertest.WaitFor(t, 30*time.Second, "cursor at the end", func() bool { return sinkCursor(t, db.Pool, "projection") == ids[5] })
	requireAppliedOnce(t, db, ids)
	calls, leftovers := a.snapshot()
	require.Equal(t, [][]string{ids[0:2], ids[2:4], ids[4:6]}, calls, "each batch handled once")
	require.Zero(t, leftovers)
}

// TestAddSinkWantsExactlyOneHandler: neither or both of Handle and HandleTx is
// INVALID_CONFIG, with a message saying which to use when.
func TestAddSinkWantsExactlyOneHandler(t *testing.T) {
	t.Parallel()
	reg := workers.NewRegistry()
	h := func(context.Context, []Event) error { return nil }
	htx := func(context.Context, pgx.Tx, []Event) error { return nil }
	for _, s := range []Sink{{Name: "neither"}, {Name: "both", Handle: h, HandleTx: htx}} {
		err := AddSink(reg, s)
		require.Equal(t, fault.InvalidConfig, fault.CodeOf(err), s.Name)
		require.ErrorContains(t, err, "Handle for an outside system")
		require.ErrorContains(t, err, "HandleTx for writes into this database")
	}
	require.Empty(t, sinks(reg), "a refused sink is not registered")
	require.NoError(t, AddSink(reg, Sink{Name: "tx", HandleTx: htx}))
	require.NoError(t, AddSink(reg, Sink{Name: "plain", Handle: h}))
	require.Equal(t, []string{"plain", "tx"}, sinks(reg))
}
