package backfill

import (
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

// BenchmarkBackfillMillion fills a column on 1,000,000 rows with a backfill in
// batches of 1,000 (River jobs on a worker runtime serving every shard, with the
// runtime's poll interval as named), and the same column on an identical table
// with one UPDATE of every row, in the same run; it reports both rates and their
// ratio. A writer updates one random row every 2 ms, on the idle table first,
// then during the backfill, then during the single UPDATE: it reports the
// latencies of that write and the ratios against the idle table.
//
//	go test -run '^$' -bench BackfillMillion -benchtime 1x -timeout 60m ./workers/backfill/
func BenchmarkBackfillMillion(b *testing.B) {
	for _, poll := range []time.Duration{100 * time.Millisecond, 20 * time.Millisecond} {
		b.Run("poll="+poll.String(), func(b *testing.B) { benchMillion(b, poll) })
	}
}

func benchMillion(b *testing.B, poll time.Duration) {
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
	for i := 0; i < b.N; i++ {
		bf, upd := fmt.Sprintf("bench_bf_%d", i), fmt.Sprintf("bench_upd_%d", i)
		b.StopTimer()
		for _, table := range []string{bf, upd} {
			db.MustExec(b, fmt.Sprintf(`CREATE TABLE %[1]s (id bigint PRIMARY KEY, v int NOT NULL, filled int, touched int NOT NULL DEFAULT 0)`, table))
			db.MustExec(b, fmt.Sprintf(`INSERT INTO %[1]s (id, v) SELECT g, g %% 1000 FROM generate_series(1, $1) g`, table), rows)
			db.MustExec(b, fmt.Sprintf(`CREATE INDEX %[1]s_unfilled ON %[1]s (id) WHERE filled IS NULL`, table))
			db.MustExec(b, fmt.Sprintf(`VACUUM ANALYZE %s`, table))
		}
		bk := Backfill{
			Name:      "bench_fill_" + strconv.Itoa(i),
			BatchSize: 1000,
			Batch: func(ctx context.Context, tx pgx.Tx, n int) (int, error) {
				tag, err := tx.Exec(ctx, fmt.Sprintf(`
UPDATE %[1]s SET filled = v * 2
WHERE id = ANY (ARRAY(SELECT id FROM %[1]s WHERE filled IS NULL ORDER BY id LIMIT $1 FOR UPDATE))
  AND filled IS NULL`, bf), n)
				return int(tag.RowsAffected()), err
			},
		}
		reg := workers.NewRegistry()
		if err := Add(reg, bk); err != nil {
			b.Fatal(err)
		}
		rt := workertest.Start(b, db.Pool, reg, &workers.Options{PollInterval: poll, WorkersPerShard: 8})
		workertest.WaitFor(b, time.Minute, "every shard leased", func() bool { return len(rt.HeldShards()) == pgtest.DefaultShardCount })

		idle = append(idle, writeLoop(ctx, b, writerPool, bf, rows, func(n int) bool { return n >= 3000 })...)

		// The backfill, with the writer beside it.
		b.StartTimer()
		start := time.Now()
		if _, err := Start(ctx, db.Pool, bk); err != nil {
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
			p, err := Get(ctx, db.Pool, bk.Name)
			if err != nil {
				b.Fatal(err)
			}
			if p.State == Done {
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
		_ = rt.Stop(ctx)

		// The single UPDATE of every row, with the writer beside it.
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
	b.ReportMetric(updateRate/fillRate, "update/backfill")
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

// quantile is the q-quantile of ds (q = 1: the largest).
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(q * float64(len(s)-1))
	return s[i]
}
