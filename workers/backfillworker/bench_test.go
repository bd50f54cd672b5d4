package backfillworker

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/domain/backfill"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

// benchRows is the table size of BenchmarkBackfillMillion: 1,000,000 unless
// BENCH_BACKFILL_ROWS says otherwise (for a quick look).
func benchRows() int {
	if n, err := strconv.Atoi(os.Getenv("BENCH_BACKFILL_ROWS")); err == nil && n > 0 {
		return n
	}
	return 1_000_000
}

// BenchmarkBackfillMillion fills a column on 1,000,000 rows with a backfill
// (River jobs on a worker runtime serving every shard, at the default 100 ms
// poll interval, each job draining batches while they come back full), and
// the same column on an identical fresh table with one UPDATE of every row,
// in the same run and with the same runtime still up; it reports both rates
// and their ratio. Two sub-benchmarks: the
// default options (batches of at most 1,000 rows, sized for 25 ms) and
// BatchSize 100,000 (batches sized by time alone). It reports the batch sizes
// the sizing chose, how many batches and jobs ran, the mean time of a batch's
// UPDATE and of the rest of its transaction (the gap between two batches, poll
// waits excluded), and the time the backfill waited for River to fetch its
// next job. A writer updates one random row every 2 ms, on the idle table
// first, then during the backfill, then during the single UPDATE: it reports
// the latencies of that write and the ratios against the idle table.
//
//	go test -run '^$' -bench BackfillMillion -benchtime 1x -timeout 60m ./workers/backfillworker/
func BenchmarkBackfillMillion(b *testing.B) {
	for _, max := range []int{DefaultBatchSize, MaxBatchSize} {
		b.Run("max="+strconv.Itoa(max), func(b *testing.B) { benchMillion(b, max) })
	}
}

// benchBatch is one batch of the benchmark's backfill.
type benchBatch struct {
	asked, rows int
	began, end  time.Time
}

func benchMillion(b *testing.B, maxSize int) {
	b.StopTimer() // the timer covers the backfills only
	ctx := context.Background()
	rows := benchRows()
	db := pgtest.New(b, pgtest.Options{StatementTimeout: 30 * time.Minute})
	writerPool, err := pg.Open(ctx, pg.Options{URL: db.URL, MaxConns: 2, StatementTimeout: 30 * time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	defer writerPool.Close()

	var fillSec, updateSec float64
	var idle, during, duringUpdate []time.Duration
	var batches []benchBatch
	var jobCount int
	for i := 0; i < b.N; i++ {
		bf, upd := fmt.Sprintf("bench_bf_%d", i), fmt.Sprintf("bench_upd_%d", i)
		b.StopTimer()
		// Each side gets a fresh table of the same rows, made just before it
		// runs, and both run with the worker runtime up (as an UPDATE in
		// production runs beside the worker processes).
		makeBenchTable(b, db, bf, rows)
		var mu sync.Mutex
		var run []benchBatch
		bk := Backfill{
			Name:      "bench_fill_" + strconv.Itoa(i),
			BatchSize: maxSize,
			Batch: func(ctx context.Context, tx pgx.Tx, n int) (int, error) {
				began := time.Now()
				tag, err := tx.Exec(ctx, fmt.Sprintf(`
UPDATE %[1]s SET filled = v * 2
WHERE id = ANY (ARRAY(SELECT id FROM %[1]s WHERE filled IS NULL ORDER BY id LIMIT $1 FOR UPDATE))
  AND filled IS NULL`, bf), n)
				mu.Lock()
				run = append(run, benchBatch{asked: n, rows: int(tag.RowsAffected()), began: began, end: time.Now()})
				mu.Unlock()
				return int(tag.RowsAffected()), err
			},
		}
		reg := workers.NewRegistry()
		if err := Add(reg, bk); err != nil {
			b.Fatal(err)
		}
		rt := workertest.Start(b, db.Pool, reg, &workers.Options{PollInterval: 100 * time.Millisecond, WorkersPerShard: 8})
		workertest.WaitFor(b, time.Minute, "every shard leased", func() bool { return len(rt.HeldShards()) == pgtest.DefaultShardCount })

		idle = append(idle, writeLoop(ctx, b, writerPool, bf, rows, func(n int) bool { return n >= 3000 })...)

		// The backfill, with the writer beside it.
		b.StartTimer()
		start := time.Now()
		if _, err := startBackfill(ctx, db.Pool, bk); err != nil {
			b.Fatal(err)
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var lat []time.Duration
		wg.Add(1)
		go func() {
			defer wg.Done()
			lat = writeLoop(ctx, b, writerPool, bf, rows, func(int) bool {
				select {
				case <-stop:
					return true
				default:
					return false
				}
			})
		}()
		for {
			p, err := backfill.Get(ctx, db.Pool, bk.Name)
			if err != nil {
				b.Fatal(err)
			}
			if p.State == backfill.Done {
				if p.RowsDone != int64(rows) {
					b.Fatalf("backfill filled %d rows, want %d", p.RowsDone, rows)
				}
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		fillSec += time.Since(start).Seconds()
		b.StopTimer()
		close(stop)
		wg.Wait()
		during = append(during, lat...)
		mu.Lock()
		batches = append(batches, run...)
		mu.Unlock()
		jobCount += db.MustCount(b, `SELECT count(*) FROM river_job WHERE kind = $1`, kindOf(bk))

		// The single UPDATE of every row of a fresh table, with the writer
		// beside it and the runtime still up.
		makeBenchTable(b, db, upd, rows)
		stop = make(chan struct{})
		wg.Add(1)
		go func() {
			defer wg.Done()
			lat = writeLoop(ctx, b, writerPool, upd, rows, func(int) bool {
				select {
				case <-stop:
					return true
				default:
					return false
				}
			})
		}()
		start = time.Now()
		tag, err := db.Exec(ctx, fmt.Sprintf(`UPDATE %s SET filled = v * 2`, upd))
		if err != nil {
			b.Fatal(err)
		}
		updateSec += time.Since(start).Seconds()
		close(stop)
		wg.Wait()
		duringUpdate = append(duringUpdate, lat...)
		_ = rt.Stop(ctx)
		if tag.RowsAffected() != int64(rows) {
			b.Fatalf("update filled %d rows", tag.RowsAffected())
		}
		if n := db.MustCount(b, fmt.Sprintf(`SELECT count(*) FROM %s WHERE filled IS DISTINCT FROM v * 2`, bf)); n != 0 {
			b.Fatalf("%d rows not filled by the backfill", n)
		}
	}

	fillRate := float64(rows*b.N) / fillSec
	updateRate := float64(rows*b.N) / updateSec
	b.ReportMetric(fillRate, "backfill_rows/s")
	b.ReportMetric(updateRate, "update_rows/s")
	b.ReportMetric(fillRate/updateRate, "backfill/update")
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	for _, q := range []struct {
		name string
		p    float64
	}{{"p50", 0.50}, {"p99", 0.99}, {"max", 1}} {
		i, d, u := quantile(idle, q.p), quantile(during, q.p), quantile(duringUpdate, q.p)
		b.ReportMetric(ms(i), "write_"+q.name+"_idle_ms")
		b.ReportMetric(ms(d), "write_"+q.name+"_backfill_ms")
		b.ReportMetric(ms(u), "write_"+q.name+"_update_ms")
		b.ReportMetric(ms(d)/ms(i), "write_"+q.name+"_backfill/idle")
	}
	b.ReportMetric(float64(len(during)), "writes_during_backfill")
	b.ReportMetric(float64(len(duringUpdate)), "writes_during_update")

	// The batches: the sizes asked for (the last, empty one aside), the time in
	// the UPDATE, and the gaps between one batch's UPDATE and the next: the rest
	// of a batch's transaction and the next one's start when the same job drains
	// on (under 50 ms), or River's poll when a new job takes over.
	var sizes []int
	var inUpdate, inGap, inPoll time.Duration
	var gaps, polls int
	for j, bb := range batches {
		if bb.rows > 0 {
			sizes = append(sizes, bb.asked)
		}
		inUpdate += bb.end.Sub(bb.began)
		if j > 0 && batches[j-1].end.Before(bb.began) {
			if g := bb.began.Sub(batches[j-1].end); g < 50*time.Millisecond {
				inGap, gaps = inGap+g, gaps+1
			} else {
				inPoll, polls = inPoll+g, polls+1
			}
		}
	}
	b.ReportMetric(float64(quantile(sizes, 0)), "batch_size_min")
	b.ReportMetric(float64(quantile(sizes, 0.5)), "batch_size_p50")
	b.ReportMetric(float64(quantile(sizes, 1)), "batch_size_max")
	b.ReportMetric(float64(len(batches))/float64(b.N), "batches")
	b.ReportMetric(float64(jobCount)/float64(b.N), "jobs")
	b.ReportMetric(ms(inUpdate)/float64(len(batches)), "batch_update_ms")
	b.ReportMetric(float64(rows*b.N)/inUpdate.Seconds(), "batch_sql_rows/s") // the batches' UPDATEs alone
	if gaps > 0 {
		b.ReportMetric(ms(inGap)/float64(gaps), "batch_gap_ms")
	}
	b.ReportMetric(inPoll.Seconds()/float64(b.N), "poll_wait_s")
	b.ReportMetric(float64(polls)/float64(b.N), "poll_waits")
}

// makeBenchTable creates table with rows rows to fill (and a partial index on
// the unfilled ones), vacuumed and analyzed.
func makeBenchTable(b *testing.B, db *pgtest.DB, table string, rows int) {
	db.MustExec(b, fmt.Sprintf(`CREATE TABLE %[1]s (id bigint PRIMARY KEY, v int NOT NULL, filled int, touched int NOT NULL DEFAULT 0)`, table))
	db.MustExec(b, fmt.Sprintf(`INSERT INTO %[1]s (id, v) SELECT g, g %% 1000 FROM generate_series(1, $1) g`, table), rows)
	db.MustExec(b, fmt.Sprintf(`CREATE INDEX %[1]s_unfilled ON %[1]s (id) WHERE filled IS NULL`, table))
	db.MustExec(b, fmt.Sprintf(`VACUUM ANALYZE %s`, table))
}

// writeLoop updates one random row of table every 2 ms (each its own
// transaction) until done(count) is true, and returns each write's latency.
func writeLoop(ctx context.Context, b *testing.B, db *pg.Pool, table string, rows int, done func(n int) bool) []time.Duration {
	var out []time.Duration
	q := fmt.Sprintf(`UPDATE %s SET touched = touched + 1 WHERE id = $1`, table)
	for !done(len(out)) {
		id := 1 + rand.IntN(rows)
		t0 := time.Now()
		if _, err := db.Exec(ctx, q, id); err != nil {
			b.Error(err)
			return out
		}
		out = append(out, time.Since(t0))
		time.Sleep(2 * time.Millisecond)
	}
	return out
}

// quantile is the q-quantile of ds (q = 0: the smallest, 1: the largest).
func quantile[T cmp.Ordered](ds []T, q float64) T {
	if len(ds) == 0 {
		var zero T
		return zero
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(q * float64(len(s)-1))
	return s[i]
}
