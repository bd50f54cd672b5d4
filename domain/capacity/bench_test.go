package capacity_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/domain/capacity"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

const benchClients = 32

// BenchmarkReserve measures reservations per second with 32 concurrent
// clients on a pool of 1,000 devices (low contention) and of 20 devices (high
// contention), beside pgbench -N's TPS on the same server in the same run.
//
// Each client books one device for a one- or two-hour range starting in one of
// the next 4 hours, in a transaction of its own. The run goes in rounds: in a
// timed round every client makes up to benchPerRound reservation attempts;
// then, with the timer stopped, every reservation is released. So the timed
// part, like pgbench's, runs only the transactions it counts (no release
// transaction inside it), and every round starts from the same state, an empty
// pool: on 20 devices (80 device-hours for up to 64 live reservations of 1.5 h
// on average) clients keep racing for the same devices, and some find none
// free; on 1,000 they rarely meet. (A round ends with its slowest client, a
// barrier pgbench does not have: it can only lower our figure.) Metrics:
// reservations/s (successful ReserveTx commits per second of timed rounds),
// conflicts/1k (reservations refused with CONFLICT per 1,000 attempts),
// retries/1k (devices lost to a concurrent reservation and retried, per 1,000
// reservations), pgbench_tps, and reservations_per_pgbench_tx (reservations/s ÷
// pgbench TPS).
func BenchmarkReserve(b *testing.B) {
	for _, devices := range []int{1000, 20} {
		db := pgtest.New(b, pgtest.Options{MaxConns: benchClients + 8})
		perNode := min(devices, 10)
		tenants := map[string]int{}
		for c := 0; c < benchClients; c++ {
			tenants[fmt.Sprintf("t%02d", c)] = benchPerRound
		}
		makePool(b, db, poolSpec{ID: "p", Nodes: devices / perNode, PerNode: perNode, Tenants: tenants})
		b.Run(fmt.Sprintf("devices=%d", devices), func(b *testing.B) {
			benchReserve(b, db, pgtest.PgbenchOnce(b, b.Name(), benchClients, 10*time.Second))
		})
	}
}

// benchPerRound is how many reservations each client attempts in one timed
// round of BenchmarkReserve (and each tenant's quota).
const benchPerRound = 2

func benchReserve(b *testing.B, db *pgtest.DB, tps float64) {
	ctx := context.Background()
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	var (
		next                 atomic.Int64
		ok, conflicts, tries atomic.Int64
		retries              atomic.Int64
		timed                time.Duration
	)
	rngs := make([]*rand.Rand, benchClients)
	for c := range rngs {
		rngs[c] = rand.New(rand.NewPCG(uint64(c), uint64(b.N)))
	}
	live := make([][]int64, benchClients)
	// each runs fn(c) on every client at once and waits for all of them.
	each := func(fn func(c int)) {
		var wg sync.WaitGroup
		for c := 0; c < benchClients; c++ {
			wg.Add(1)
			go func() { defer wg.Done(); fn(c) }()
		}
		wg.Wait()
	}
	b.ResetTimer()
	for next.Load() < int64(b.N) && !b.Failed() {
		start := time.Now()
		each(func(c int) { // timed: reservations only
			tenant := fmt.Sprintf("t%02d", c)
			for k := 0; k < benchPerRound && next.Add(1) <= int64(b.N); k++ {
				from := base.Add(time.Duration(rngs[c].IntN(4)) * time.Hour)
				until := from.Add(time.Duration(1+rngs[c].IntN(2)) * time.Hour)
				tries.Add(1)
				var r *capacity.Reservation
				err := pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
					var err error
					r, err = capacity.ReserveTx(ctx, tx, &capacity.ReserveParams{PoolID: "p", Tenant: tenant, Devices: 1,
						Start: from, End: until, TTL: time.Hour})
					return err
				})
				switch {
				case err == nil:
					ok.Add(1)
					retries.Add(int64(r.Retries))
					live[c] = append(live[c], r.ID)
				case fault.Has(err, fault.Conflict):
					conflicts.Add(1)
				default:
					b.Errorf("reserve: %v", err)
					return
				}
			}
		})
		timed += time.Since(start)
		b.StopTimer()
		each(func(c int) { // not timed: back to an empty pool
			for _, id := range live[c] {
				err := pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
					_, err := capacity.ReleaseTx(ctx, tx, &capacity.ReleaseParams{ReservationID: id})
					return err
				})
				if err != nil {
					b.Errorf("release: %v", err)
				}
			}
			live[c] = live[c][:0]
		})
		b.StartTimer()
	}
	b.StopTimer()
	perSec := float64(ok.Load()) / timed.Seconds()
	b.ReportMetric(perSec, "reservations/s")
	b.ReportMetric(1000*float64(conflicts.Load())/float64(max(tries.Load(), 1)), "conflicts/1k")
	b.ReportMetric(1000*float64(retries.Load())/float64(max(ok.Load(), 1)), "retries/1k")
	b.ReportMetric(tps, "pgbench_tps")
	b.ReportMetric(perSec/tps, "reservations_per_pgbench_tx")
}
