package workers_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/internal/lease"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

// gathered is a registry's values by metric name, then by the metric's label
// values joined by ",", in label name order.
func gathered(t *testing.T, g prometheus.Gatherer) map[string]map[string]float64 {
	t.Helper()
	mfs, err := g.Gather()
	require.NoError(t, err)
	out := map[string]map[string]float64{}
	for _, mf := range mfs {
		vals := map[string]float64{}
		for _, m := range mf.GetMetric() {
			key := ""
			for i, l := range m.GetLabel() {
				if i > 0 {
					key += ","
				}
				key += l.GetValue()
			}
			switch {
			case m.Counter != nil:
				vals[key] = m.GetCounter().GetValue()
			case m.Gauge != nil:
				vals[key] = m.GetGauge().GetValue()
			}
		}
		out[mf.GetName()] = vals
	}
	return out
}

// TestLeaseTakeoversCounted: bettercompute_lease_takeovers_total counts the
// shard leases a process took from a previous holding, per shard queue and
// reason (here released: the first process stopped gracefully), and not the
// leases it was the first to hold.
func TestLeaseTakeoversCounted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	shards := pgtest.DefaultShardCount
	start := func() (*workers.Runtime, *prometheus.Registry) {
		reg := prometheus.NewRegistry()
		rt := workertest.Start(t, db.Pool, nil, &workers.Options{Metrics: workers.NewMetrics(reg)})
		workertest.WaitFor(t, 30*time.Second, "the process holds every shard", func() bool {
			return gathered(t, reg)["bettercompute_leases_held"][""] == float64(shards)
		})
		return rt, reg
	}

	first, firstReg := start()
	require.Empty(t, gathered(t, firstReg)["bettercompute_lease_takeovers_total"], "the first holder of each lease took none over")
	require.NoError(t, first.Stop(ctx)) // releases its leases

	_, secondReg := start()
	// Each lease's takeover is counted just after the gauge of leases held
	// moves: wait for the last one.
	var takeovers map[string]float64
	workertest.WaitFor(t, 30*time.Second, "a takeover counted in every shard queue", func() bool {
		takeovers = gathered(t, secondReg)["bettercompute_lease_takeovers_total"]
		return len(takeovers) >= shards
	})
	require.Len(t, takeovers, shards, "one per shard queue")
	for i := 0; i < shards; i++ {
		require.Equal(t, 1.0, takeovers[jobs.ShardQueue(i)+","+lease.ReasonReleased], "shard %d taken over once, released by its holder", i)
	}
}
