package workers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

// These tests run the example application (testdata/exampleapp: an application
// built on cli.Main with a module of its own) as real worker processes, because a
// process boundary is the point: kill -9, SIGSTOP, SIGTERM.

var (
	buildOnce sync.Once
	appBin    string
	buildErr  error
)

func exampleApp(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "exampleapp-")
		if err != nil {
			buildErr = err
			return
		}
		appBin = filepath.Join(dir, "exampleapp")
		cmd := exec.Command("go", "build", "-o", appBin, "./testdata/exampleapp")
		cmd.Dir = ".."
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build exampleapp: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return appBin
}

type proc struct {
	cmd   *exec.Cmd
	log   string
	pid   int
	owner string        // its lease owner, IDENTITY#N, once it has claimed one
	done  chan struct{} // closed when it has exited (cmd.ProcessState is set)
}

// ownerOf is p's lease owner, read from compute_workers by its pid ("" until it
// has claimed its identity).
func ownerOf(t *testing.T, db *pgtest.DB, p *proc) string {
	t.Helper()
	if p.owner == "" {
		require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT coalesce(max(identity || '#' || incarnation), '')
			FROM compute_workers WHERE pid = $1`, p.pid).Scan(&p.owner))
	}
	return p.owner
}

// appDB is a fresh database migrated by the example application itself.
func appDB(t *testing.T) *pgtest.DB {
	t.Helper()
	db := pgtest.New(t, pgtest.Options{Empty: true, MaxConns: 30})
	bin := exampleApp(t)
	out, err := exec.Command(bin, "migrate", "--database-url", db.URL, "--log-level", "warn").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "applied example/0002_reconcile_log")
	return db
}

func startWorker(t *testing.T, db *pgtest.DB, env ...string) *proc {
	t.Helper()
	return startWorkerOn(t, db, "all", env...)
}

// startWorkerOn is startWorker serving only the shards spec (--shards).
func startWorkerOn(t *testing.T, db *pgtest.DB, shards string, env ...string) *proc {
	t.Helper()
	bin := exampleApp(t)
	logPath := filepath.Join(t.TempDir(), "worker.log")
	f, err := os.Create(logPath)
	require.NoError(t, err)
	cmd := exec.Command(bin, "worker", "--no-migrate", "--shards", shards)
	cmd.Env = append(os.Environ(),
		"BETTER_COMPUTE_DATABASE_URL="+db.URL,
		"BETTER_COMPUTE_LEASE_TTL=1500ms",
		"BETTER_COMPUTE_LEASE_RENEW=250ms",
		// 50 ms, not 20: several tests run several processes at once, each
		// polling every held queue, on a loaded two-core machine.
		"BETTER_COMPUTE_POLL_INTERVAL=50ms",
		"BETTER_COMPUTE_STOP_GRACE=2s",
		"BETTER_COMPUTE_STATEMENT_TIMEOUT=3s",
		"BETTER_COMPUTE_LOG_FORMAT=json",
	)
	cmd.Env = append(cmd.Env, env...)
	cmd.Stdout, cmd.Stderr = f, f
	require.NoError(t, cmd.Start())
	p := &proc{cmd: cmd, log: logPath, pid: cmd.Process.Pid, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); f.Close(); close(p.done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			lines := strings.Split(string(b), "\n")
			if len(lines) > 40 {
				lines = lines[len(lines)-40:]
			}
			t.Logf("worker %d log (last lines):\n%s", p.pid, strings.Join(lines, "\n"))
		}
	})
	return p
}

// leasesOf counts the unexpired shard leases process p holds.
func leasesOf(t *testing.T, db *pgtest.DB, p *proc) int {
	t.Helper()
	return db.MustCount(t, `SELECT count(*) FROM compute_leases WHERE name LIKE 'shard/%'
		AND owner = $1 AND expires_at > compute_now()`, ownerOf(t, db, p))
}

func change(t *testing.T, db *pgtest.DB, id string, qty int64) {
	t.Helper()
	require.NoError(t, exampleChange(db, id, qty))
}

// midReconcile counts the reconciles in flight: transactions that made the
// example reconcile's UPDATE and sleep (a batch writes no River job to count).
func midReconcile(t *testing.T, db *pgtest.DB) int {
	t.Helper()
	return db.MustCount(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
		AND state = 'idle in transaction' AND query LIKE 'UPDATE example_items SET reconciled_qty%'`)
}

// converged: nothing dirty, and every item reconciled at its latest version.
func converged(t *testing.T, db *pgtest.DB) bool {
	return db.MustCount(t, `SELECT count(*) FROM compute_dirty`) == 0 &&
		db.MustCount(t, `SELECT count(*) FROM example_items WHERE reconciled_version IS DISTINCT FROM version`) == 0
}

// TestProcessKill9Takeover: kill -9 a worker process mid-reconcile; the other
// process takes over its shards, hands back its running jobs, and every dirtied
// key converges; no two reconciles of a key, in either process, overlapped.
func TestProcessKill9Takeover(t *testing.T) {
	t.Parallel()
	db := appDB(t)
	a := startWorker(t, db, "EXAMPLE_RECONCILE_SLEEP=30ms")
	workertest.WaitFor(t, 20*time.Second, "A holds every shard", func() bool { return leasesOf(t, db, a) == 16 })
	b := startWorker(t, db, "EXAMPLE_RECONCILE_SLEEP=30ms")

	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; !stop.Load(); i++ {
			change(t, db, fmt.Sprintf("item-%02d", rand.IntN(40)), int64(i))
			time.Sleep(2 * time.Millisecond)
		}
	}()
	workertest.WaitFor(t, 20*time.Second, "A has reconciled keys and is mid-reconcile", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM example_reconcile_log WHERE worker = $1`, strconv.Itoa(a.pid)) >= 5 &&
			midReconcile(t, db) > 0
	})
	killed := time.Now()
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGKILL))
	workertest.WaitFor(t, 20*time.Second, "B holds every shard", func() bool { return leasesOf(t, db, b) == 16 })
	takeover := time.Since(killed)
	t.Logf("takeover after kill -9: %s (lease TTL 1.5 s)", takeover.Round(time.Millisecond))

	// The writer goes on after the takeover, until B has reconciled every key
	// A reconciled.
	workertest.WaitFor(t, 30*time.Second, "B reconciles every key A reconciled", func() bool {
		return db.MustCount(t, `SELECT count(DISTINCT item_id) FROM example_reconcile_log a WHERE worker = $1
			AND NOT EXISTS (SELECT 1 FROM example_reconcile_log b WHERE b.item_id = a.item_id AND b.worker = $2)`,
			strconv.Itoa(a.pid), strconv.Itoa(b.pid)) == 0
	})
	require.Positive(t, db.MustCount(t, `SELECT count(*) FROM example_reconcile_log WHERE worker = $1`, strconv.Itoa(a.pid)),
		"A reconciled keys before it was killed")
	stop.Store(true)
	wg.Wait()
	workertest.WaitFor(t, 30*time.Second, "every dirtied key converges", func() bool { return converged(t, db) })
	require.Equal(t, 0, db.MustCount(t, `SELECT count(*) FROM river_job WHERE state NOT IN ('completed')`))
	// One at a time across processes: by the reconcile log, no two committed
	// reconciles of one key overlapped in time, whichever process ran them.
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM example_reconcile_log a JOIN example_reconcile_log b
		ON a.item_id = b.item_id AND a.id < b.id AND a.started_at < b.finished_at AND b.started_at < a.finished_at`),
		"two reconciles of one key overlapped")
}

// TestProcessSIGSTOP: a worker that owns every shard is paused past its lease;
// another process takes the shards; on SIGCONT the paused process commits
// nothing, notices its leases lost, stops working the shards' queues, and from
// then on attempts no job: the changes made after that are all reconciled by
// the new holder.
func TestProcessSIGSTOP(t *testing.T) {
	t.Parallel()
	db := appDB(t)
	a := startWorker(t, db, "EXAMPLE_RECONCILE_SLEEP=300ms")
	workertest.WaitFor(t, 20*time.Second, "A holds every shard", func() bool { return leasesOf(t, db, a) == 16 })
	b := startWorker(t, db, "EXAMPLE_RECONCILE_SLEEP=300ms")

	for i := 0; i < 20; i++ {
		change(t, db, fmt.Sprintf("item-%02d", i), 1)
	}
	workertest.WaitFor(t, 20*time.Second, "A is mid-reconcile", func() bool {
		return midReconcile(t, db) > 0
	})
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGSTOP))
	var stoppedAt time.Time
	require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT clock_timestamp()`).Scan(&stoppedAt))

	// B takes over once A's leases expire and A's open transactions are gone
	// (the idle-in-transaction timeout ends a paused session's transaction).
	workertest.WaitFor(t, 30*time.Second, "B holds every shard", func() bool { return leasesOf(t, db, b) == 16 })
	for i := 20; i < 30; i++ {
		change(t, db, fmt.Sprintf("item-%02d", i), 1)
	}
	workertest.WaitFor(t, 30*time.Second, "B reconciles everything", func() bool { return converged(t, db) })

	require.NoError(t, a.cmd.Process.Signal(syscall.SIGCONT))
	// Noticing a lost lease, a process stops working the shard's queue (River
	// removes it, waiting for a fetch in flight); a fetch between the two is
	// fenced. From the last removal on it attempts nothing.
	workertest.WaitFor(t, 30*time.Second, "A wakes, notices every lease lost and stops working every shard queue", func() bool {
		return lostLeases(t, a) == 16 && stoppedQueues(t, a) == 16
	})
	var lastJob int64
	require.NoError(t, db.QueryRow(context.Background(), `SELECT coalesce(max(id), 0) FROM river_job`).Scan(&lastJob))
	// Reconciles (claimed by a shard's holder) and tasks (fetched by River from
	// the shard queues): A takes none of them.
	for i := 0; i < 30; i++ {
		change(t, db, fmt.Sprintf("item-%02d", i), 2)
		require.NoError(t, insertTask(context.Background(), db, fmt.Sprintf("task-%02d", i)))
	}
	workertest.WaitFor(t, 30*time.Second, "converged after SIGCONT", func() bool { return converged(t, db) })
	workertest.WaitFor(t, 30*time.Second, "every task ran", func() bool { return ranExactlyOnce(t, db, 30) })
	require.Equal(t, 30, db.MustCount(t, `SELECT count(*) FROM example_task_runs WHERE worker = $1`, strconv.Itoa(b.pid)),
		"B ran every task, once")

	require.Equal(t, 0, db.MustCount(t, `SELECT count(*) FROM example_reconcile_log
		WHERE worker = $1 AND finished_at > $2`, strconv.Itoa(a.pid), stoppedAt),
		"the paused process committed a reconcile after it was paused")
	require.Equal(t, 0, db.MustCount(t, `SELECT count(*) FROM river_job WHERE id > $1 AND $2 = ANY(attempted_by)`, lastJob, ownerOf(t, db, a)),
		"the woken process attempted a job after it noticed its leases lost")
	require.Equal(t, 30, db.MustCount(t, `SELECT count(DISTINCT item_id) FROM example_reconcile_log WHERE worker = $1 AND seen_version = 1`,
		strconv.Itoa(b.pid)), "B reconciled every change made after A noticed")
	select {
	case <-a.done:
		t.Fatalf("the woken process exited; it should stand by")
	default:
	}
}

// workerLogLine is a line of a worker's JSON log: the fields the tests read.
type workerLogLine struct {
	Time                                 time.Time
	Level, Message, Lease, Queue, Reason string
	Previous                             string `json:"previous_owner"`
	JobID                                int64  `json:"job_id"`
}

// workerLog is every JSON line of the worker log at path.
func workerLog(t testing.TB, path string) []workerLogLine {
	t.Helper()
	log, err := os.ReadFile(path)
	require.NoError(t, err)
	var out []workerLogLine
	for _, l := range strings.Split(string(log), "\n") {
		var rec workerLogLine
		if json.Unmarshal([]byte(l), &rec) == nil {
			out = append(out, rec)
		}
	}
	return out
}

// lostLeases counts the shard leases p's log says it lost (taken by another
// owner, or expired by its own clock without renewal).
func lostLeases(t *testing.T, p *proc) int {
	t.Helper()
	lost := map[string]bool{}
	for _, rec := range workerLog(t, p.log) {
		if strings.HasPrefix(rec.Lease, "shard/") &&
			(rec.Message == "lease lost: another owner took it" || rec.Message == "lease expired without renewal") {
			lost[rec.Lease] = true
		}
	}
	return len(lost)
}

// stoppedQueues counts the shard queues p's log says it stopped working.
func stoppedQueues(t *testing.T, p *proc) int {
	t.Helper()
	stopped := map[string]bool{}
	for _, rec := range workerLog(t, p.log) {
		if strings.HasPrefix(rec.Queue, "shard_") && rec.Message == "stopped working queue" {
			stopped[rec.Queue] = true
		}
	}
	return len(stopped)
}

// envInt reads a whole number from the environment variable name, def when
// it is unset.
func envInt(t testing.TB, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("%s=%q: want a whole number", name, v)
	}
	return n
}

// takeoverRows lists compute_lease_takeovers, one row a line.
func takeoverRows(t testing.TB, db *pgtest.DB) []string {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT format('%s: %s, last at %s (%s from %s to %s)',
		reason, count, last_at, last_lease, last_from, last_to) FROM compute_lease_takeovers ORDER BY reason`)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return out
}

// TestProcessGracefulStop: SIGTERM makes a worker finish its jobs and release its
// leases; the standby takes them over at once, without waiting for them to
// expire. The leases live 20 s, so a takeover by expiry cannot pass for a
// release on a slow machine.
func TestProcessGracefulStop(t *testing.T) {
	t.Parallel()
	db := appDB(t)
	leases := []string{"BETTER_COMPUTE_LEASE_TTL=20s", "BETTER_COMPUTE_LEASE_RENEW=2s"}
	a := startWorker(t, db, leases...)
	workertest.WaitFor(t, 20*time.Second, "A holds every shard", func() bool { return leasesOf(t, db, a) == 16 })
	b := startWorker(t, db, leases...)
	for i := 0; i < 10; i++ {
		change(t, db, fmt.Sprintf("item-%02d", i), 1)
	}
	workertest.WaitFor(t, 20*time.Second, "A reconciles", func() bool { return converged(t, db) })

	var lastExpiry time.Time
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		`SELECT max(expires_at) FROM compute_leases WHERE name LIKE 'shard/%'`).Scan(&lastExpiry))
	termAt := time.Now()
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGTERM))
	workertest.WaitFor(t, 60*time.Second, "B holds every shard", func() bool { return leasesOf(t, db, b) == 16 })
	t.Logf("takeover after SIGTERM: %s", time.Since(termAt).Round(time.Millisecond))

	// A released its leases: B took each before A's last expiry would have let it.
	require.Equal(t, 16, db.MustCount(t, `SELECT count(*) FROM compute_leases
		WHERE name LIKE 'shard/%' AND acquired_at < $1`, lastExpiry),
		"B must not have waited for A's leases to expire")
	b2, _ := os.ReadFile(a.log)
	require.Contains(t, string(b2), "leases released")
	require.Contains(t, string(b2), "worker stopped")
	for i := 0; i < 10; i++ {
		change(t, db, fmt.Sprintf("item-%02d", i), 2)
	}
	workertest.WaitFor(t, 20*time.Second, "B reconciles", func() bool { return converged(t, db) })
}

// keysInOwnShards returns n keys starting with prefix, each in a shard of its
// own (of 16) that none of taken uses, and marks their shards taken.
func keysInOwnShards(prefix string, n int, taken map[int]bool) []string {
	var out []string
	for i := 0; len(out) < n; i++ {
		k := fmt.Sprintf("%s%02d", prefix, i)
		if s := jobs.ShardOf(k, 16); !taken[s] {
			taken[s] = true
			out = append(out, k)
		}
	}
	return out
}

// TestProcessSIGTERMMidReconcile: SIGTERM reaches a worker while reconciles are
// in flight. Those that fit in its stop grace finish and commit in it; those
// that outlive the grace are cancelled and roll back, and the standby
// takes their keys and finishes them. Each key is reconciled exactly once
// (the reconcile log is the database's record), and no two reconciles of a key
// overlapped.
func TestProcessSIGTERMMidReconcile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := appDB(t)
	// Leases with room: nothing here waits for an expiry.
	leases := []string{"BETTER_COMPUTE_LEASE_TTL=10s", "BETTER_COMPUTE_LEASE_RENEW=1s"}
	// A: short reconciles take 2 s, long ones a minute; the grace is 6 s.
	a := startWorker(t, db, append(leases, "BETTER_COMPUTE_STOP_GRACE=6s",
		"EXAMPLE_RECONCILE_SLEEP=2s", "EXAMPLE_RECONCILE_SLOW=1m")...)
	workertest.WaitFor(t, 30*time.Second, "A holds every shard", func() bool { return leasesOf(t, db, a) == 16 })
	b := startWorker(t, db, append(leases, "EXAMPLE_RECONCILE_SLEEP=10ms", "EXAMPLE_RECONCILE_SLOW=10ms")...)
	require.Zero(t, leasesOf(t, db, b), "B stands by")

	// Each key in a shard of its own, so each is a batch of its own.
	taken := map[int]bool{}
	slow, fast := keysInOwnShards("slow-", 3, taken), keysInOwnShards("fast-", 3, taken)
	inFlight := func() int { return midReconcile(t, db) }
	for _, k := range slow {
		change(t, db, k, 1)
	}
	workertest.WaitFor(t, 30*time.Second, "A runs the slow reconciles", func() bool { return inFlight() == 3 })
	for _, k := range fast {
		change(t, db, k, 1)
	}
	workertest.WaitFor(t, 30*time.Second, "A runs the fast reconciles too", func() bool { return inFlight() == 6 })
	termAt := dbNow(t, db)
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGTERM))
	code, log := exitedWith(t, a, 60*time.Second)
	require.Equal(t, 0, code, log)
	require.Contains(t, log, "grace period over: cancelling in-flight jobs")
	workertest.WaitFor(t, 30*time.Second, "every key converges", func() bool { return converged(t, db) })
	var record string
	require.NoError(t, db.QueryRow(ctx, `SELECT string_agg(format('%s by %s from %s to %s', item_id, worker, started_at - $1, finished_at - $1), '; ' ORDER BY id)
		FROM example_reconcile_log`, termAt).Scan(&record))
	t.Logf("reconciles, from SIGTERM (A is %d, B %d): %s", a.pid, b.pid, record)
	for _, k := range fast {
		require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM example_reconcile_log WHERE item_id = $1
			AND worker = $2 AND started_at < $3 AND finished_at > $3`, k, strconv.Itoa(a.pid), termAt),
			"%s: in flight at SIGTERM, it fits in the grace: A finishes and commits it", k)
	}
	for _, k := range slow {
		require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM example_reconcile_log WHERE item_id = $1 AND worker = $2`,
			k, strconv.Itoa(b.pid)), "%s: it outlives the grace: B finishes it", k)
	}
	require.Equal(t, 6, db.MustCount(t, `SELECT count(*) FROM example_reconcile_log`), "each key reconciled exactly once")
	// A's cancelled batches rolled back whole: nothing to hand back, B took
	// their keys in its own batches.
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM river_job`),
		"no River job: a batch writes none, and no key became its own (failing) job")
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM example_reconcile_log a JOIN example_reconcile_log b
		ON a.item_id = b.item_id AND a.id < b.id AND a.started_at < b.finished_at AND b.started_at < a.finished_at`),
		"two reconciles of one key overlapped")
}
