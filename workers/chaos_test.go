package workers_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

// The pause, wake, kill -9 scenario: a lease holder is paused (SIGSTOP) past its
// TTL, another process takes its shards, then the paused one is woken (SIGCONT)
// and killed a random moment later. Woken, its River producers may fetch jobs of
// the shards it no longer holds before its keeper notices the loss; if it then
// dies holding them, nobody takes those shards over again (their holder never
// changed), so only the holder's own sweep can hand them back. See
// TestChaosPauseWakeKill for what must hold.

// chaosRounds is the number of rounds: small in the default suite, and the full
// size under go tool task chaos (BETTER_COMPUTE_CHAOS_ROUNDS=100).
func chaosRounds(t *testing.T, def int) int {
	return envInt(t, "BETTER_COMPUTE_CHAOS_ROUNDS", def)
}

// chaosReport is what a run measured.
type chaosReport struct {
	Rounds       int
	Takeovers    int           // lease owner changes across every shard
	ByHeartbeat  int           // … of them because the holder's heartbeat stopped
	StaleCommits int           // reconciles a paused process committed after its pause
	Overlaps     int           // two reconciles of one key whose intervals overlap
	Strays       int           // running shard jobs not attempted by their shard's live holder
	HandedBack   int           // jobs a shard's holder handed back (at takeover or by its sweep)
	Swept        int           // … of them, strays found after a lease round (no takeover)
	Converged    time.Duration // from the writer's stop to every key reconciled
	Changes      int64
}

func (r chaosReport) String() string {
	return fmt.Sprintf("rounds %d, takeovers %d (%d by heartbeat), stale commits %d, overlapping reconciles %d, stranded jobs %d, jobs handed back %d (%d of them strays found after a lease round), converged %s after the writer stopped (%d changes)",
		r.Rounds, r.Takeovers, r.ByHeartbeat, r.StaleCommits, r.Overlaps, r.Strays, r.HandedBack, r.Swept, r.Converged.Round(time.Millisecond), r.Changes)
}

// runChaos runs the scenario with procs worker processes connecting through url
// (the database's own, or a pooler's) for the given rounds, and checks the
// guarantees. It returns what it measured.
func runChaos(t *testing.T, db *pgtest.DB, url string, procs, rounds int) chaosReport {
	t.Helper()
	via := &pgtest.DB{Pool: db.Pool, Name: db.Name, URL: url}
	// Beats every 200 ms, taken for dead after 800 ms: a paused holder's
	// shards change hands by its heartbeat, before its leases' 1.5 s expiry.
	env := []string{"EXAMPLE_RECONCILE_SLEEP=5ms", "BETTER_COMPUTE_DB_MAX_CONNS=12", "BETTER_COMPUTE_HEARTBEAT=200ms"}
	live := make([]*proc, 0, procs)
	for range procs {
		live = append(live, startWorker(t, via, env...))
	}
	workertest.WaitFor(t, 30*time.Second, "every shard is held", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM compute_leases WHERE name LIKE 'shard/%' AND expires_at > compute_now()`) == 16
	})

	// A steady writer: changes spread over 200 keys, each with its DirtyTx. It
	// stops at cleanup too, so a failed test does not leave it running.
	var stop atomic.Bool
	var changes atomic.Int64
	var writeErr atomic.Value
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; !stop.Load(); i++ {
			if err := exampleChange(db, fmt.Sprintf("item-%03d", rand.IntN(200)), int64(i)); err != nil {
				writeErr.Store(err)
				return
			}
			changes.Add(1)
			time.Sleep(2 * time.Millisecond)
		}
	}()
	t.Cleanup(func() { stop.Store(true); wg.Wait() })

	// A commit of the paused process after its shards were taken over (it was
	// stopped until after that) is a stale commit.
	type pause struct {
		pid   int
		taken time.Time // the database's clock once every shard of it was taken
	}
	var pauses []pause
	for r := 0; r < rounds; r++ {
		// The victim is a process that holds at least one shard now.
		var victim *proc
		workertest.WaitFor(t, 30*time.Second, "a live process holds a shard", func() bool {
			for _, p := range rand.Perm(len(live)) {
				if leasesOf(t, db, live[p]) > 0 {
					victim = live[p]
					return true
				}
			}
			return false
		})
		require.NoError(t, victim.cmd.Process.Signal(syscall.SIGSTOP))
		// Every lease it held is taken by another process (not merely expired).
		workertest.WaitFor(t, 60*time.Second, fmt.Sprintf("round %d: the paused process's shards are taken over", r), func() bool {
			return db.MustCount(t, `SELECT count(*) FROM compute_leases WHERE name LIKE 'shard/%' AND owner = $1`, ownerOf(t, db, victim)) == 0
		})
		pauses = append(pauses, pause{pid: victim.pid, taken: dbNow(t, db)})
		require.NoError(t, victim.cmd.Process.Signal(syscall.SIGCONT))
		time.Sleep(time.Duration(rand.IntN(300)) * time.Millisecond)
		require.NoError(t, victim.cmd.Process.Signal(syscall.SIGKILL))
		for i, p := range live {
			if p == victim {
				live[i] = startWorker(t, via, env...)
			}
		}
	}

	stop.Store(true)
	wg.Wait()
	if err, _ := writeErr.Load().(error); err != nil {
		t.Fatalf("the writer failed: %v", err)
	}
	stopped := time.Now()
	deadline := stopped.Add(20 * time.Second)
	logged := false
	for !converged(t, db) && time.Now().Before(deadline) {
		if !logged && time.Since(stopped) > 3*time.Second {
			logged = true
			logNotConverged(t, db)
		}
		time.Sleep(20 * time.Millisecond)
	}
	rep := chaosReport{Rounds: rounds, Converged: time.Since(stopped), Changes: changes.Load()}
	isConverged := converged(t, db)

	rep.Takeovers = db.MustCount(t, `SELECT coalesce(sum(epoch - 1), 0)::int FROM compute_leases WHERE name LIKE 'shard/%'`)
	rep.ByHeartbeat = heartbeatTakeovers(t, db)
	for _, p := range pauses {
		rep.StaleCommits += db.MustCount(t, `SELECT count(*) FROM example_reconcile_log WHERE worker = $1 AND finished_at > $2`, strconv.Itoa(p.pid), p.taken)
	}
	rep.HandedBack = db.MustCount(t, `SELECT count(*) FROM river_job j, unnest(j.errors) e WHERE e->>'error' LIKE 'handed back by %'`)
	rep.Swept = db.MustCount(t, `SELECT count(*) FROM river_job j, unnest(j.errors) e WHERE e->>'error' LIKE 'handed back by %, after a lease round:%'`)
	rep.Overlaps = db.MustCount(t, `SELECT count(*) FROM example_reconcile_log a JOIN example_reconcile_log b
		ON a.item_id = b.item_id AND a.id < b.id AND a.started_at < b.finished_at AND b.started_at < a.finished_at`)
	rep.Strays = db.MustCount(t, strayJobsSQL)
	t.Logf("chaos: %s", rep)
	if !isConverged {
		logNotConverged(t, db)
	}

	require.True(t, isConverged, "every key converges within 20 s of the writer's stop: %d keys dirty, %d items behind",
		db.MustCount(t, `SELECT count(*) FROM compute_dirty`),
		db.MustCount(t, `SELECT count(*) FROM example_items WHERE reconciled_version IS DISTINCT FROM version`))

	require.Zero(t, rep.StaleCommits, "a paused process committed a reconcile after its pause")
	require.Zero(t, rep.Overlaps, "two reconciles of one key overlapped")
	require.Zero(t, rep.Strays, "a shard job is running without its shard's live holder's attempt")
	require.GreaterOrEqual(t, rep.Takeovers, rounds, "every round took at least one shard over")
	require.Positive(t, rep.ByHeartbeat, "paused holders' shards taken by heartbeat, before their leases expired")
	return rep
}

// exampleChange is change, returning its error (for a writer goroutine).
func exampleChange(db *pgtest.DB, id string, qty int64) error {
	ctx := context.Background()
	return pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO example_items (id, qty) VALUES ($1, $2)
			ON CONFLICT (id) DO UPDATE SET qty = EXCLUDED.qty, version = example_items.version + 1`, id, qty)
		if err != nil {
			return err
		}
		return workers.DirtyTx(ctx, tx, "example_item", id, nil)
	})
}

// logNotConverged logs the keys still dirty and their jobs.
func logNotConverged(t *testing.T, db *pgtest.DB) {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT d.key, d.gen, d.not_before, j.id, j.state, j.queue, j.attempt, j.attempted_by, j.scheduled_at, j.errors, j.metadata
		FROM compute_dirty d LEFT JOIN river_job j ON j.id = d.job_id ORDER BY d.key LIMIT 5`)
	if err != nil {
		t.Logf("not converged: %v", err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		vals, _ := rows.Values()
		t.Logf("not converged: %v", vals)
	}
}

// dbNow reads the database server's clock.
func dbNow(t *testing.T, db *pgtest.DB) time.Time {
	t.Helper()
	var at time.Time
	require.NoError(t, db.QueryRow(context.Background(), `SELECT clock_timestamp()`).Scan(&at))
	return at
}

// strayJobsSQL counts running jobs of shard queues whose latest attempt is not
// the live holder of that shard's lease.
const strayJobsSQL = `SELECT count(*) FROM river_job j
WHERE j.state = 'running' AND j.queue LIKE 'shard\_%'
  AND NOT EXISTS (SELECT 1 FROM compute_leases l
                  WHERE l.name = 'shard/' || substr(j.queue, 7)
                    AND l.owner = j.attempted_by[array_length(j.attempted_by, 1)]
                    AND l.expires_at > compute_now())`

// TestChaosPauseWakeKill repeats pause, wake, kill -9 at random offsets across
// three worker processes under a steady writer. Then every key converges, no
// shard job is left running without its holder's attempt, no paused process
// committed anything after its pause, and no two reconciles of a key overlapped.
func TestChaosPauseWakeKill(t *testing.T) {
	t.Parallel()
	db := appDB(t)
	runChaos(t, db, db.URL, 3, chaosRounds(t, 10))
}

// TestChaosBehindPgBouncer runs the same rounds with every worker process behind
// a real PgBouncer in transaction mode (1.18 on Debian 12, which crashes on some
// cancel requests): the guarantees hold, no cancel request reaches the pooler
// (a cancelled statement closes its connection instead), and PgBouncer is still
// up and serving afterwards.
func TestChaosBehindPgBouncer(t *testing.T) {
	t.Parallel()
	db := appDB(t)
	bouncer := pgtest.StartPgBouncer(t, db)
	cancels := pgtest.StartCancelCounter(t, bouncer.URL) // between the workers and PgBouncer
	runChaos(t, db, cancels.URL(bouncer.URL), 2, chaosRounds(t, 6))

	require.Zero(t, cancels.Cancels(), "a worker sent a cancel request through the pooler")
	require.False(t, bouncer.Exited(), "PgBouncer died:\n%s", bouncer.Log())
	require.NotContains(t, bouncer.Log(), "FATAL")
	pool, err := pg.Open(context.Background(), pg.Options{URL: bouncer.URL, MaxConns: 2})
	require.NoError(t, err, "PgBouncer still accepts clients")
	defer pool.Close()
	var one int
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT 1").Scan(&one), "PgBouncer still serves queries")
}
