package quorum_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/domain/quorum"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

const benchClients = 32

// BenchmarkVote measures votes per second with 32 concurrent voters, beside
// pgbench -N's TPS on the same server in the same run. Each vote is one
// transaction (VoteTx); every batch has the 32 clients as voters and a quorum of
// 32.
//
//   - same_batch: all 32 voters vote on one batch at a time (they take turns on
//     the batch's row lock), then move to the next; each batch commits (and
//     enqueues its apply job) on its last vote;
//   - own_batch: each voter works through batches of its own (one vote per
//     batch, which stays open): no two votes meet.
//
// Only accepted votes count; a refused vote fails the benchmark. Metrics:
// votes/s, pgbench_tps, votes_per_pgbench_tx.
func BenchmarkVote(b *testing.B) {
	for _, mode := range []string{"same_batch", "own_batch"} {
		db := pgtest.New(b, pgtest.Options{MaxConns: benchClients + 8})
		b.Run(mode, func(b *testing.B) {
			tps := pgtest.PgbenchOnce(b, b.Name(), benchClients, 10*time.Second)
			perClient := (b.N + benchClients - 1) / benchClients
			// Batches: same_batch needs perClient batches shared by everyone;
			// own_batch needs perClient batches per client.
			nBatches := perClient
			if mode == "own_batch" {
				nBatches = perClient * benchClients
			}
			ids := make([]int64, nBatches)
			for i := range ids {
				ids[i] = propose(b, db.Pool, quorum.ProposeParams{Kind: "bench", Agent: "bench", Voters: voters(benchClients),
					Quorum: benchClients, Deadline: time.Now().Add(24 * time.Hour)}).ID
			}
			var (
				votes atomic.Int64
				wg    sync.WaitGroup
			)
			b.ResetTimer()
			start := time.Now()
			for c := 0; c < benchClients; c++ {
				wg.Add(1)
				go func(c int) {
					defer wg.Done()
					voter := voters(benchClients)[c]
					for k := 0; k < perClient; k++ {
						id := ids[k]
						if mode == "own_batch" {
							id = ids[c*perClient+k]
						}
						if _, err := vote(db.Pool, id, voter, true); err != nil {
							b.Errorf("vote refused (%s): %v", mode, err)
							return
						}
						votes.Add(1) // accepted
					}
				}(c)
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			perSec := float64(votes.Load()) / elapsed.Seconds()
			b.ReportMetric(perSec, "votes/s")
			b.ReportMetric(tps, "pgbench_tps")
			b.ReportMetric(perSec/tps, "votes_per_pgbench_tx")
		})
	}
}
