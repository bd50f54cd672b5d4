package outboxworker

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/outbox"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

// appendBulk appends n events, 1,000 per transaction.
func appendBulk(b *testing.B, db *pg.Pool, n int) {
	ctx := context.Background()
	for done := 0; done < n; done += 1000 {
		msgs := make([]outbox.Message, min(1000, n-done))
		for i := range msgs {
			msgs[i] = outbox.Message{Topic: "bench", Key: fmt.Sprint(done + i), Payload: map[string]int{"i": done + i}}
		}
		require.NoError(b, pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error { return outbox.AppendTx(ctx, tx, msgs...) }))
	}
}

// BenchmarkSinkThroughput: events per second delivered to a no-op sink with a
// 1,000-event batch (every delivery a River job: lease, read, handler, fenced
// cursor advance), beside the peer: the bare read loop over the same events
// with the same rule and batch, in the same run.
//
//	go test ./workers/outbox -run '^$' -bench BenchmarkSinkThroughput -benchtime 1x
func BenchmarkSinkThroughput(b *testing.B) {
	const perRound = 50_000
	for b.Loop() {
		db := newDB(b)
		appendBulk(b, db.Pool, perRound)
		ctx := context.Background()

		start := time.Now()
		var c outbox.Cursor
		read := 0
		for read < perRound {
			evs, next, _, err := outbox.Read(ctx, db.Pool, outbox.ReadOptions{After: c, Limit: 1000})
			require.NoError(b, err)
			read += len(evs)
			c = next
		}
		readRate := float64(perRound) / time.Since(start).Seconds()

		reg := workers.NewRegistry()
		require.NoError(b, Register(reg, &Options{PollEvery: 20 * time.Millisecond}))
		// Timed from the first delivery to the last, so the worker's start-up
		// (leases, River's leader election, the first poll) is not counted.
		var mu sync.Mutex
		var first, last time.Time
		delivered := 0
		require.NoError(b, AddSink(reg, Sink{Name: "noop", BatchSize: 1000, Handle: func(_ context.Context, evs []Event) error {
			mu.Lock()
			defer mu.Unlock()
			if first.IsZero() {
				first = time.Now()
			}
			delivered += len(evs)
			last = time.Now()
			return nil
		}}))
		rt := workertest.Start(b, db.Pool, reg, nil)
		workertest.WaitFor(b, 5*time.Minute, "all delivered", func() bool {
			s, err := outbox.GetSink(ctx, db.Pool, "noop")
			require.NoError(b, err)
			return s.Delivered == perRound
		})
		require.NoError(b, rt.Stop(ctx))
		mu.Lock()
		// The first batch's handling is in the window's start: count the rest.
		sinkRate := float64(delivered-1000) / last.Sub(first).Seconds()
		mu.Unlock()
		b.ReportMetric(sinkRate, "delivered-events/s")
		b.ReportMetric(readRate, "peer-read-events/s")
		b.ReportMetric(sinkRate/readRate, "ratio")
	}
}

// BenchmarkCommitToDelivery: the time from a producer's commit to the sink's
// handler, at a steady 1,000 events/s (5 events every 5 ms) for 10 s, with the
// default intervals (River polls every 100 ms, idle sinks are polled every
// 50 ms; no LISTEN/NOTIFY). Targets: p50 under 250 ms, p99 under 1 s.
//
// The peer runs beside it on the same events, the same machine and the same
// commits: a bare poll loop that reads the log with the same rule and batch
// every 50 ms (the sink's poll) and hands the events to the same kind of
// handler, with no lease, no job and no cursor write. The ratios are ours ÷
// the peer's, at p50 and p99.
//
//	go test ./workers/outbox -run '^$' -bench BenchmarkCommitToDelivery -benchtime 1x
func BenchmarkCommitToDelivery(b *testing.B) {
	const (
		rate     = 1000
		duration = 10 * time.Second
		perTx    = 5
	)
	for b.Loop() {
		db := newDB(b)
		ctx := context.Background()
		var committed, delivered sync.Map // key -> time
		var count atomic.Int64
		reg := workers.NewRegistry()
		require.NoError(b, AddSink(reg, Sink{Name: "latency", Handle: func(_ context.Context, evs []Event) error {
			now := time.Now()
			for _, e := range evs {
				if _, dup := delivered.LoadOrStore(e.Key, now); !dup {
					count.Add(1)
				}
			}
			return nil
		}}))
		rt := workertest.Start(b, db.Pool, reg, &workers.Options{PollInterval: 100 * time.Millisecond, LeaseTTL: 15 * time.Second, LeaseRenew: 5 * time.Second})

		// The peer: a plain poll loop on the same log, started from its end.
		var peerDelivered sync.Map // key -> time
		var peerCount atomic.Int64
		peerCtx, stopPeer := context.WithCancel(ctx)
		peerDone := make(chan struct{})
		go func() {
			defer close(peerDone)
			var c outbox.Cursor
			t := time.NewTimer(0)
			defer t.Stop()
			for {
				select {
				case <-peerCtx.Done():
					return
				case <-t.C:
				}
				for {
					evs, next, scanned, err := outbox.Read(peerCtx, db.Pool, outbox.ReadOptions{After: c, Limit: 1000})
					if err != nil {
						if peerCtx.Err() == nil {
							b.Error(err)
						}
						return
					}
					now := time.Now()
					for _, e := range evs {
						if _, dup := peerDelivered.LoadOrStore(e.Key, now); !dup {
							peerCount.Add(1)
						}
					}
					c = next
					if scanned < 1000 {
						break
					}
				}
				t.Reset(50 * time.Millisecond)
			}
		}()

		// The producer keeps the schedule with up to 16 transactions in flight, so
		// one slow commit does not lower the rate.
		total := int(duration.Seconds() * rate)
		tick := time.NewTicker(time.Second * perTx / rate)
		sem := make(chan struct{}, 16)
		var wg sync.WaitGroup
		began := time.Now()
		for n := 0; n < total; n += perTx {
			<-tick.C
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer func() { <-sem; wg.Done() }()
				msgs := make([]outbox.Message, perTx)
				for i := range msgs {
					msgs[i] = outbox.Message{Topic: "bench", Key: fmt.Sprint(n + i)}
				}
				if err := pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error { return outbox.AppendTx(ctx, tx, msgs...) }); err != nil {
					b.Error(err)
					return
				}
				now := time.Now()
				for _, m := range msgs {
					committed.Store(m.Key, now)
				}
			}()
		}
		wg.Wait()
		tick.Stop()
		b.ReportMetric(float64(total)/time.Since(began).Seconds(), "produced-events/s")
		workertest.WaitFor(b, time.Minute, "all delivered", func() bool { return count.Load() == int64(total) })
		workertest.WaitFor(b, time.Minute, "all read by the peer", func() bool { return peerCount.Load() == int64(total) })
		stopPeer()
		<-peerDone
		require.NoError(b, rt.Stop(ctx))
		percentiles := func(delivered *sync.Map) func(q float64) float64 {
			var lat []time.Duration
			committed.Range(func(k, c any) bool {
				d, _ := delivered.Load(k)
				lat = append(lat, max(0, d.(time.Time).Sub(c.(time.Time))))
				return true
			})
			sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
			return func(q float64) float64 { return float64(lat[int(q*float64(len(lat)-1))].Microseconds()) / 1000 }
		}
		p, peer := percentiles(&delivered), percentiles(&peerDelivered)
		b.ReportMetric(p(0.50), "p50-ms")
		b.ReportMetric(p(0.99), "p99-ms")
		b.ReportMetric(p(1), "max-ms")
		b.ReportMetric(peer(0.50), "peer-p50-ms")
		b.ReportMetric(peer(0.99), "peer-p99-ms")
		b.ReportMetric(p(0.50)/max(peer(0.50), 0.001), "p50-ratio")
		b.ReportMetric(p(0.99)/max(peer(0.99), 0.001), "p99-ratio")
	}
}

// BenchmarkDispatcher: rows per second published by one dispatcher process
// with a no-op publish, 50 rows on each of 1,000 keys (batch 100, 16 keys at
// once), beside the peer in the same run: a plain loop over the same rows in
// a database of its own (the same fresh state), each transaction taking 100
// rows with SELECT … FOR UPDATE SKIP LOCKED, decoding each (to_jsonb, as the
// dispatcher's rows are), and deleting them; it keeps no order per key and no
// retry state. The ratio is ours ÷ the peer's.
//
//	go test ./workers/outbox -run '^$' -bench BenchmarkDispatcher -benchtime 1x
func BenchmarkDispatcher(b *testing.B) {
	const keys, perKey, batch = 1000, 50, 100
	for b.Loop() {
		ctx := context.Background()
		db := newDB(b)
		insertReports(b, db.Pool, keys, perKey)
		d := newStockDispatcher(b, DispatcherOptions[report]{BatchSize: batch,
			Publish: func(context.Context, report) error { return nil }})
		start := time.Now()
		n, err := d.Reconcile(ctx, db.Pool)
		require.NoError(b, err)
		require.Equal(b, keys*perKey, n)
		ours := float64(n) / time.Since(start).Seconds()

		peerDB := newDB(b)
		insertReports(b, peerDB.Pool, keys, perKey)
		start = time.Now()
		n = 0
		for {
			var got int
			require.NoError(b, pg.InTx(ctx, peerDB.Pool, func(ctx context.Context, tx pgx.Tx) error {
				rows, err := tx.Query(ctx, `SELECT seq, to_jsonb(r) FROM inventory.stock_reports r ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED`, batch)
				if err != nil {
					return err
				}
				var seqs []int64
				for rows.Next() {
					var seq int64
					var row report
					if err := rows.Scan(&seq, &row); err != nil {
						return err
					}
					seqs = append(seqs, seq)
				}
				if err := rows.Err(); err != nil {
					return err
				}
				got = len(seqs)
				_, err = tx.Exec(ctx, `DELETE FROM inventory.stock_reports WHERE seq = ANY($1)`, seqs)
				return err
			}))
			if got == 0 {
				break
			}
			n += got
		}
		require.Equal(b, keys*perKey, n)
		peer := float64(n) / time.Since(start).Seconds()
		b.ReportMetric(ours, "rows/s")
		b.ReportMetric(peer, "peer-rows/s")
		b.ReportMetric(ours/peer, "ratio")
	}
}
