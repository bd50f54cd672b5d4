package workers_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers/internal/lease"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

// exampleTask is the example application's fenced task (testdata/exampleapp).
type exampleTask struct {
	ID string `json:"id"`
}

func (exampleTask) Kind() string { return "example_task" }

// insertTask enqueues an example task in its shard's queue, as the application does.
func insertTask(ctx context.Context, db *pgtest.DB, id string) error {
	return pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		queue, err := jobs.ShardQueueOfTx(ctx, tx, id)
		if err != nil {
			return err
		}
		_, err = jobs.InsertTx(ctx, tx, exampleTask{ID: id}, &river.InsertOpts{Queue: queue})
		return err
	})
}

// producer inserts example tasks every interval until stopped; it returns the
// stop function, which reports how many it inserted.
func producer(t *testing.T, db *pgtest.DB, every time.Duration) (stop func() int) {
	t.Helper()
	var n atomic.Int64
	var halt atomic.Bool
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; !halt.Load(); i++ {
			if err := insertTask(context.Background(), db, fmt.Sprintf("task-%06d", i)); err != nil {
				t.Errorf("insert task %d: %v", i, err)
				return
			}
			n.Add(1)
			time.Sleep(every)
		}
	})
	var once sync.Once
	stop = func() int {
		once.Do(func() { halt.Store(true); wg.Wait() })
		return int(n.Load())
	}
	t.Cleanup(func() { stop() })
	return stop
}

// ranExactlyOnce: every inserted task's fenced write is recorded exactly once.
func ranExactlyOnce(t *testing.T, db *pgtest.DB, inserted int) bool {
	t.Helper()
	return db.MustCount(t, `SELECT count(DISTINCT task_id) FROM example_task_runs`) == inserted
}

// crashLoopEnv: production lease timing, so a restart that waited out its
// predecessor's leases would lose 15 s each time.
var crashLoopEnv = []string{"BETTER_COMPUTE_LEASE_TTL=15s", "BETTER_COMPUTE_LEASE_RENEW=5s", "BETTER_COMPUTE_POLL_INTERVAL=50ms"}

// TestProcessCrashLoopResumesAtOnce: kill -9 the only worker and restart it at
// once, 20 times, under a steady producer. Each restart is a new incarnation of
// the same identity and takes every shard back at once (the leases live 15 s:
// waiting them out would take 15 s per restart); after the last restart the
// backlog drains and every task's fenced write is recorded exactly once.
func TestProcessCrashLoopResumesAtOnce(t *testing.T) {
	t.Parallel()
	db := appDB(t)
	w := startWorker(t, db, crashLoopEnv...)
	workertest.WaitFor(t, 20*time.Second, "the worker holds every shard", func() bool { return leasesOf(t, db, w) == 16 })
	identity, _, _ := lease.OwnerIdentity(ownerOf(t, db, w))
	stop := producer(t, db, 10*time.Millisecond)

	var back []time.Duration
	for i := range 20 {
		time.Sleep(time.Duration(200+rand.IntN(500)) * time.Millisecond)
		require.NoError(t, w.cmd.Process.Signal(syscall.SIGKILL))
		<-w.done
		restarted := time.Now()
		w = startWorker(t, db, crashLoopEnv...)
		// Well under one lease TTL (15 s), which is what a restart used to wait.
		workertest.WaitFor(t, 10*time.Second, fmt.Sprintf("restart %d holds every shard again", i+1), func() bool {
			return leasesOf(t, db, w) == 16
		})
		back = append(back, time.Since(restarted))
		id, n, _ := lease.OwnerIdentity(ownerOf(t, db, w))
		require.Equal(t, identity, id, "a restart keeps its identity")
		require.Equal(t, int64(i+2), n, "and is its next incarnation")
	}
	inserted := stop()
	stopped := time.Now()
	workertest.WaitFor(t, 30*time.Second, "the backlog drains", func() bool { return ranExactlyOnce(t, db, inserted) })
	drained := time.Since(stopped)
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM (SELECT task_id FROM example_task_runs GROUP BY task_id HAVING count(*) > 1) d`),
		"a task's fenced write recorded twice")
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM river_job WHERE kind = 'example_task' AND state <> 'completed'`))
	slices.Sort(back)
	// Insert to committed run, by the database's clock, over the whole crash loop.
	var p50, p99, worst float64
	require.NoError(t, db.Pool.QueryRow(context.Background(), `
		SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY d), percentile_cont(0.99) WITHIN GROUP (ORDER BY d), max(d)
		FROM (SELECT extract(epoch FROM r.ran_at - j.created_at) * 1000 AS d
		      FROM example_task_runs r JOIN river_job j ON j.id = r.job_id) x`).Scan(&p50, &p99, &worst))
	t.Logf("20 kill -9 restarts under %d tasks: every shard back after %s median, %s max (lease TTL 15 s); insert to run p50 %.0f ms, p99 %.0f ms, max %.0f ms; backlog drained %s after the producer stopped; every task ran exactly once",
		inserted, back[len(back)/2].Round(time.Millisecond), back[len(back)-1].Round(time.Millisecond), p50, p99, worst, drained.Round(time.Millisecond))
}

// epochs are the shard leases' epochs, by name.
func epochs(t *testing.T, db *pgtest.DB) map[string]int64 {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `SELECT name, epoch FROM compute_leases WHERE name LIKE 'shard/%'`)
	require.NoError(t, err)
	out := map[string]int64{}
	for rows.Next() {
		var n string
		var e int64
		require.NoError(t, rows.Scan(&n, &e))
		out[n] = e
	}
	require.NoError(t, rows.Err())
	return out
}

func exitedWith(t *testing.T, p *proc, within time.Duration) (code int, log string) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(within):
		t.Fatalf("process %d did not exit within %s", p.pid, within)
	}
	b, _ := os.ReadFile(p.log)
	return p.cmd.ProcessState.ExitCode(), string(b)
}

// TestProcessDuplicateIdentity shows both ways two live processes given one
// identity end, without flapping: a second process started beside a live one is
// refused at start (CONFLICT, exit 1) and the first keeps every lease, same
// epochs; a process paused past its heartbeat is replaced, and when it resumes
// it learns it was replaced and exits (CONFLICT), leaving its successor alone.
func TestProcessDuplicateIdentity(t *testing.T) {
	t.Parallel()
	db := appDB(t)
	env := append([]string{"BETTER_COMPUTE_WORKER_ID=billing-0"}, crashLoopEnv...)
	a := startWorker(t, db, env...)
	workertest.WaitFor(t, 20*time.Second, "A holds every shard", func() bool { return leasesOf(t, db, a) == 16 })
	before := epochs(t, db)

	b := startWorker(t, db, env...)
	code, log := exitedWith(t, b, 20*time.Second)
	require.Equal(t, 1, code, log)
	require.Contains(t, log, "CONFLICT")
	require.Contains(t, log, "worker identity billing-0 is in use by a live process")
	time.Sleep(2 * time.Second) // room for a wrong thing: a flap would show within two renewals' time
	require.Equal(t, 16, leasesOf(t, db, a), "A keeps every shard")
	require.Equal(t, before, epochs(t, db), "no lease changed hands")

	// A paused past its heartbeat: C replaces it and takes its leases at once.
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGSTOP))
	workertest.WaitFor(t, 30*time.Second, "A silent for three heartbeats", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM compute_workers WHERE identity = 'billing-0'
			AND seen_at < compute_now() - interval '3500 milliseconds'`) == 1
	})
	c := startWorker(t, db, env...)
	workertest.WaitFor(t, 10*time.Second, "C holds every shard", func() bool { return leasesOf(t, db, c) == 16 })
	require.Equal(t, "billing-0#2", ownerOf(t, db, c))
	taken := epochs(t, db)
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGCONT))
	code, log = exitedWith(t, a, 20*time.Second)
	require.Equal(t, 1, code, log)
	require.Contains(t, log, "worker identity billing-0 was taken over by incarnation 2")
	require.Equal(t, 16, leasesOf(t, db, c), "C keeps every shard")
	require.Equal(t, taken, epochs(t, db), "no lease changed hands after A woke")
	for n, e := range taken {
		require.Equal(t, before[n]+1, e, "C took %s with a new epoch", n)
	}
}
