package workers_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

type hogArgs struct{}

func (hogArgs) Kind() string { return "test_hog" }

// hogWorker holds one of the pool's connections, in an open transaction, for
// hold: a slow step, a long reconcile.
type hogWorker struct {
	river.WorkerDefaults[hogArgs]
	hold    time.Duration
	running atomic.Int32
	peak    atomic.Int32
}

func (w *hogWorker) Work(ctx context.Context, job *river.Job[hogArgs]) error {
	n := w.running.Add(1)
	defer w.running.Add(-1)
	for p := w.peak.Load(); n > p && !w.peak.CompareAndSwap(p, n); p = w.peak.Load() {
	}
	return workers.InTx(ctx, job, func(ctx context.Context, tx pgx.Tx) error {
		select {
		case <-time.After(w.hold):
		case <-ctx.Done():
		}
		return ctx.Err()
	})
}

// TestLeasesKeptWhileJobsHoldEveryConnection: a worker whose jobs hold every
// connection of its pool, each for longer than the lease TTL, keeps its shard
// leases: the keeper's renewals, the heartbeat and the clock samples never wait
// behind the work for a connection (they have a connection pool of their own).
// Without that, each renewal queued behind jobs holding connections past the
// TTL, the process lost its own leases under load, and its work was fenced and
// taken over by nobody else.
func TestLeasesKeptWhileJobsHoldEveryConnection(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, pgtest.Options{MaxConns: 3})
	ctx := context.Background()
	// A short lease on purpose: the jobs must hold the pool past the TTL.
	const ttl = 1500 * time.Millisecond
	w := &hogWorker{hold: 2 * time.Second} // past the TTL
	reg := workers.NewRegistry()
	workers.AddWorker(reg, w)
	shards := []int{0, 1, 2, 3}
	rt := workertest.Start(t, db.Pool, reg, &workers.Options{Shards: shards, LeaseTTL: ttl, LeaseRenew: 250 * time.Millisecond})
	workertest.WaitFor(t, 10*time.Second, "the shards' leases held", func() bool {
		for _, s := range shards {
			if _, ok := rt.LeaseForQueue(jobs.ShardQueue(s)); !ok {
				return false
			}
		}
		return true
	})
	before := epochs(t, db)

	// 4 shards × 4 workers a shard want up to 16 connections; the pool has 3,
	// so the 12 jobs hold it for 4 rounds of 2 s.
	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		for i := range 12 {
			if _, err := jobs.InsertTx(ctx, tx, hogArgs{}, &river.InsertOpts{Queue: jobs.ShardQueue(shards[i%len(shards)])}); err != nil {
				return err
			}
		}
		return nil
	}))
	workertest.WaitFor(t, 10*time.Second, "every connection held by a job", func() bool { return w.running.Load() >= 3 })

	// Three TTLs with the pool exhausted: every renewal happens in that time.
	for end := time.Now().Add(3 * ttl); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		for _, s := range shards {
			_, ok := rt.LeaseForQueue(jobs.ShardQueue(s))
			require.True(t, ok, "the worker lost the lease of shard %d while its jobs held its pool", s)
		}
	}
	require.Equal(t, before, epochs(t, db), "a shard lease changed hands (or was taken again) while the jobs held the pool")
	require.GreaterOrEqual(t, int(w.peak.Load()), 3, "the jobs held every connection of the pool")
	workertest.WaitFor(t, 60*time.Second, "every job completed", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'test_hog' AND state = 'completed'`) == 12
	})
}
