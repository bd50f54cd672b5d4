package backfillworker

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/backfill"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/workers"
)

// batchLog records, for each batch a backfill's batch function ran (committed
// or not), the job the backfill's row named then, the size asked for, the rows
// handled and when the batch function began.
type batchLog struct {
	mu      sync.Mutex
	entries []batchEntry
}

type batchEntry struct {
	job   int64
	asked int
	rows  int
	began time.Time
}

func (l *batchLog) add(e batchEntry) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.entries = append(l.entries, e)
}

func (l *batchLog) all() []batchEntry {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]batchEntry(nil), l.entries...)
}

// logged wraps b's batch function to record each batch in log.
func logged(b Backfill, log *batchLog) Backfill {
	inner := b.Batch
	b.Batch = func(ctx context.Context, tx pgx.Tx, n int) (int, error) {
		began := time.Now()
		var job int64
		if err := tx.QueryRow(ctx, `SELECT job_id FROM compute_backfills WHERE name = $1`, b.Name).Scan(&job); err != nil {
			return 0, err
		}
		rows, err := inner(ctx, tx, n)
		if err == nil {
			log.add(batchEntry{job: job, asked: n, rows: rows, began: began})
		}
		return rows, err
	}
	return b
}

// jobsOf returns the distinct jobs that ran the logged batches.
func jobsOf(es []batchEntry) map[int64]int {
	out := map[int64]int{}
	for _, e := range es {
		out[e.job]++
	}
	return out
}

// While its batches come back full, one job takes batch after batch, each in
// its own transaction, instead of one batch per River poll: with a poll
// interval of 2 s, 21 batches run in one job (its drain is long enough here),
// and the counters still equal a recount of the committed batches.
func TestDrainTakesBatchesWhileFull(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newDB(t)
	const rows, size = 2000, 100
	makeTable(t, db, "drain_items", rows)
	var log batchLog
	dumpOnFailure(t, &log)
	b := logged(fillBackfill("drain_fill", "drain_items", nil, nil), &log)
	b.BatchSize = size
	reg := registry(t, b)
	setOf(reg).drain = time.Minute // at most half the job's timeout: 30 s
	startWorker(t, db, reg, &workers.Options{PollInterval: 2 * time.Second})

	started := time.Now()
	_, err := startBackfill(ctx, db.Pool, b)
	require.NoError(t, err)
	waitState(t, db, b.Name, backfill.Done, 60*time.Second)
	p := requireRecount(t, db, b.Name, "drain_items", rows)
	require.EqualValues(t, rows/size+1, p.Batches)

	es := log.all()
	require.Len(t, es, rows/size+1, "every batch ran once (none failed)")
	byJob := jobsOf(es)
	require.Len(t, byJob, 1, "one job ran every batch: %v", byJob)
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'backfill_drain_fill'`),
		"no job was enqueued after the first")
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'backfill_drain_fill'
		AND state = 'completed' AND attempt = 1`), "the one job completed in its first attempt")
	t.Logf("%d batches in one job, %s after start", len(es), time.Since(started).Round(time.Millisecond))
}

// The drain stops at its deadline (DrainFor, at most half the job's timeout):
// a job with a short timeout hands the backfill on to a new job, whose batch
// number is the next batch, and each job runs several batches.
func TestDrainHandsOnAtItsDeadline(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newDB(t)
	const rows, size = 3000, 100
	makeTable(t, db, "handon_items", rows)
	var log batchLog
	dumpOnFailure(t, &log)
	b := logged(fillBackfill("handon_fill", "handon_items", func(ctx context.Context, call int) error {
		time.Sleep(20 * time.Millisecond) // a batch takes at least 20 ms
		return nil
	}, nil), &log)
	b.BatchSize = size
	reg := registry(t, b)
	setOf(reg).drain = 300 * time.Millisecond
	startWorker(t, db, reg, nil)
	_, err := startBackfill(ctx, db.Pool, b)
	require.NoError(t, err)
	waitState(t, db, b.Name, backfill.Done, 60*time.Second)
	requireRecount(t, db, b.Name, "handon_items", rows)

	es := log.all()
	byJob := jobsOf(es)
	require.Greater(t, len(byJob), 1, "the drain ended and a new job took over")
	require.Less(t, len(byJob), len(es), "a job ran more than one batch")
	// Each job was enqueued for the batch it ran first.
	first := map[int64]int{}
	for i, e := range es {
		if _, ok := first[e.job]; !ok {
			first[e.job] = i
		}
	}
	for job, i := range first {
		var batch int
		require.NoError(t, db.QueryRow(ctx, `SELECT (args->>'batch')::int FROM river_job WHERE id = $1`, job).Scan(&batch))
		require.Equal(t, i, batch, "job %d", job)
	}
}

// Batches are sized by time: the first asks for min(BatchSize, 1000), a fast
// one doubles the next up to BatchSize and never beyond, a slow one halves it,
// and the size a batch chose carries over to the job that runs the next one
// (here the slow batch outlasts the drain).
func TestBatchSizeFollowsBatchTime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newDB(t)
	const total, maxSize = 20000, 4000
	db.MustExec(t, `CREATE TABLE size_left (id int PRIMARY KEY, n int NOT NULL)`)
	db.MustExec(t, `INSERT INTO size_left VALUES (1, $1)`, total)
	var (
		mu     sync.Mutex
		asked  []int
		slowed bool
	)
	b := Backfill{
		Name:      "size_fill",
		BatchSize: maxSize,
		BatchTime: time.Second, // a fast batch takes far less than half of it
		Batch: func(ctx context.Context, tx pgx.Tx, n int) (int, error) {
			mu.Lock()
			asked = append(asked, n)
			slow := n == maxSize && !slowed
			slowed = slowed || slow
			mu.Unlock()
			if slow { // the first batch of the maximum size takes 2.5 × BatchTime
				time.Sleep(2500 * time.Millisecond)
			}
			var handled int
			err := tx.QueryRow(ctx, `
WITH old AS (SELECT n FROM size_left WHERE id = 1 FOR UPDATE)
UPDATE size_left s SET n = s.n - least(s.n, $1) FROM old WHERE s.id = 1
RETURNING old.n - s.n`, n).Scan(&handled)
			return handled, err
		},
	}
	startWorker(t, db, registry(t, b), nil)
	_, err := startBackfill(ctx, db.Pool, b)
	require.NoError(t, err)
	p := waitState(t, db, b.Name, backfill.Done, 60*time.Second)
	require.EqualValues(t, total, p.RowsDone)

	mu.Lock()
	got := append([]int(nil), asked...)
	mu.Unlock()
	t.Logf("sizes asked: %v", got)
	require.Equal(t, DefaultBatchSize, got[0], "the first batch asks for min(BatchSize, 1000)")
	slow := -1
	for i, n := range got {
		require.LessOrEqual(t, n, maxSize, "batch %d", i)
		if n == maxSize && slow < 0 {
			slow = i
		}
	}
	require.Positive(t, slow, "the size grew to the maximum")
	for i := 1; i <= slow; i++ {
		require.Greater(t, got[i], got[i-1], "a fast batch grows the next (batch %d)", i)
	}
	require.Greater(t, len(got), slow+1)
	require.Equal(t, maxSize/2, got[slow+1], "the slow batch halved the next")
	require.Greater(t, len(got), slow+2)
	require.Greater(t, got[slow+2], got[slow+1], "and a fast one grows it again")
	require.NotNil(t, p.BatchSize, "the chosen size is recorded in the progress")
	require.LessOrEqual(t, int(*p.BatchSize), maxSize)
	require.Zero(t, db.MustCount(t, `SELECT n FROM size_left`))
}

// MaxRowsPerSecond holds with the drain: each batch starts no sooner than
// rows/MaxRowsPerSecond after the previous one began (the drain sleeps in
// between, or hands on to a job scheduled that late), batches ask for at most
// MaxRowsPerSecond × BatchTime rows, and a job still runs several batches.
func TestRateLimitHoldsWhileDraining(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newDB(t)
	const rows, rate = 300, 100.0
	makeTable(t, db, "rate_items", rows)
	var log batchLog
	dumpOnFailure(t, &log)
	b := logged(fillBackfill("rate_fill", "rate_items", nil, nil), &log)
	b.BatchSize = 500
	b.FixedBatchSize = false
	b.BatchTime = 200 * time.Millisecond
	b.MaxRowsPerSecond = rate // with BatchTime 200 ms: batches of at most 20 rows, 200 ms apart
	startWorker(t, db, registry(t, b), nil)

	started := time.Now()
	_, err := startBackfill(ctx, db.Pool, b)
	require.NoError(t, err)
	waitState(t, db, b.Name, backfill.Done, 2*time.Minute)
	took := time.Since(started)
	requireRecount(t, db, b.Name, "rate_items", rows)

	es := log.all()
	for i, e := range es {
		require.LessOrEqual(t, e.asked, 20, "batch %d asked for more than MaxRowsPerSecond × BatchTime", i)
		if i == 0 {
			continue
		}
		prev := es[i-1]
		least := time.Duration(float64(prev.rows) / rate * float64(time.Second))
		require.GreaterOrEqual(t, e.began.Sub(prev.began), least-time.Millisecond,
			"batch %d began %s after batch %d of %d rows", i, e.began.Sub(prev.began), i-1, prev.rows)
	}
	last := es[len(es)-1]
	require.Zero(t, last.rows)
	require.GreaterOrEqual(t, last.began.Sub(es[0].began), time.Duration(float64(rows-es[len(es)-2].rows)/rate*float64(time.Second))-time.Millisecond)
	byJob := jobsOf(es)
	require.Less(t, len(byJob), len(es), "the drain ran several batches in a job: %v", byJob)

	// The database's record: each batch's transaction began (compute_now()) at
	// least n/MaxRowsPerSecond after the previous one, of n rows, began; and the
	// run, from start to the final batch, averaged no more than the limit.
	// Without the limit the batches come back to back, several times faster
	// even on a loaded machine.
	type txRow struct {
		at   time.Time
		rows int
	}
	var txs []txRow
	dbRows, err := db.Query(ctx, `SELECT min(at), count(*) FROM bf_handled WHERE tbl = 'rate_items' GROUP BY txid ORDER BY 1`)
	require.NoError(t, err)
	for dbRows.Next() {
		var r txRow
		require.NoError(t, dbRows.Scan(&r.at, &r.rows))
		txs = append(txs, r)
	}
	require.NoError(t, dbRows.Err())
	for i := 1; i < len(txs); i++ {
		least := time.Duration(float64(txs[i-1].rows) / rate * float64(time.Second))
		require.GreaterOrEqual(t, txs[i].at.Sub(txs[i-1].at), least-time.Millisecond,
			"on the record, batch %d began %s after batch %d of %d rows", i, txs[i].at.Sub(txs[i-1].at), i-1, txs[i-1].rows)
	}
	p := mustGet(t, db, b.Name)
	run := p.FinishedAt.Sub(*p.StartedAt)
	recorded := float64(p.RowsDone) / run.Seconds()
	require.LessOrEqual(t, recorded, rate*1.01, "on the record, %d rows in %s", p.RowsDone, run)
	t.Logf("%d rows in %d batches, %d jobs, %s (limit: %.0f rows/s; on the record: %.0f rows/s)",
		rows, len(es), len(byJob), took.Round(time.Millisecond), rate, recorded)
}

// EstimateEvery holds: on the database's record (the batches' and the
// estimates' transaction times), a batch refreshes the estimate exactly when
// EstimateEvery has passed since the last one (Start's is the first), so the
// estimate is refreshed every EstimateEvery while batches run, and never more
// often; and the estimate the progress shows is the last one's.
func TestEstimateIsRefreshedEveryEstimateEvery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newDB(t)
	const rows, every = 300, time.Second
	makeTable(t, db, "estimate_items", rows)
	db.MustExec(t, `CREATE TABLE bf_estimates (at timestamptz NOT NULL DEFAULT compute_now(), left_rows bigint NOT NULL)`)
	b := fillBackfill("estimate_fill", "estimate_items", nil, nil)
	b.BatchSize = 10
	b.Pause = 50 * time.Millisecond // 31 batches, 50 ms or more apart: two seconds or more
	b.EstimateEvery = every
	inner := b.Estimate
	b.Estimate = func(ctx context.Context, db pg.DBTX) (int64, error) {
		n, err := inner(ctx, db)
		if err == nil {
			_, err = db.Exec(ctx, `INSERT INTO bf_estimates (left_rows) VALUES ($1)`, n)
		}
		return n, err
	}
	startWorker(t, db, registry(t, b), nil)
	_, err := startBackfill(ctx, db.Pool, b)
	require.NoError(t, err)
	p := waitState(t, db, b.Name, backfill.Done, 2*time.Minute)
	requireRecount(t, db, b.Name, "estimate_items", rows)

	times := func(q string) []time.Time {
		var out []time.Time
		r, err := db.Query(ctx, q)
		require.NoError(t, err)
		for r.Next() {
			var at time.Time
			require.NoError(t, r.Scan(&at))
			out = append(out, at)
		}
		require.NoError(t, r.Err())
		return out
	}
	estimates := times(`SELECT at FROM bf_estimates ORDER BY at`)
	batches := times(`SELECT DISTINCT at FROM bf_handled WHERE tbl = 'estimate_items' ORDER BY at`)
	require.Equal(t, *p.StartedAt, estimates[0], "the first estimate is Start's")
	last, e, skipped := estimates[0], 1, 0
	for i, at := range batches {
		due := at.Sub(last) >= every
		refreshed := e < len(estimates) && estimates[e].Equal(at)
		require.Equal(t, due, refreshed, "batch %d at +%s, %s after the last estimate", i, at.Sub(*p.StartedAt), at.Sub(last))
		if refreshed {
			last, e = at, e+1
		} else {
			skipped++
		}
	}
	require.Equal(t, len(estimates), e, "every estimate ran in a batch")
	// Both outcomes occurred: batches that refreshed it and batches too soon to.
	require.GreaterOrEqual(t, len(estimates), 2, "a batch refreshed the estimate")
	require.Positive(t, skipped, "a batch within EstimateEvery of the last estimate left it")
	t.Logf("%d batches, %d estimates, %d left it", len(batches), len(estimates), skipped)
}

// TestNextBatchSize: the sizing rule as a pure function.
func TestNextBatchSize(t *testing.T) {
	t.Parallel()
	const target = 100 * time.Millisecond
	for _, tc := range []struct {
		cur  int
		took time.Duration
		hi   int
		want int
	}{
		{1000, 100 * time.Millisecond, 100_000, 1000}, // on target: unchanged
		{1000, 125 * time.Millisecond, 100_000, 800},  // a little slow: a little smaller
		{1000, 80 * time.Millisecond, 100_000, 1250},  // a little fast: a little larger
		{1000, 10 * time.Millisecond, 100_000, 2000},  // fast: at most twice
		{1000, time.Second, 100_000, 500},             // slow: at most half
		{1000, 0, 100_000, 2000},                      // too fast to measure: twice
		{60_000, time.Millisecond, 100_000, 100_000},  // never beyond the maximum
		{1000, time.Millisecond, 1000, 1000},          // at the maximum, fast: stays
		{5000, 100 * time.Millisecond, 1000, 1000},    // above a lowered maximum: the maximum
		{1, time.Second, 100_000, 1},                  // never below 1
		{3, time.Second, 100_000, 1},                  // half of 3, rounded down
		{0, time.Millisecond, 100_000, 2},             // a size of 0 counts as 1
		{10, time.Millisecond, 0, 1},                  // a maximum below 1 counts as 1
	} {
		require.Equal(t, tc.want, nextBatchSize(tc.cur, tc.took, target, tc.hi), "%+v", tc)
	}
	// Repeated fast batches double up to the maximum; then slow ones halve.
	n, seq := DefaultBatchSize, []int{}
	for i := 0; i < 8; i++ {
		n = nextBatchSize(n, 10*time.Millisecond, target, 20_000)
		seq = append(seq, n)
	}
	for i := 0; i < 3; i++ {
		n = nextBatchSize(n, 400*time.Millisecond, target, 20_000)
		seq = append(seq, n)
	}
	require.Equal(t, []int{2000, 4000, 8000, 16000, 20000, 20000, 20000, 20000, 10000, 5000, 2500}, seq)
}

// The sizes a backfill's batches ask for: the first, the maximum with a rate
// limit, a fixed size, and a recorded size out of range.
func TestBatchSizeLimits(t *testing.T) {
	t.Parallel()
	ok := func(context.Context, pgx.Tx, int) (int, error) { return 0, nil }
	size := func(n int32) *int32 { return &n }
	b := withDefaults(Backfill{Name: "x", Batch: ok})
	require.Equal(t, DefaultBatchTime, b.BatchTime)
	require.Equal(t, DefaultBatchSize, batchSize(b, nil))
	require.Equal(t, 700, batchSize(b, size(700)))
	require.Equal(t, DefaultBatchSize, batchSize(b, size(5000)), "a recorded size above BatchSize: BatchSize")
	require.Equal(t, 1, batchSize(b, size(0)))

	b = withDefaults(Backfill{Name: "x", Batch: ok, BatchSize: 50_000})
	require.Equal(t, DefaultBatchSize, batchSize(b, nil), "a run starts at 1000 rows")
	require.Equal(t, 30_000, batchSize(b, size(30_000)))
	b.MaxRowsPerSecond = 20_000 // 500 rows per 25 ms
	require.Equal(t, 500, maxBatch(b))
	require.Equal(t, 500, batchSize(b, nil))
	b.MaxRowsPerSecond = 1
	require.Equal(t, 1, maxBatch(b), "at least 1 row")

	b = withDefaults(Backfill{Name: "x", Batch: ok, BatchSize: 300, FixedBatchSize: true, MaxRowsPerSecond: 10})
	require.Equal(t, 300, batchSize(b, nil), "a fixed size is BatchSize")
	require.Equal(t, 300, batchSize(b, size(20)))

	err := Add(workers.NewRegistry(), Backfill{Name: "x", Batch: ok, BatchTime: -time.Second})
	require.True(t, fault.Has(err, fault.InvalidConfig), "%v", err)
	require.ErrorContains(t, err, "BatchTime")
}

// dumpOnFailure logs the batches of log if the test fails.
func dumpOnFailure(t *testing.T, log *batchLog) {
	t.Cleanup(func() {
		if t.Failed() {
			dumpLog(t, log.all())
		}
	})
}

func dumpLog(t *testing.T, es []batchEntry) {
	for i, e := range es {
		d := time.Duration(0)
		if i > 0 {
			d = e.began.Sub(es[i-1].began)
		}
		t.Logf("%d job %d asked %d rows %d +%s", i, e.job, e.asked, e.rows, d)
	}
}
