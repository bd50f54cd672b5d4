package outboxworker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/outbox"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/internal/lease"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

// collector records what a sink's handler received, in order.
type collector struct {
	mu     sync.Mutex
	events []Event
	calls  int
	fail   func(call int, events []Event) error
}

func (c *collector) handle(ctx context.Context, events []Event) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls++
	if c.fail != nil {
		if err := c.fail(c.calls, events); err != nil {
			return err
		}
	}
	c.events = append(c.events, events...)
	return nil
}

func (c *collector) ids() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, len(c.events))
	for i, e := range c.events {
		out[i] = e.ID.String()
	}
	return out
}

// steadyLeases are worker options whose leases survive a starved test machine:
// tests that assert exactly-once delivery (no fault injected) use them, so a
// lease lost to CPU starvation does not cause a legitimate redelivery.
var steadyLeases = &workers.Options{LeaseTTL: 15 * time.Second, LeaseRenew: 5 * time.Second}

func fastRegistry(t testing.TB) *workers.Registry {
	t.Helper()
	reg := workers.NewRegistry()
	require.NoError(t, Register(reg, &Options{PollEvery: 20 * time.Millisecond, SinkMaxBackoff: 200 * time.Millisecond}))
	return reg
}

// TestSinkDeliversEveryEventInOrder: concurrent producers, two sinks (one
// filtered); each receives every event of its topics once, in (txid, seq)
// order, through River jobs in the maintenance queue.
func TestSinkDeliversEveryEventInOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newDB(t)
	reg := fastRegistry(t)
	var all, orders collector
	require.NoError(t, AddSink(reg, Sink{Name: "all", BatchSize: 7, Handle: all.handle}))
	require.NoError(t, AddSink(reg, Sink{Name: "orders-only", Topics: []string{"orders"}, Handle: orders.handle}))
	workertest.Start(t, db.Pool, reg, steadyLeases)

	var wg sync.WaitGroup
	for p := 0; p < 4; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 25; i++ {
				err := pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
					msgs := []outbox.Message{{Topic: "orders", Key: fmt.Sprintf("p%d-%d", p, i)}}
					if i%2 == 0 {
						msgs = append(msgs, outbox.Message{Topic: "audit", Key: fmt.Sprintf("p%d-%d", p, i)})
					}
					return outbox.AppendTx(ctx, tx, msgs...)
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	want := 4 * (25 + 13)
	workertest.WaitFor(t, 30*time.Second, "every event delivered", func() bool { return len(all.ids()) >= want && len(orders.ids()) >= 100 })

	wantAll := storedIDs(t, db.Pool, "orders")
	wantAll = append(wantAll, storedIDs(t, db.Pool, "audit")...)
	require.ElementsMatch(t, wantAll, all.ids(), "every event exactly once")
	require.Equal(t, storedIDs(t, db.Pool, "orders"), orders.ids(), "only its topic, in log order")
	all.mu.Lock()
	for i := 1; i < len(all.events); i++ {
		require.True(t, all.events[i-1].ID.Less(all.events[i].ID), "(txid, seq) order")
	}
	all.mu.Unlock()

	workertest.WaitFor(t, 10*time.Second, "cursor at the end", func() bool {
		s, err := outbox.GetSink(ctx, db.Pool, "all")
		require.NoError(t, err)
		return s.LagRows == 0 && s.Delivered == int64(want)
	})
	require.Positive(t, db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'outbox_deliver' AND queue = 'better_compute' AND state = 'completed'`))
	workertest.WaitFor(t, 10*time.Second, "a lease is held only while delivering", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM compute_leases WHERE name LIKE 'sink/%' AND expires_at > compute_now()`) == 0
	})
}

// TestFailingSinkIsRetriedWithoutHoldingBackOthers: a failing handler gets the
// same batch again after a backoff, its error is recorded on the sink, and
// another sink delivers meanwhile.
func TestFailingSinkIsRetriedWithoutHoldingBackOthers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newDB(t)
	reg := fastRegistry(t)
	var firsts []string
	release := make(chan struct{})
	flaky := collector{fail: func(call int, events []Event) error {
		firsts = append(firsts, events[0].ID.String())
		if call <= 3 {
			return fmt.Errorf("receiver down #%d", call)
		}
		<-release
		return nil
	}}
	var steady collector
	require.NoError(t, AddSink(reg, Sink{Name: "flaky", Handle: flaky.handle}))
	require.NoError(t, AddSink(reg, Sink{Name: "steady", Handle: steady.handle}))
	workertest.Start(t, db.Pool, reg, steadyLeases)
	ids := appendEvents(t, db.Pool, "t", 5)

	workertest.WaitFor(t, 30*time.Second, "steady delivers while flaky fails", func() bool { return len(steady.ids()) == 5 })
	workertest.WaitFor(t, 30*time.Second, "flaky's failures recorded", func() bool {
		s, err := outbox.GetSink(ctx, db.Pool, "flaky")
		require.NoError(t, err)
		return s.Failures == 3 && s.LastError == "receiver down #3"
	})
	close(release)
	workertest.WaitFor(t, 30*time.Second, "flaky delivers after its retries", func() bool { return len(flaky.ids()) == 5 })
	require.Equal(t, ids, flaky.ids())
	flaky.mu.Lock()
	require.Equal(t, []string{ids[0], ids[0], ids[0], ids[0]}, firsts, "the same batch again")
	flaky.mu.Unlock()
	workertest.WaitFor(t, 10*time.Second, "failures cleared", func() bool {
		s, err := outbox.GetSink(ctx, db.Pool, "flaky")
		require.NoError(t, err)
		return s.Failures == 0 && s.LastError == "" && s.Cursor.String() == ids[4]
	})
	require.Equal(t, 4, db.MustCount(t, `SELECT max(attempt) FROM river_job WHERE kind = 'outbox_deliver' AND args->>'sink' = 'flaky'`), "retried by River")
}

// TestPausedSinkWaitsAndResumes: a paused sink starts no delivery (while
// another sink shows the poll ran), resume delivers, reset replays.
func TestPausedSinkWaitsAndResumes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newDB(t)
	reg := fastRegistry(t)
	var paused, canary collector
	require.NoError(t, AddSink(reg, Sink{Name: "paused", Handle: paused.handle}))
	require.NoError(t, AddSink(reg, Sink{Name: "canary", Handle: canary.handle}))
	workertest.Start(t, db.Pool, reg, steadyLeases)
	workertest.WaitFor(t, 10*time.Second, "sink state created", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM compute_sinks`) == 2
	})
	require.NoError(t, outbox.PauseSink(ctx, db.Pool, "paused"))
	ids := appendEvents(t, db.Pool, "t", 2)
	workertest.WaitFor(t, 30*time.Second, "canary delivered", func() bool { return len(canary.ids()) == 2 })
	require.Empty(t, paused.ids())

	require.NoError(t, outbox.ResumeSink(ctx, db.Pool, "paused"))
	workertest.WaitFor(t, 30*time.Second, "resumed", func() bool { return len(paused.ids()) == 2 })
	_, err := outbox.ResetSink(ctx, db.Pool, "paused", outbox.Start)
	require.NoError(t, err)
	workertest.WaitFor(t, 30*time.Second, "replayed", func() bool { return len(paused.ids()) == 4 })
	require.Equal(t, append(append([]string{}, ids...), ids...), paused.ids())
}

// TestKill9BetweenDeliveryAndCursorAdvance: a worker process killed after its
// handler returned but before the cursor moved loses nothing: the batch is
// delivered again by another process.
func TestKill9BetweenDeliveryAndCursorAdvance(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	ids := appendEvents(t, db.Pool, "t", 5)
	c := startChild(t, "sink-die", db)
	c.expect(t, "HANDLED")
	require.Equal(t, ids, receivedBy(t, db.Pool, "child"), "the child's handler received the batch")
	require.Equal(t, "0:0", sinkCursor(t, db.Pool, "s"))
	c.kill9(t)

	reg := fastRegistry(t)
	require.NoError(t, AddSink(reg, Sink{Name: "s", Handle: recordReceived(db.Pool, "parent")}))
	workertest.Start(t, db.Pool, reg, nil)
	workertest.WaitFor(t, 30*time.Second, "cursor at the end", func() bool { return sinkCursor(t, db.Pool, "s") == ids[4] })
	// At least once: a lease the parent loses on a starved machine may deliver
	// the batch once more; its first delivery is the whole batch, in order.
	require.Equal(t, ids, receivedBy(t, db.Pool, "parent")[:len(ids)], "the same batch again, in order")
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'outbox_deliver' AND errors::text LIKE '%handed back%'`),
		"the dead process's job was handed back")
}

// TestPausedSinkOwnerThatLostItsLeaseCannotAdvance: a delivering process is
// stopped (SIGSTOP) after its handler returned; its lease expires and another
// owner takes it; resumed, the process cannot move the cursor.
func TestPausedSinkOwnerThatLostItsLeaseCannotAdvance(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newDB(t)
	ids := appendEvents(t, db.Pool, "t", 3)
	c := startChild(t, "sink-pause", db)
	c.expect(t, "HANDLED")
	require.NoError(t, c.cmd.Process.Signal(syscall.SIGSTOP))

	var intruder lease.Lease
	workertest.WaitFor(t, 30*time.Second, "the paused owner's lease expires and another owner takes it", func() bool {
		l, err := lease.Acquire(ctx, db.Pool, outbox.SinkLease("s"), "intruder", time.Minute)
		intruder = l
		return err == nil
	})
	require.NoError(t, c.cmd.Process.Signal(syscall.SIGCONT))
	_, err := c.stdin.WriteString("go\n")
	require.NoError(t, err)
	require.Equal(t, "ADVANCE FENCED", c.expect(t, "ADVANCE"))
	require.Equal(t, "0:0", sinkCursor(t, db.Pool, "s"), "the fenced owner moved nothing")
	c.kill9(t)

	// Nothing is lost: the next owner delivers the batch.
	require.NoError(t, lease.Release(ctx, db.Pool, intruder))
	reg := fastRegistry(t)
	require.NoError(t, AddSink(reg, Sink{Name: "s", Handle: recordReceived(db.Pool, "parent")}))
	workertest.Start(t, db.Pool, reg, nil)
	workertest.WaitFor(t, 30*time.Second, "cursor at the end", func() bool { return sinkCursor(t, db.Pool, "s") == ids[2] })
	require.Equal(t, ids, receivedBy(t, db.Pool, "parent")[:len(ids)], "the whole batch, in order (at least once)")
}

func TestAddSinkValidates(t *testing.T) {
	t.Parallel()
	reg := workers.NewRegistry()
	h := func(context.Context, []Event) error { return nil }
	require.ErrorContains(t, AddSink(reg, Sink{Name: "Bad", Handle: h}), "invalid sink name")
	require.ErrorContains(t, AddSink(reg, Sink{Name: "nohandler"}), "no Handle")
	require.NoError(t, AddSink(reg, Sink{Name: "ok", Handle: h}))
	require.ErrorContains(t, AddSink(reg, Sink{Name: "ok", Handle: h}), "registered twice")
	require.Equal(t, []string{"ok"}, sinks(reg))
	require.ErrorContains(t, Register(reg, &Options{PollEvery: -1}), "negative")
}

// TestSinkRetryScheduleDoublesUpToTheMax: docs/outbox.md's backoff between a
// sink's failed deliveries, 1, 2, 4 … 60 s (SinkMaxBackoff's default): after
// the n-th failure River's job is scheduled that long after the handler
// returned its error. So that the schedule is seen to its cap without waiting
// it out, each retry is made due as soon as its time is read, and the
// handler's next call waits until then (scheduled_at is kept while the retry
// runs, and rewritten only by its own failure).
func TestSinkRetryScheduleDoublesUpToTheMax(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newDB(t)
	reg := workers.NewRegistry()
	require.NoError(t, Register(reg, &Options{PollEvery: 20 * time.Millisecond})) // SinkMaxBackoff: the default
	proceed := make(chan struct{}, 16)
	var mu sync.Mutex
	var failedAt []time.Time // when each call returned its error
	require.NoError(t, AddSink(reg, Sink{Name: "down", Handle: func(ctx context.Context, _ []Event) error {
		mu.Lock()
		n := len(failedAt)
		mu.Unlock()
		if n > 0 {
			select {
			case <-proceed:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		mu.Lock()
		defer mu.Unlock()
		failedAt = append(failedAt, time.Now())
		return errors.New("receiver down")
	}}))
	appendEvents(t, db.Pool, "t", 1)
	workertest.Start(t, db.Pool, reg, steadyLeases)

	want := []time.Duration{1, 2, 4, 8, 16, 32, 60, 60}
	for n, w := range want {
		n, w := n+1, w*time.Second
		var id int64
		var scheduled time.Time
		workertest.WaitFor(t, 30*time.Second, fmt.Sprintf("failure %d recorded with its retry", n), func() bool {
			err := db.QueryRow(ctx, `SELECT id, scheduled_at FROM river_job WHERE kind = 'outbox_deliver' AND array_length(errors, 1) = $1`, n).
				Scan(&id, &scheduled)
			if errors.Is(err, pgx.ErrNoRows) {
				return false
			}
			require.NoError(t, err)
			return true
		})
		mu.Lock()
		delay := scheduled.Sub(failedAt[n-1])
		mu.Unlock()
		// Between the handler's return and River's NextRetry the failure is
		// recorded on the sink (a write): a loaded machine may take a while.
		require.GreaterOrEqual(t, delay, w, "the retry after failure %d comes no sooner than %s", n, w)
		require.Less(t, delay, w+time.Second, "the retry after failure %d comes %s after it (got %s)", n, w, delay)
		if n == len(want) {
			break
		}
		db.MustExec(t, `UPDATE river_job SET state = 'available', scheduled_at = compute_now() WHERE id = $1 AND state IN ('available', 'retryable')`, id)
		proceed <- struct{}{}
	}
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'outbox_deliver'`), "one job, retried by River")
}

// TestDeadSinkHolderHandedOverWithinOneTTL: docs/outbox.md "A dead process's delivery
// is handed to another within one lease TTL". A worker process holding sink
// s's lease mid-delivery is killed (-9) beside a running one; the survivor's
// handler gets the batch within one TTL of the kill, plus a margin for the
// polls on a loaded machine (well under two TTLs), measured.
func TestDeadSinkHolderHandedOverWithinOneTTL(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	const ttl, margin = 5 * time.Second, 3 * time.Second
	ids := appendEvents(t, db.Pool, "t", 5)
	c := startChild(t, "sink-die", db, childTTLEnv+"="+ttl.String())
	c.expect(t, "HANDLED")

	reg := fastRegistry(t)
	handled := make(chan time.Time, 16)
	record := recordReceived(db.Pool, "survivor")
	require.NoError(t, AddSink(reg, Sink{Name: "s", Handle: func(ctx context.Context, events []Event) error {
		select {
		case handled <- time.Now():
		default:
		}
		return record(ctx, events)
	}}))
	workertest.Start(t, db.Pool, reg, &workers.Options{LeaseTTL: ttl, LeaseRenew: ttl / 6})
	killed := time.Now()
	c.kill9(t)
	var took time.Duration
	select {
	case at := <-handled:
		took = at.Sub(killed)
	case <-time.After(30 * time.Second):
		t.Fatal("the survivor never got the dead holder's batch")
	}
	t.Logf("handed over %s after the kill (lease TTL %s)", took.Round(time.Millisecond), ttl)
	require.Less(t, took, ttl+margin, "handed over within one TTL (%s) plus %s", ttl, margin)
	workertest.WaitFor(t, 30*time.Second, "cursor at the end", func() bool { return sinkCursor(t, db.Pool, "s") == ids[4] })
	require.Equal(t, ids, receivedBy(t, db.Pool, "survivor")[:len(ids)], "the whole batch, in order")
}

// TestPausingASinkLetsTheBatchInFlightComplete: docs/outbox.md "sinks pause: no new
// delivery starts (a batch in flight completes)". The sink is paused while its
// handler holds the first of three full batches: that batch's cursor advance
// commits, and nothing more is delivered while it is paused (another sink shows
// the polls and deliveries went on after the pause); resume delivers the rest.
func TestPausingASinkLetsTheBatchInFlightComplete(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newDB(t)
	reg := fastRegistry(t)
	inFlight, release := make(chan struct{}), make(chan struct{})
	p := collector{fail: func(call int, _ []Event) error {
		if call == 1 {
			close(inFlight)
			<-release
		}
		return nil
	}}
	var canary collector
	require.NoError(t, AddSink(reg, Sink{Name: "p", BatchSize: 2, Topics: []string{"t"}, Handle: p.handle}))
	require.NoError(t, AddSink(reg, Sink{Name: "canary", Topics: []string{"canary"}, Handle: canary.handle}))
	ids := appendEvents(t, db.Pool, "t", 6)
	workertest.Start(t, db.Pool, reg, steadyLeases)
	select {
	case <-inFlight:
	case <-time.After(30 * time.Second):
		t.Fatal("the first batch was never delivered")
	}
	require.NoError(t, outbox.PauseSink(ctx, db.Pool, "p"))
	close(release)
	workertest.WaitFor(t, 30*time.Second, "the batch in flight moved the cursor", func() bool { return sinkCursor(t, db.Pool, "p") == ids[1] })

	// Room for a wrong delivery: an event appended now reaches the canary only
	// through polls and a delivery job that run after the pause.
	canaryID := appendEvents(t, db.Pool, "canary", 1)[0]
	workertest.WaitFor(t, 30*time.Second, "the canary delivered after the pause", func() bool { return len(canary.ids()) == 1 })
	require.Equal(t, ids[:2], p.ids(), "nothing delivered after the batch in flight while paused")
	require.Equal(t, ids[1], sinkCursor(t, db.Pool, "p"))

	require.NoError(t, outbox.ResumeSink(ctx, db.Pool, "p"))
	// The cursor ends at p's last event, or past it at the canary's when the
	// resumed delivery's last read scanned that one too (not p's topic).
	workertest.WaitFor(t, 30*time.Second, "resumed: the rest delivered", func() bool {
		c := sinkCursor(t, db.Pool, "p")
		return c == ids[5] || c == canaryID
	})
	require.Equal(t, ids, p.ids()[:len(ids)])
}
