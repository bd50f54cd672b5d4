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
// the next 4 hours, in a transaction of its own, and releases its oldest
// reservation (in another) once it holds two, so the pool stays in a steady
// state: on 20 devices (80 device-hours for up to 64 live reservations of 1.5 h
// on average) clients keep racing for the same devices, and some find none
// free; on 1,000 they rarely meet. Metrics:
// reservations/s (successful ReserveTx commits), conflicts/1k (reservations
// refused with CONFLICT per 1,000 attempts), retries/1k (devices lost to a
// concurrent reservation and retried, per 1,000 reservations), pgbench_tps, and
// reservations_per_pgbench_tx (reservations/s ÷ pgbench TPS).
func BenchmarkReserve(b *testing.B) {
	for _, devices := range []int{1000, 20} {
		db := pgtest.New(b, pgtest.Options{MaxConns: benchClients + 8})
		perNode := min(devices, 10)
		tenants := map[string]int{}
		for c := 0; c < benchClients; c++ {
			tenants[fmt.Sprintf("t%02d", c)] = 4
		}
		makePool(b, db, poolSpec{ID: "p", Nodes: devices / perNode, PerNode: perNode, Tenants: tenants})
		b.Run(fmt.Sprintf("devices=%d", devices), func(b *testing.B) {
			benchReserve(b, db, pgtest.PgbenchOnce(b, b.Name(), benchClients, 10*time.Second))
		})
	}
}

func benchReserve(b *testing.B, db *pgtest.DB, tps float64) {
	ctx := context.Background()
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	var (
		next                 atomic.Int64
		ok, conflicts, tries atomic.Int64
		retries              atomic.Int64
		wg                   sync.WaitGroup
	)
	b.ResetTimer()
	start := time.Now()
	for c := 0; c < benchClients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(c), uint64(b.N)))
			tenant := fmt.Sprintf("t%02d", c)
			var live []int64
			release := func(id int64) {
				err := pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
					_, err := capacity.ReleaseTx(ctx, tx, &capacity.ReleaseParams{ReservationID: id})
					return err
				})
				if err != nil {
					b.Errorf("release: %v", err)
				}
			}
			for next.Add(1) <= int64(b.N) {
				from := base.Add(time.Duration(rng.IntN(4)) * time.Hour)
				until := from.Add(time.Duration(1+rng.IntN(2)) * time.Hour)
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
					live = append(live, r.ID)
					if len(live) >= 2 {
						release(live[0])
						live = live[1:]
					}
				case fault.Has(err, fault.Conflict):
					conflicts.Add(1)
				default:
					b.Errorf("reserve: %v", err)
					return
				}
			}
			for _, id := range live {
				release(id)
			}
		}(c)
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	perSec := float64(ok.Load()) / elapsed.Seconds()
	b.ReportMetric(perSec, "reservations/s")
	b.ReportMetric(1000*float64(conflicts.Load())/float64(max(tries.Load(), 1)), "conflicts/1k")
	b.ReportMetric(1000*float64(retries.Load())/float64(max(ok.Load(), 1)), "retries/1k")
	b.ReportMetric(tps, "pgbench_tps")
	b.ReportMetric(perSec/tps, "reservations_per_pgbench_tx")
}
