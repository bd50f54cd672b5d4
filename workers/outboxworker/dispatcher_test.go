package outboxworker

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/outbox"
	"github.com/bettercompute/bettercompute/platform/clock"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

// ledger records publishes and checks, at the start of each one, that every
// earlier row of the same key has already been published successfully: a row
// is never published ahead of its key's order, whichever process publishes.
type ledger struct {
	mu         sync.Mutex
	keyOf      map[int64]string
	rowsOfKey  map[string][]int64
	ok         map[int64]int // successful publishes per row
	tries      map[int64]int
	violations []string
	by         map[string]int // successful publishes per publisher
}

func newLedger(t testing.TB, db *pg.Pool) *ledger {
	t.Helper()
	l := &ledger{keyOf: map[int64]string{}, rowsOfKey: map[string][]int64{}, ok: map[int64]int{}, tries: map[int64]int{}, by: map[string]int{}}
	l.load(t, db)
	return l
}

// load learns the rows now in the table (seq order).
func (l *ledger) load(t testing.TB, db *pg.Pool) {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT seq, item_id::text FROM inventory.stock_reports ORDER BY seq`)
	require.NoError(t, err)
	defer rows.Close()
	l.mu.Lock()
	defer l.mu.Unlock()
	for rows.Next() {
		var seq int64
		var key string
		require.NoError(t, rows.Scan(&seq, &key))
		if _, known := l.keyOf[seq]; !known {
			l.keyOf[seq] = key
			l.rowsOfKey[key] = append(l.rowsOfKey[key], seq)
		}
	}
	require.NoError(t, rows.Err())
}

func (l *ledger) start(r report) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.tries[r.Seq]++
	for _, earlier := range l.rowsOfKey[r.ItemID] {
		if earlier >= r.Seq {
			break
		}
		if l.ok[earlier] == 0 {
			l.violations = append(l.violations, fmt.Sprintf("row %d of key %s published before row %d", r.Seq, r.ItemID, earlier))
		}
	}
}

func (l *ledger) done(r report, by string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ok[r.Seq]++
	l.by[by]++
}

func (l *ledger) check(t testing.TB) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	require.Empty(t, l.violations)
	for seq := range l.keyOf {
		require.Positive(t, l.ok[seq], "row %d was never published", seq)
	}
}

// insertReports inserts rows for keys, interleaved: perKey rows each.
func insertReports(t testing.TB, db *pg.Pool, keys, perKey int) {
	t.Helper()
	_, err := db.Exec(context.Background(), `INSERT INTO inventory.stock_reports (item_id, delta)
SELECT ('00000000-0000-0000-0000-' || lpad(k::text, 12, '0'))::uuid, r
FROM generate_series(1, $2::int) r, generate_series(1, $1::int) k ORDER BY r, k`, keys, perKey)
	require.NoError(t, err)
}

func newStockDispatcher(t testing.TB, o DispatcherOptions[report]) *Dispatcher[report] {
	t.Helper()
	o.Name, o.Table, o.OrderBy, o.Sequence = "stock", "inventory.stock_reports", "item_id", "seq"
	if o.Log.GetLevel() == zerolog.DebugLevel && o.Publish != nil {
		o.Log = workertest.Logger(t)
	}
	d, err := NewDispatcher(o)
	require.NoError(t, err)
	return d
}

func pending(t testing.TB, db *pgtest.DB) int {
	return db.MustCount(t, `SELECT count(*) FROM inventory.stock_reports`)
}

// TestDispatcherPerKeyOrderUnderRandomFailures: with a third of publishes
// failing at random, every row is published, never ahead of an earlier row of
// its key.
func TestDispatcherPerKeyOrderUnderRandomFailures(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newDB(t)
	require.NoError(t, clock.UseSim(ctx, db.Pool, time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)))
	insertReports(t, db.Pool, 20, 10)
	l := newLedger(t, db.Pool)
	rng := rand.New(rand.NewPCG(1, 2))
	var rngMu sync.Mutex
	failures := 0
	d := newStockDispatcher(t, DispatcherOptions[report]{BatchSize: 25, Concurrency: 8,
		Publish: func(ctx context.Context, r report) error {
			l.start(r)
			rngMu.Lock()
			fail := rng.IntN(3) == 0
			if fail {
				failures++
			}
			rngMu.Unlock()
			if fail {
				return fmt.Errorf("random failure of row %d", r.Seq)
			}
			l.done(r, "one")
			return nil
		}})
	for i := 0; pending(t, db) > 0; i++ {
		require.Less(t, i, 100, "rows left after 100 passes")
		_, err := d.Reconcile(ctx, db.Pool)
		require.NoError(t, err)
		_, err = clock.Advance(ctx, db.Pool, outbox.MaxBackoff) // every retry is due
		require.NoError(t, err)
	}
	l.check(t)
	require.Greater(t, failures, 30, "failures happened")
}

// TestDispatcherFailingKeyHoldsBackOnlyItself: a key whose first row always
// fails keeps that row and its place; its later rows wait; other keys go.
func TestDispatcherFailingKeyHoldsBackOnlyItself(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newDB(t)
	require.NoError(t, clock.UseSim(ctx, db.Pool, time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)))
	insertReports(t, db.Pool, 3, 5)
	bad := "00000000-0000-0000-0000-000000000002"
	var mu sync.Mutex
	var tried []int64
	d := newStockDispatcher(t, DispatcherOptions[report]{BatchSize: 4,
		Publish: func(ctx context.Context, r report) error {
			mu.Lock()
			tried = append(tried, r.Seq)
			mu.Unlock()
			if r.ItemID == bad {
				return fmt.Errorf("the receiver refuses item %s", r.ItemID)
			}
			return nil
		}})
	n, err := d.Reconcile(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, 11, n, "10 published, 1 failed")
	require.Equal(t, 5, pending(t, db), "only the bad key's rows remain")
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM inventory.stock_reports WHERE attempts > 0`))
	require.Equal(t, 1, db.MustCount(t, `SELECT attempts FROM inventory.stock_reports WHERE item_id = $1 ORDER BY seq LIMIT 1`, bad))
	badTries := 0
	for _, s := range tried {
		if s%3 == 2 {
			badTries++
		}
	}
	require.Equal(t, 1, badTries, "the bad key's later rows were never tried")

	// Before its retry is due nothing happens; at it, the same row fails again.
	n, err = d.Reconcile(ctx, db.Pool)
	require.NoError(t, err)
	require.Zero(t, n)
	_, err = clock.Advance(ctx, db.Pool, 2*time.Second)
	require.NoError(t, err)
	n, err = d.Reconcile(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, 2, db.MustCount(t, `SELECT attempts FROM inventory.stock_reports WHERE item_id = $1 ORDER BY seq LIMIT 1`, bad))
	require.Equal(t, 0, db.MustCount(t, `SELECT count(*) FROM inventory.stock_reports WHERE item_id = $1 AND seq > (SELECT min(seq) FROM inventory.stock_reports) AND attempts > 0`, bad))
}

// TestDispatcherBackoffSequence: a row that always fails is retried after 2,
// 4, 8 … 256, 256 s, never before, and each failure is logged under the
// dispatcher's name.
func TestDispatcherBackoffSequence(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newDB(t)
	require.NoError(t, clock.UseSim(ctx, db.Pool, time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)))
	insertReports(t, db.Pool, 1, 1)
	var logs bytes.Buffer
	var logMu sync.Mutex
	d := newStockDispatcher(t, DispatcherOptions[report]{
		Log:     zerolog.New(syncWriter{&logMu, &logs}),
		Publish: func(ctx context.Context, r report) error { return fmt.Errorf("attempt %d failed", r.Attempts+1) }})
	var waits []int
	for i := 0; i < 10; i++ {
		n, err := d.Reconcile(ctx, db.Pool)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		wait := db.MustCount(t, `SELECT extract(epoch FROM next_attempt_at - compute_now())::int FROM inventory.stock_reports`)
		waits = append(waits, wait)
		// One second early: not due.
		_, err = clock.Advance(ctx, db.Pool, time.Duration(wait-1)*time.Second)
		require.NoError(t, err)
		n, err = d.Reconcile(ctx, db.Pool)
		require.NoError(t, err)
		require.Zero(t, n, "retried before its backoff")
		_, err = clock.Advance(ctx, db.Pool, time.Second)
		require.NoError(t, err)
	}
	require.Equal(t, []int{2, 4, 8, 16, 32, 64, 128, 256, 256, 256}, waits)
	require.Equal(t, 10, db.MustCount(t, `SELECT attempts FROM inventory.stock_reports`))
	var lastErr string
	require.NoError(t, db.QueryRow(ctx, `SELECT last_error FROM inventory.stock_reports`).Scan(&lastErr))
	require.Equal(t, "attempt 10 failed", lastErr)
	logMu.Lock()
	defer logMu.Unlock()
	require.Equal(t, 10, strings.Count(logs.String(), `"outbox":"stock"`))
	require.Equal(t, 10, strings.Count(logs.String(), `"message":"outbox delivery failed"`))
}

type syncWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// TestDispatcherLastErrorTruncated: last_error keeps the first 1,000
// characters of the error.
func TestDispatcherLastErrorTruncated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newDB(t)
	insertReports(t, db.Pool, 1, 1)
	msg := strings.Repeat("é", 999) + "ab" + strings.Repeat("x", 3000)
	d := newStockDispatcher(t, DispatcherOptions[report]{
		Publish: func(ctx context.Context, r report) error { return fmt.Errorf("%s", msg) }})
	_, err := d.Reconcile(ctx, db.Pool)
	require.NoError(t, err)
	var stored string
	var chars int
	require.NoError(t, db.QueryRow(ctx, `SELECT last_error, char_length(last_error) FROM inventory.stock_reports`).Scan(&stored, &chars))
	require.Equal(t, 1000, chars)
	require.Equal(t, strings.Repeat("é", 999)+"a", stored)
}

// TestDispatcherBatchOutlivingClaimTimeoutStartsNoFurtherPublish: once a batch
// has outlived its claim timeout it publishes nothing more; the rest goes back.
// The first publish holds on until its batch's deadline has passed (the
// deadline is counted from before the claim, so the timeout leaves a loaded
// machine room to claim and start it).
func TestDispatcherBatchOutlivingClaimTimeoutStartsNoFurtherPublish(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newDB(t)
	insertReports(t, db.Pool, 2, 2) // rows 1 (k1), 2 (k2), 3 (k1), 4 (k2)
	var outcomes []outbox.Outcome
	d := newStockDispatcher(t, DispatcherOptions[report]{ClaimTimeout: 2 * time.Second, Concurrency: 1,
		Publish: func(ctx context.Context, r report) error {
			if r.Seq == 1 {
				<-ctx.Done() // the batch's deadline
				return nil   // and ignores it
			}
			return nil
		}})
	d.beforeFinish = func(o outbox.Outcome) { outcomes = append(outcomes, o) }
	n, err := d.Reconcile(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, 4, n)
	require.GreaterOrEqual(t, len(outcomes), 2)
	require.Equal(t, []int64{1}, outcomes[0].Published, "the late batch published only the row in flight")
	require.ElementsMatch(t, []int64{2, 3, 4}, outcomes[0].Released)
	require.Zero(t, pending(t, db))
}

// TestDispatcherPublishes16KeysAtOnceByDefault: docs/outbox.md "different keys in
// parallel (16 at once by default)", and a batch of 100 rows by default: with
// 40 keys pending and every publish held, 16 are in flight, never a 17th.
func TestDispatcherPublishes16KeysAtOnceByDefault(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newDB(t)
	insertReports(t, db.Pool, 40, 1)
	var inFlight, most atomic.Int32
	release := make(chan struct{})
	d := newStockDispatcher(t, DispatcherOptions[report]{
		Publish: func(ctx context.Context, r report) error {
			n := inFlight.Add(1)
			defer inFlight.Add(-1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			<-release
			return nil
		}})
	var sizes []int
	d.beforeFinish = func(o outbox.Outcome) { sizes = append(sizes, len(o.Published)+len(o.Failed)+len(o.Released)) }
	done := make(chan int, 1)
	go func() {
		n, err := d.Reconcile(ctx, db.Pool)
		if err != nil {
			t.Error(err)
		}
		done <- n
	}()
	workertest.WaitFor(t, 30*time.Second, "16 publishes in flight", func() bool { return inFlight.Load() >= 16 })
	time.Sleep(300 * time.Millisecond) // room for a 17th to start, which must not
	require.EqualValues(t, 16, most.Load(), "16 keys at once")
	close(release)
	require.Equal(t, 40, <-done)
	require.Equal(t, []int{40}, sizes, "one batch (of up to 100) took every row")

	dd := newStockDispatcher(t, DispatcherOptions[report]{Publish: func(context.Context, report) error { return nil }})
	require.Equal(t, 100, dd.c.Table().BatchSize, "BatchSize 100 by default")
	require.Equal(t, 30*time.Second, dd.c.Table().ClaimTimeout, "ClaimTimeout 30 s by default")
	require.Equal(t, 10*time.Second, dd.interval(), "ReconcileInterval 10 s by default")
}

// TestDispatcherPassesRunPeriodically: docs/outbox.md "Passes run as River jobs …
// every ReconcileInterval": with no Notify, passes keep running (one at start,
// then one an interval apart), and rows written without Notify are published
// by one of them.
func TestDispatcherPassesRunPeriodically(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newDB(t)
	d := newStockDispatcher(t, DispatcherOptions[report]{ReconcileInterval: time.Second,
		Publish: func(context.Context, report) error { return nil }})
	reg := workers.NewRegistry()
	require.NoError(t, AddDispatcher(reg, d))
	workertest.Start(t, db.Pool, reg, nil)
	passes := func() int {
		return db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'outbox_dispatch' AND state = 'completed'`)
	}
	workertest.WaitFor(t, 30*time.Second, "three passes with nothing written", func() bool { return passes() >= 3 })
	var gap float64
	require.NoError(t, db.QueryRow(ctx, `SELECT extract(epoch FROM max(created_at) - min(created_at)) / (count(*) - 1)
FROM river_job WHERE kind = 'outbox_dispatch'`).Scan(&gap))
	require.GreaterOrEqual(t, gap, 0.9, "an interval (1 s) apart")
	require.Less(t, gap, 3.0, "an interval (1 s) apart, not the default's 10 s")

	insertReports(t, db.Pool, 3, 1) // no Notify
	workertest.WaitFor(t, 30*time.Second, "rows published by a periodic pass", func() bool { return pending(t, db) == 0 })
}

// TestReconcileJoinsARunningPass: a call while a pass runs joins it, and the
// pass claims again before ending, so rows written meanwhile are not left.
func TestReconcileJoinsARunningPass(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newDB(t)
	insertReports(t, db.Pool, 1, 1)
	inFlight, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	d := newStockDispatcher(t, DispatcherOptions[report]{
		Publish: func(ctx context.Context, r report) error {
			if calls.Add(1) == 1 {
				close(inFlight)
				<-release
			}
			return nil
		}})
	first := make(chan int, 1)
	go func() { n, _ := d.Reconcile(ctx, db.Pool); first <- n }()
	<-inFlight
	insertReports(t, db.Pool, 1, 1)
	second := make(chan int, 1)
	go func() { n, _ := d.Reconcile(ctx, db.Pool); second <- n }()
	workertest.WaitFor(t, 10*time.Second, "the second call joined", func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.cur != nil && d.cur.again
	})
	close(release)
	require.Equal(t, 2, <-first)
	require.Equal(t, 2, <-second, "the joined call returns the pass's count")
	require.Zero(t, pending(t, db))
}

// TestDispatcherTwoReplicas: two worker processes (two runtimes, two pools,
// two dispatcher instances) and concurrent Reconcile calls on both deliver every
// row at least once and never publish a row ahead of its key's order.
func TestDispatcherTwoReplicas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newDB(t)
	insertReports(t, db.Pool, 50, 8)
	l := newLedger(t, db.Pool)
	pools := []*pg.Pool{db.Pool, openPool(t, db)}
	var ds []*Dispatcher[report]
	for i, p := range pools {
		name := fmt.Sprintf("replica-%d", i)
		d := newStockDispatcher(t, DispatcherOptions[report]{BatchSize: 20, ReconcileInterval: time.Second,
			Publish: func(ctx context.Context, r report) error {
				l.start(r)
				time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
				l.done(r, name)
				return nil
			}})
		reg := workers.NewRegistry()
		require.NoError(t, AddDispatcher(reg, d))
		workertest.Start(t, p, reg, nil)
		ds = append(ds, d)
	}
	// More rows arrive while both run; both are notified and reconciled at once.
	var wg sync.WaitGroup
	for round := 0; round < 3; round++ {
		insertReports(t, db.Pool, 50, 4)
		l.load(t, db.Pool)
		for i, d := range ds {
			require.NoError(t, d.Notify(ctx, pools[i]))
			wg.Add(2)
			for _, p := range []*pg.Pool{pools[i], pools[1-i]} {
				go func() {
					defer wg.Done()
					if _, err := d.Reconcile(ctx, p); err != nil {
						t.Error(err)
					}
				}()
			}
		}
	}
	wg.Wait()
	workertest.WaitFor(t, 30*time.Second, "every row published", func() bool { return pending(t, db) == 0 })
	l.check(t)
	l.mu.Lock()
	defer l.mu.Unlock()
	require.Positive(t, l.by["replica-0"])
	require.Positive(t, l.by["replica-1"])
	workertest.WaitFor(t, 10*time.Second, "passes ran as River jobs", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'outbox_dispatch' AND state = 'completed'`) > 0
	})
}

func openPool(t testing.TB, db *pgtest.DB) *pg.Pool {
	t.Helper()
	p, err := pg.Open(context.Background(), pg.Options{URL: db.URL})
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

// TestDispatcherNotifyRunsAPassAsARiverJob: rows written with Notify in their
// transaction are published by a River job soon after the commit.
func TestDispatcherNotifyRunsAPassAsARiverJob(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newDB(t)
	var published atomic.Int32
	d := newStockDispatcher(t, DispatcherOptions[report]{ReconcileInterval: time.Hour,
		Publish: func(ctx context.Context, r report) error { published.Add(1); return nil }})
	reg := workers.NewRegistry()
	require.NoError(t, AddDispatcher(reg, d))
	require.ErrorContains(t, AddDispatcher(reg, d), "registered twice")
	workertest.Start(t, db.Pool, reg, nil)
	workertest.WaitFor(t, 10*time.Second, "the start-up pass ran", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'outbox_dispatch' AND state = 'completed'`) == 1
	})
	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		var item string
		if err := tx.QueryRow(ctx, `INSERT INTO inventory.items (quantity) VALUES (1) RETURNING id`).Scan(&item); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO inventory.stock_reports (item_id, delta) VALUES ($1, 1)`, item); err != nil {
			return err
		}
		return d.Notify(ctx, tx)
	}))
	workertest.WaitFor(t, 10*time.Second, "published", func() bool { return pending(t, db) == 0 })
	require.EqualValues(t, 1, published.Load())
	workertest.WaitFor(t, 10*time.Second, "the notified pass completed", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'outbox_dispatch' AND state = 'completed'`) == 2
	})
	var out string
	require.NoError(t, db.QueryRow(ctx, `SELECT metadata->>'output' FROM river_job WHERE kind = 'outbox_dispatch' ORDER BY id DESC LIMIT 1`).Scan(&out))
	require.JSONEq(t, `{"handled":1,"more":false}`, out)
}

// TestDispatcherNamesAreValidatedBeforeAnyQuery: bad names fail with
// INVALID_CONFIG and no statement reaches the server (a tracer counts them; a
// good dispatcher on the same pool does send queries).
func TestDispatcherNamesAreValidatedBeforeAnyQuery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newDB(t)
	var queries atomic.Int32
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	cfg.ConnConfig.Tracer = countingTracer{&queries}
	traced, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer traced.Close()

	publish := func(context.Context, report) error { return nil }
	for _, o := range []DispatcherOptions[report]{
		{Name: "x", Table: "inventory.Stock_Reports", OrderBy: "item_id", Sequence: "seq", Publish: publish},
		{Name: "x", Table: "inventory.stock_reports; DELETE FROM inventory.items", OrderBy: "item_id", Sequence: "seq", Publish: publish},
		{Name: "x", Table: "inventory.stock_reports", OrderBy: "item_id)--", Sequence: "seq", Publish: publish},
		{Name: "x", Table: "inventory.stock_reports", OrderBy: "item_id", Sequence: `"seq"`, Publish: publish},
		{Name: "x", Table: "inventory.stock_reports", OrderBy: "item_id", Sequence: "seq", Where: map[string]any{"1=1 OR tenant": 1}, Publish: publish},
	} {
		d, err := NewDispatcher(o)
		require.Nil(t, d)
		require.True(t, fault.Has(err, fault.InvalidConfig), "%v", err)
		require.Regexp(t, `invalid outbox (table|orderBy column|sequence column|where column)`, err.Error())
	}
	require.Zero(t, queries.Load(), "no query was sent")

	d, err := NewDispatcher(DispatcherOptions[report]{Name: "x", Table: "inventory.stock_reports", OrderBy: "item_id", Sequence: "seq", Publish: publish})
	require.NoError(t, err)
	_, err = d.Reconcile(ctx, traced)
	require.NoError(t, err)
	require.Positive(t, queries.Load(), "the tracer sees a good dispatcher's queries")
}

type countingTracer struct{ n *atomic.Int32 }

func (c countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestDispatcherKill9BetweenPublishAndDelete: a process killed after publishing
// a batch but before deleting it loses nothing: after the claim timeout the
// rows are published again, then deleted.
func TestDispatcherKill9BetweenPublishAndDelete(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newDB(t)
	insertReports(t, db.Pool, 3, 2)
	c := startChild(t, "dispatch-die", db)
	c.expect(t, "PUBLISHED")
	require.Equal(t, 6, db.MustCount(t, `SELECT count(*) FROM published WHERE by = 'child'`))
	require.Equal(t, 6, pending(t, db), "published but not deleted")
	c.kill9(t)

	d := newStockDispatcher(t, DispatcherOptions[report]{ClaimTimeout: 2 * time.Second,
		Publish: func(ctx context.Context, r report) error {
			_, err := db.Exec(ctx, `INSERT INTO published (seq, by) VALUES ($1, 'parent')`, r.Seq)
			return err
		}})
	workertest.WaitFor(t, 30*time.Second, "published again after the claim timeout", func() bool {
		_, err := d.Reconcile(ctx, db.Pool)
		require.NoError(t, err)
		return pending(t, db) == 0
	})
	require.Equal(t, 6, db.MustCount(t, `SELECT count(DISTINCT seq) FROM published WHERE by = 'parent'`))
	require.Equal(t, 6, db.MustCount(t, `SELECT count(*) FROM published WHERE by = 'parent'`), "each row once more")
}
