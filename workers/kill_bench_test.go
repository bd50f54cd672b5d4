package workers_test

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
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
	"github.com/bettercompute/bettercompute/workers/workertest"
)

// BenchmarkPickupThroughKills measures pickup latency through repeated kill -9
// of the worker process, each replacement started under a NEW worker identity
// (the case a lease TTL alone handles worst: a new identity cannot claim the
// dead one's leases as its restart, so before heartbeat liveness it waited out
// the whole 15 s TTL), beside plain River killed and restarted the same way.
//
// Ours is the example application (testdata/exampleapp) as real worker
// processes serving all 16 shards, with the production lease timings
// (BETTER_COMPUTE_LEASE_TTL=15s, BETTER_COMPUTE_LEASE_RENEW=5s) and the default
// heartbeat (500 ms, 4 missed beats: dead after 2 s; a BETTER_COMPUTE_HEARTBEAT
// or _MISSED_BEATS in the environment passes through). Its jobs are the
// application's fenced example_task, each in its id's shard queue. River is
// testdata/riverapp: one River client, one queue, a worker that inserts one row
// (no shards, no leases, River's defaults otherwise, so its rescuer retries a
// killed process's running jobs after an hour). Both sides are poll-only at
// the same interval (50 ms; FetchCooldown min(poll, 5 ms) on both, as the
// worker runtime sets it; ours uses no LISTEN/NOTIFY, for PgBouncer), with 8
// workers per queue, and each is fed by a producer at the same steady rate (50
// jobs/s, one insert per tick in a goroutine of its own, so a slow insert does
// not lower the rate; pg.InTx + jobs.InsertTx on both sides, ours after
// jobs.ShardQueueOfTx). Each side runs on a fresh database of its own, ours
// first, then River, so they never compete for the machine.
//
// Sub-benchmarks:
//
//   - standby: two processes of different identities, a holder and a standby.
//     Each round kills -9 the holder; the standby takes over (ours: every
//     shard lease; River: it simply goes on fetching); then a fresh standby is
//     started under a new identity (kill-bench-N). The hot standby on another
//     host.
//   - replacement: one process. Each round kills -9 it and at once starts a
//     replacement under a new identity: a Kubernetes Deployment's replaced pod.
//
// A round comes every BETTER_COMPUTE_KILL_EVERY (default 8 s, plus 0–500 ms of
// jitter so the kill falls anywhere in a heartbeat), BETTER_COMPUTE_KILL_ROUNDS
// times (default 8); the producer runs from one interval before the first kill
// to one after the last: 72 s of load per side by default, so a sub-benchmark
// takes about 2.5 minutes. BETTER_COMPUTE_KILL_RATE sets the jobs/s (default
// 50), BETTER_COMPUTE_KILL_POLL both sides' poll interval, and
// BETTER_COMPUTE_KILL_LOGS a directory to keep every process's log in.
//
// Pickup latency of a job is the attempted_at of the attempt that completed
// it minus its created_at, both from the database's clock (now() of the fetch's
// and of the insert's transaction), on both sides. A job inserted while no
// process works its queue counts its whole wait; a job of ours that the killed
// process had fetched counts from its insert to the fetch that completed it,
// after the takeover handed it back (stricter than its first fetch). River's
// jobs that a killed process had fetched stay running until River's rescuer
// (an hour); they are left out of River's latencies, which they would
// dominate, and counted as river_stuck_jobs (river_stuck_ran of them had
// already written their row: a rescue would run them twice).
//
// Per round it measures ours' takeover: from the kill to all 16 shard leases
// held, unexpired, by the new owner (compute_leases polled every 20 ms); and,
// from the new owner's log, the kill to its working every shard's queue (it
// adds the queues to River one after another once it holds their leases). A
// monitor counts each side's available jobs every 20 ms (the backlog). It
// reports ours_p50_ms, ours_p99_ms, ours_max_ms, the same of River,
// ours/river_p50, ours/river_p99, takeover_p50_ms, takeover_max_ms,
// queues_worked_p50_ms, queues_worked_max_ms, ours_backlog_max and
// river_backlog_max (the most jobs available but not fetched at once),
// ours_handed_back (jobs of ours a takeover handed back: their errors say so),
// river_stuck_jobs, river_stuck_ran, lease_expired_takeovers (lease takeovers
// that waited for the TTL, by compute_lease_takeovers), kills, and for
// replacement river_restart_p50_ms (the kill to the new River process's first
// fetch). River has no takeover: its p99 is its poll interval and its process
// start, while ours' includes the heartbeat deadline (dead after 2 s).
//
// The testing package cuts a benchmark's log to 10 lines, so a table per side
// goes to stdout: per round, the takeover, the jobs the killed process was
// running and what became of them, and the backlog and pickup of the jobs
// inserted from that kill to the next; then the insert call and fetch →
// completed times, the takeovers by reason, and the machine's load average
// (on a busy machine the figures are indicative). It fails unless every job
// of ours completed and its fenced write is recorded exactly once
// (example_task_runs), and unless every job of River's completed or is stuck
// in a killed process.
//
//	go test -run '^$' -bench 'PickupThroughKills' -benchtime 1x -timeout 20m ./workers/
//	BETTER_COMPUTE_KILL_ROUNDS=3 BETTER_COMPUTE_KILL_EVERY=6s go test -run '^$' -bench 'PickupThroughKills/standby' -benchtime 1x ./workers/
func BenchmarkPickupThroughKills(b *testing.B) {
	cfg := killConfig{
		rounds: envInt(b, "BETTER_COMPUTE_KILL_ROUNDS", 8),
		every:  envDuration(b, "BETTER_COMPUTE_KILL_EVERY", 8*time.Second),
		rate:   envInt(b, "BETTER_COMPUTE_KILL_RATE", 50),
		poll:   envDuration(b, "BETTER_COMPUTE_KILL_POLL", 50*time.Millisecond),
		logs:   os.Getenv("BETTER_COMPUTE_KILL_LOGS"),
	}
	if cfg.logs != "" {
		require.NoError(b, os.MkdirAll(cfg.logs, 0o755))
	}
	require.Positive(b, cfg.rounds, "BETTER_COMPUTE_KILL_ROUNDS")
	require.Positive(b, cfg.rate, "BETTER_COMPUTE_KILL_RATE")
	require.GreaterOrEqual(b, cfg.every, 3*time.Second, "BETTER_COMPUTE_KILL_EVERY: a round must leave room for a takeover")
	// Built once, for both sub-benchmarks, into a directory removed at the end.
	dir := b.TempDir()
	cfg.ourBin = buildForBench(b, "testdata/exampleapp", dir)
	cfg.riverBin = buildForBench(b, "testdata/riverapp", dir)
	for _, standby := range []bool{true, false} {
		name := map[bool]string{true: "standby", false: "replacement"}[standby]
		b.Run(name, func(b *testing.B) {
			var ours, peer killResult
			for i := 0; i < b.N; i++ {
				ours.add(runKills(b, cfg, standby, false))
				peer.add(runKills(b, cfg, standby, true))
			}
			reportKills(b, cfg, standby, &ours, &peer)
		})
	}
}

type killConfig struct {
	rounds           int
	every            time.Duration
	rate             int
	poll             time.Duration
	ourBin, riverBin string
	logs             string // keep the processes' logs there ("": a temporary directory)
}

const (
	killRiverQueue = "kill_river"
	killIdentity   = "kill-bench-" // + a number: a new identity per process
	killPollEvery  = 20 * time.Millisecond
	killReadyWait  = 60 * time.Second
	killTakeover   = 60 * time.Second // far past the TTL: a takeover that never comes fails
	killDrain      = 90 * time.Second
)

// killRiverArgs are testdata/riverapp's job arguments.
type killRiverArgs struct {
	ID string `json:"id"`
}

func (killRiverArgs) Kind() string { return "kill_river" }

// killResult is one side's figures, over one run or several.
type killResult struct {
	latencies  []time.Duration // completed jobs, insert → the fetch that completed them
	takeovers  []time.Duration // ours: kill → every shard held by the new owner
	working    []time.Duration // ours: kill → every shard's queue worked by the new owner
	restarts   []time.Duration // River, replacement: kill → the new process's first fetch
	backlogMax int
	handedBack int // ours: jobs a takeover (or a lease round) handed back
	stuck      int // River: jobs left running by a killed process
	stuckRan   int // of those, the ones whose row was written
	expired    int // ours: lease takeovers that waited for the TTL
	kills      int
}

func (r *killResult) add(o killResult) {
	r.latencies = append(r.latencies, o.latencies...)
	r.takeovers = append(r.takeovers, o.takeovers...)
	r.working = append(r.working, o.working...)
	r.restarts = append(r.restarts, o.restarts...)
	r.backlogMax = max(r.backlogMax, o.backlogMax)
	r.handedBack += o.handedBack
	r.stuck += o.stuck
	r.stuckRan += o.stuckRan
	r.expired += o.expired
	r.kills += o.kills
}

// killProc is one worker process of either side.
type killProc struct {
	*proc
	id string // ours: its identity (its owner is proc.owner); River: its client id
}

// killRound is what one kill did.
type killRound struct {
	victim, next string    // the killed process's owner or id, and the one that works on
	at           time.Time // the kill, by the database's clock
	running      []int64   // the victim's running jobs just after the kill
	fate         string    // what became of them
	killed       time.Time // the kill, by this process's clock
	nextLog      string    // the log of the process that works on
	takeover     time.Duration
	working      time.Duration // ours: kill → the new owner works every shard's queue (its log)
	reasons      string        // ours: why the new owner could take the shards (its log)
}

// runKills runs one side (ours, or River when isRiver is set) of one scenario on
// a fresh database and returns its figures.
func runKills(b *testing.B, cfg killConfig, standby, isRiver bool) killResult {
	ctx := context.Background()
	side := map[bool]string{false: "ours", true: "river"}[isRiver]
	db, kind := killDB(b, cfg, isRiver)

	var seq int
	var live []*killProc
	defer func() {
		for _, p := range live {
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}()
	// start starts the next process and waits until it works (the first) or
	// stands by (ours: its heartbeat is recorded; River: its client started).
	start := func(holder bool) *killProc {
		seq++
		p := startKillProc(b, cfg, db, isRiver, seq)
		live = append(live, p)
		switch {
		case isRiver:
			workertest.WaitFor(b, killReadyWait, p.id+" started", func() bool {
				log, _ := os.ReadFile(p.log)
				return strings.Contains(string(log), "riverapp started")
			})
		case holder:
			workertest.WaitFor(b, killReadyWait, p.id+" holds every shard", func() bool { return heldShards(b, db, p.id) == 16 })
		default:
			workertest.WaitFor(b, killReadyWait, p.id+" beats", func() bool { return killOwner(b, db, p) != "" })
		}
		killOwner(b, db, p)
		return p
	}
	start(true)
	if standby {
		start(false)
	}

	loadBefore := loadAverage()
	mon := startBacklogMonitor(db, kind)
	defer mon.stop()
	prod := startKillProducer(db, cfg.rate, isRiver)
	defer prod.stop()
	t0 := time.Now()

	var rounds []killRound
	for k := 1; k <= cfg.rounds; k++ {
		time.Sleep(time.Until(t0.Add(time.Duration(k)*cfg.every + time.Duration(rand.IntN(500))*time.Millisecond)))
		victim := live[0]
		r := killRound{victim: victim.owner}
		require.NoError(b, db.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&r.at))
		killed := time.Now()
		require.NoError(b, victim.cmd.Process.Signal(syscall.SIGKILL))
		<-victim.done
		live = live[1:]
		r.running = runningOf(b, db, kind, victim.owner)
		var next *killProc
		switch {
		case isRiver:
			next = start(true)
		case standby:
			next = live[0]
			r.takeover = waitTakeover(b, db, next, victim, killed)
			start(false)
		default:
			next = start(false) // a new identity: it can take the shards only once the victim is dead to all
			r.takeover = waitTakeover(b, db, next, victim, killed)
		}
		r.next, r.nextLog, r.killed = next.owner, next.log, killed
		if !isRiver {
			r.reasons = takeoverReasons(b, next, victim.owner)
		}
		rounds = append(rounds, r)
	}
	time.Sleep(time.Until(t0.Add(time.Duration(cfg.rounds+1) * cfg.every)))
	inserted, err := prod.stop()
	require.NoError(b, err, "%s: an insert failed", side)
	stoppedAt := time.Now()

	// Drained: every job completed, or (River) left running by a killed
	// process. Ours waits for every job: the takeovers handed theirs back.
	killedIDs := []string{}
	if isRiver {
		for _, r := range rounds {
			killedIDs = append(killedIDs, r.victim)
		}
	}
	workertest.WaitFor(b, killDrain, side+": every job completed (or stuck in a killed River process)", func() bool {
		return db.MustCount(b, `SELECT count(*) FROM river_job WHERE kind = $1 AND state <> 'completed'
			AND NOT (state = 'running' AND attempted_by[array_length(attempted_by, 1)] = ANY($2))`, kind, killedIDs) == 0
	})
	drained := time.Since(stoppedAt)
	backlog := mon.stop()

	res := killResult{backlogMax: backlog.max, kills: len(rounds)}
	for _, r := range rounds {
		if r.takeover > 0 {
			res.takeovers = append(res.takeovers, r.takeover)
		}
	}
	done := completedJobs(b, db, kind)
	for _, j := range done {
		res.latencies = append(res.latencies, j.latency())
	}
	for i := range rounds {
		rounds[i].fate = fateOf(b, db, rounds[i].running)
		if !isRiver {
			rounds[i].working = queuesWorked(b, rounds[i].nextLog, rounds[i].killed)
			if rounds[i].working > 0 {
				res.working = append(res.working, rounds[i].working)
			}
		}
	}
	res.handedBack = db.MustCount(b, `SELECT count(*) FROM river_job WHERE kind = $1
		AND EXISTS (SELECT 1 FROM unnest(errors) e WHERE e->>'error' LIKE 'handed back by %')`, kind)
	if isRiver {
		res.stuck = db.MustCount(b, `SELECT count(*) FROM river_job WHERE kind = $1 AND state = 'running'`, kind)
		res.stuckRan = db.MustCount(b, `SELECT count(*) FROM river_job j WHERE kind = $1 AND state = 'running'
			AND EXISTS (SELECT 1 FROM kill_river_runs r WHERE r.job_id = j.id)`, kind)
		if !standby {
			for _, r := range rounds {
				var first *time.Time
				require.NoError(b, db.QueryRow(ctx, `SELECT min(attempted_at) FROM river_job WHERE kind = $1 AND attempted_by[1] = $2`,
					kind, r.next).Scan(&first))
				if first != nil {
					res.restarts = append(res.restarts, first.Sub(r.at))
				}
			}
		}
		require.Equal(b, inserted, len(done)+res.stuck, "river: jobs neither completed nor stuck in a killed process")
	} else {
		res.expired = db.MustCount(b, `SELECT coalesce(sum(count), 0) FROM compute_lease_takeovers WHERE reason = 'lease_expired'`)
		requireKillRunsOnce(b, db, inserted)
	}
	logKillRounds(b, side, standby, rounds, done, backlog, res, inserted, drained, prod.took)
	logLong(b, fmt.Sprintf("%s: load average (1 min) %s at the start, %s at the end, on %d cores: figures from a loaded machine are indicative",
		side, loadBefore, loadAverage(), runtime.NumCPU()))
	if !isRiver {
		logLong(b, fmt.Sprintf("%s: shard takeovers by reason (compute_lease_takeovers): %s", side, takeoverCounts(b, db)))
	}
	return res
}

// killDB is a fresh database: ours migrated by the example application, River's
// by riverapp (River's own migrations).
func killDB(b *testing.B, cfg killConfig, isRiver bool) (*pgtest.DB, string) {
	db := pgtest.New(b, pgtest.Options{Empty: true, MaxConns: 20})
	var cmd *exec.Cmd
	if isRiver {
		cmd = exec.Command(cfg.riverBin, "migrate")
		cmd.Env = append(os.Environ(), "RIVERAPP_DATABASE_URL="+db.URL)
	} else {
		cmd = exec.Command(cfg.ourBin, "migrate", "--database-url", db.URL, "--log-level", "warn")
	}
	out, err := cmd.CombinedOutput()
	require.NoError(b, err, "%s", out)
	if isRiver {
		return db, "kill_river"
	}
	return db, "example_task"
}

// buildForBench builds the program in pkg (relative to the module root) into dir.
func buildForBench(b *testing.B, pkg, dir string) string {
	bin := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", bin, "./"+pkg)
	cmd.Dir = ".."
	out, err := cmd.CombinedOutput()
	require.NoError(b, err, "go build %s:\n%s", pkg, out)
	return bin
}

// startKillProc starts worker process number n of a side, under identity (or
// River client id) kill-bench-n; the benchmark's cleanup kills it, and on a
// failure shows the end of its log.
func startKillProc(b *testing.B, cfg killConfig, db *pgtest.DB, isRiver bool, n int) *killProc {
	id := killIdentity + strconv.Itoa(n)
	if isRiver {
		id = killIdentity + "river-" + strconv.Itoa(n)
	}
	dir := cfg.logs
	if dir == "" {
		dir = b.TempDir()
	}
	logPath := filepath.Join(dir, db.Name+"-"+id+".log") // the database's name is the run's
	f, err := os.Create(logPath)
	require.NoError(b, err)
	var cmd *exec.Cmd
	if isRiver {
		cmd = exec.Command(cfg.riverBin, "work")
		cmd.Env = append(os.Environ(), "RIVERAPP_DATABASE_URL="+db.URL, "RIVERAPP_ID="+id,
			"RIVERAPP_QUEUE="+killRiverQueue, "RIVERAPP_POLL="+cfg.poll.String(), "RIVERAPP_WORKERS=8")
	} else {
		cmd = exec.Command(cfg.ourBin, "worker", "--no-migrate", "--shards", "all")
		cmd.Env = append(os.Environ(),
			"BETTER_COMPUTE_DATABASE_URL="+db.URL,
			"BETTER_COMPUTE_WORKER_ID="+id,
			// The production lease timings: a takeover that waited out the TTL
			// would show as 15 s.
			"BETTER_COMPUTE_LEASE_TTL=15s",
			"BETTER_COMPUTE_LEASE_RENEW=5s",
			"BETTER_COMPUTE_POLL_INTERVAL="+cfg.poll.String(),
			"BETTER_COMPUTE_WORKERS_PER_SHARD=8",
			"BETTER_COMPUTE_LOG_FORMAT=json",
		)
	}
	cmd.Stdout, cmd.Stderr = f, f
	require.NoError(b, cmd.Start())
	p := &killProc{proc: &proc{cmd: cmd, log: logPath, pid: cmd.Process.Pid, done: make(chan struct{})}, id: id}
	if isRiver {
		p.owner = id
	}
	go func() { _ = cmd.Wait(); f.Close(); close(p.done) }()
	b.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
		if b.Failed() {
			log, _ := os.ReadFile(logPath)
			lines := strings.Split(strings.TrimRight(string(log), "\n"), "\n")
			if len(lines) > 30 {
				lines = lines[len(lines)-30:]
			}
			logLong(b, fmt.Sprintf("%s (pid %d) log, last lines:\n%s", id, p.pid, strings.Join(lines, "\n")))
		}
	})
	return p
}

// killOwner is p's lease owner (IDENTITY#N) once its identity is claimed, else "".
func killOwner(b *testing.B, db *pgtest.DB, p *killProc) string {
	if p.owner == "" {
		require.NoError(b, db.QueryRow(context.Background(), `SELECT coalesce(max(identity || '#' || incarnation), '')
			FROM compute_workers WHERE identity = $1`, p.id).Scan(&p.owner))
	}
	return p.owner
}

// runningOf are the ids of kind's jobs running in owner's name.
func runningOf(b *testing.B, db *pgtest.DB, kind, owner string) []int64 {
	rows, err := db.Query(context.Background(), `SELECT id FROM river_job WHERE kind = $1 AND state = 'running'
		AND attempted_by[array_length(attempted_by, 1)] = $2 ORDER BY id`, kind, owner)
	require.NoError(b, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(b, err)
	return ids
}

// fateOf says what became of jobs a killed process was running: how many
// completed (after a hand-back, and how many attempts that took), and how many
// are still running in its name (stuck).
func fateOf(b *testing.B, db *pgtest.DB, ids []int64) string {
	if len(ids) == 0 {
		return ""
	}
	var completed, handed, stuck, maxAttempt int
	require.NoError(b, db.QueryRow(context.Background(), `SELECT
		count(*) FILTER (WHERE state = 'completed'),
		count(*) FILTER (WHERE EXISTS (SELECT 1 FROM unnest(errors) e WHERE e->>'error' LIKE 'handed back by %')),
		count(*) FILTER (WHERE state = 'running'),
		coalesce(max(attempt), 0)
		FROM river_job WHERE id = ANY($1)`, ids).Scan(&completed, &handed, &stuck, &maxAttempt))
	return fmt.Sprintf("%d completed (%d handed back, attempts ≤ %d), %d stuck", completed, handed, maxAttempt, stuck)
}

// heldShards counts the shard leases identity's current incarnation holds unexpired.
func heldShards(b *testing.B, db *pgtest.DB, identity string) int {
	return db.MustCount(b, `SELECT count(*) FROM compute_leases l
		JOIN compute_workers w ON l.owner = w.identity || '#' || w.incarnation
		WHERE w.identity = $1 AND l.name LIKE 'shard/%' AND l.expires_at > compute_now()`, identity)
}

// waitTakeover polls until next holds every shard and returns the time from
// the kill; a takeover that has not come long past the lease TTL fails.
func waitTakeover(b *testing.B, db *pgtest.DB, next, victim *killProc, killed time.Time) time.Duration {
	deadline := killed.Add(killTakeover)
	for heldShards(b, db, next.id) < 16 {
		if time.Now().After(deadline) {
			b.Fatalf("%s took the shards of %s killed %s ago: not yet (held: %d); its log says: %s", next.id, victim.owner,
				time.Since(killed).Round(time.Millisecond), heldShards(b, db, next.id), leaseLogLines(next.log, 20))
		}
		time.Sleep(killPollEvery)
	}
	d := time.Since(killed)
	killOwner(b, db, next)
	if d > 10*time.Second {
		logLong(b, fmt.Sprintf("SLOW TAKEOVER: %s took %s's shards %s after the kill; its lease log:\n%s",
			next.owner, victim.owner, d.Round(time.Millisecond), leaseLogLines(next.log, 40)))
	}
	return d
}

// leaseLogLines are the last n lines of a worker's log about leases or its start.
func leaseLogLines(path string, n int) string {
	log, _ := os.ReadFile(path)
	var out []string
	for _, l := range strings.Split(string(log), "\n") {
		if strings.Contains(l, `"lease`) || strings.Contains(l, "worker started") || strings.Contains(l, "heartbeat") {
			out = append(out, l)
		}
	}
	if len(out) > n {
		out = out[len(out)-n:]
	}
	return strings.Join(out, "\n")
}

// takeoverReasons reads, in the new owner's log, why it could take each shard
// from the victim ("heartbeat_lost×16").
func takeoverReasons(b *testing.B, next *killProc, victim string) string {
	counts := map[string]int{}
	for _, rec := range workerLog(b, next.log) {
		if rec.Message == "lease acquired" && strings.HasPrefix(rec.Lease, "shard/") && rec.Previous == victim {
			counts[rec.Reason]++
		}
	}
	var parts []string
	for r, n := range counts {
		parts = append(parts, fmt.Sprintf("%s×%d", r, n))
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}

// queuesWorked is the time from killed until the worker whose log is at path
// worked every shard's queue (its "working queue" lines), 0 if it never did.
func queuesWorked(b *testing.B, path string, killed time.Time) time.Duration {
	seen := map[string]bool{}
	for _, rec := range workerLog(b, path) {
		if rec.Message == "working queue" && strings.HasPrefix(rec.Queue, "shard_") && rec.Time.After(killed) {
			seen[rec.Queue] = true
			if len(seen) == 16 {
				return rec.Time.Sub(killed)
			}
		}
	}
	return 0
}

// takeoverCounts is compute_lease_takeovers, one row after another.
func takeoverCounts(b *testing.B, db *pgtest.DB) string {
	out := takeoverRows(b, db)
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, "; ")
}

// killProducer inserts jobs at a steady rate until stopped: one insert per
// tick, each in a goroutine of its own (at most killInFlight at once), so a
// slow insert does not lower the rate offered.
type killProducer struct {
	halt     chan struct{}
	done     chan struct{}
	once     sync.Once
	inserted atomic.Int64
	mu       sync.Mutex
	err      error
	took     []time.Duration // each insert's call
}

const killInFlight = 32

func startKillProducer(db *pgtest.DB, rate int, isRiver bool) *killProducer {
	p := &killProducer{halt: make(chan struct{}), done: make(chan struct{})}
	insert := func(i int) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		id := fmt.Sprintf("kill-%06d", i)
		began := time.Now()
		var err error
		if isRiver {
			err = pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
				_, err := jobs.InsertTx(ctx, tx, killRiverArgs{ID: id}, &river.InsertOpts{Queue: killRiverQueue})
				return err
			})
		} else {
			err = insertTask(ctx, db, id) // its shard's queue, as the application does
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		p.took = append(p.took, time.Since(began))
		if err != nil {
			p.err = cmp.Or(p.err, fmt.Errorf("insert %s: %w", id, err))
			return
		}
		p.inserted.Add(1)
	}
	go func() {
		defer close(p.done)
		var wg sync.WaitGroup
		defer wg.Wait()
		slots := make(chan struct{}, killInFlight)
		start := time.Now()
		for i := 0; ; i++ {
			select {
			case <-p.halt:
				return
			case <-time.After(time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(rate)))):
			}
			slots <- struct{}{}
			wg.Go(func() {
				defer func() { <-slots }()
				insert(i)
			})
		}
	}()
	return p
}

// stop stops the producer and returns how many it inserted and its first error.
func (p *killProducer) stop() (int, error) {
	p.once.Do(func() { close(p.halt) })
	<-p.done
	return int(p.inserted.Load()), p.err
}

// backlogMonitor counts a kind's available jobs every killPollEvery.
type backlogMonitor struct {
	halt    chan struct{}
	done    chan struct{}
	once    sync.Once
	samples []backlogSample
	max     int
}

type backlogSample struct {
	at time.Time // the database's clock
	n  int
}

func startBacklogMonitor(db *pgtest.DB, kind string) *backlogMonitor {
	m := &backlogMonitor{halt: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(m.done)
		tick := time.NewTicker(killPollEvery)
		defer tick.Stop()
		for {
			var s backlogSample
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			err := db.QueryRow(ctx, `SELECT clock_timestamp(), count(*) FROM river_job WHERE kind = $1 AND state = 'available'`,
				kind).Scan(&s.at, &s.n)
			cancel()
			if err == nil {
				m.samples = append(m.samples, s)
				m.max = max(m.max, s.n)
			}
			select {
			case <-m.halt:
				return
			case <-tick.C:
			}
		}
	}()
	return m
}

// stop stops the monitor and returns it, its samples complete.
func (m *backlogMonitor) stop() *backlogMonitor {
	m.once.Do(func() { close(m.halt) })
	<-m.done
	return m
}

// maxBetween is the largest backlog sampled in [from, to).
func (m *backlogMonitor) maxBetween(from, to time.Time) int {
	n := 0
	for _, s := range m.samples {
		if !s.at.Before(from) && s.at.Before(to) {
			n = max(n, s.n)
		}
	}
	return n
}

// killJob is a completed job: its insert and the fetch that completed it, by
// the database's clock.
type killJob struct {
	created, fetched, finalized time.Time
	attempt                     int
}

func (j killJob) latency() time.Duration { return j.fetched.Sub(j.created) }

func completedJobs(b *testing.B, db *pgtest.DB, kind string) []killJob {
	rows, err := db.Query(context.Background(), `SELECT created_at, attempted_at, finalized_at, attempt FROM river_job
		WHERE kind = $1 AND state = 'completed' ORDER BY created_at`, kind)
	require.NoError(b, err)
	var out []killJob
	for rows.Next() {
		var j killJob
		require.NoError(b, rows.Scan(&j.created, &j.fetched, &j.finalized, &j.attempt))
		out = append(out, j)
	}
	require.NoError(b, rows.Err())
	return out
}

// requireKillRunsOnce: every task of ours inserted completed, and its fenced
// write is recorded exactly once.
func requireKillRunsOnce(b *testing.B, db *pgtest.DB, inserted int) {
	var runs, tasks, completed int
	require.NoError(b, db.QueryRow(context.Background(), `SELECT count(*), count(DISTINCT task_id) FROM example_task_runs`).Scan(&runs, &tasks))
	completed = db.MustCount(b, `SELECT count(*) FROM river_job WHERE kind = 'example_task' AND state = 'completed'`)
	require.Equal(b, inserted, tasks, "ours: tasks whose fenced write is recorded, of %d inserted", inserted)
	require.Equal(b, inserted, runs, "ours: fenced writes recorded (a task ran twice?), of %d inserted", inserted)
	require.Equal(b, inserted, completed, "ours: jobs completed, of %d inserted", inserted)
}

// logKillRounds prints the run's table, a line per round: the pickup of the
// jobs inserted from that kill to the next.
func logKillRounds(b *testing.B, side string, standby bool, rounds []killRound, done []killJob, mon *backlogMonitor,
	res killResult, inserted int, drained time.Duration, took []time.Duration) {
	var sb strings.Builder
	fmt.Fprintf(&sb, "%s, %s: %d jobs inserted, %d kills; drained %s after the producer stopped\n",
		side, map[bool]string{true: "standby", false: "replacement"}[standby], inserted, len(rounds), drained.Round(time.Millisecond))
	fmt.Fprintf(&sb, "%5s %-22s %-22s %10s %9s %8s %8s %6s %8s %8s %8s  %s\n", "round", "killed", "works on", "takeoverms",
		"workingms", "running", "backlog", "jobs", "p50ms", "p99ms", "maxms", "takeover reasons; the jobs running at the kill")
	bounds := make([]time.Time, 0, len(rounds)+2)
	bounds = append(bounds, time.Time{})
	for _, r := range rounds {
		bounds = append(bounds, r.at)
	}
	bounds = append(bounds, time.Now().Add(time.Hour))
	for i := 0; i+1 < len(bounds); i++ {
		from, to := bounds[i], bounds[i+1]
		var lat []time.Duration
		for _, j := range done {
			if !j.created.Before(from) && j.created.Before(to) {
				lat = append(lat, j.latency())
			}
		}
		label, killed, next, takeover, working, running, reasons := "before", "", "", "", "", "", ""
		if i > 0 {
			r := rounds[i-1]
			label, killed, next, running, reasons = strconv.Itoa(i), r.victim, r.next, strconv.Itoa(len(r.running)), r.reasons
			if r.takeover > 0 {
				takeover = strconv.FormatInt(r.takeover.Milliseconds(), 10)
			}
			if r.working > 0 {
				working = strconv.FormatInt(r.working.Milliseconds(), 10)
			}
			if r.fate != "" {
				reasons += "; " + r.fate
			}
		}
		fmt.Fprintf(&sb, "%5s %-22s %-22s %10s %9s %8s %8d %6d %8.1f %8.1f %8.1f  %s\n", label, killed, next, takeover, working, running,
			mon.maxBetween(from, to), len(lat), ms(percentile(lat, .5)), ms(percentile(lat, .99)), ms(percentile(lat, 1)), reasons)
	}
	fmt.Fprintf(&sb, "all: p50 %.1f ms, p99 %.1f ms, max %.1f ms (n=%d); backlog max %d; handed back %d",
		ms(percentile(res.latencies, .5)), ms(percentile(res.latencies, .99)), ms(percentile(res.latencies, 1)),
		len(res.latencies), res.backlogMax, res.handedBack)
	if side == "river" {
		fmt.Fprintf(&sb, "; stuck in killed processes %d (of which %d had written their row)", res.stuck, res.stuckRan)
	}
	var run []time.Duration
	for _, j := range done {
		run = append(run, j.finalized.Sub(j.fetched))
	}
	fmt.Fprintf(&sb, "\ninsert call p50 %.1f ms, p99 %.1f ms, max %.1f ms; fetch → completed p50 %.1f ms, p99 %.1f ms, max %.1f ms",
		ms(percentile(took, .5)), ms(percentile(took, .99)), ms(percentile(took, 1)),
		ms(percentile(run, .5)), ms(percentile(run, .99)), ms(percentile(run, 1)))
	logLong(b, sb.String())
}

func reportKills(b *testing.B, cfg killConfig, standby bool, ours, peer *killResult) {
	op50, op99 := ms(percentile(ours.latencies, .5)), ms(percentile(ours.latencies, .99))
	rp50, rp99 := ms(percentile(peer.latencies, .5)), ms(percentile(peer.latencies, .99))
	b.ReportMetric(op50, "ours_p50_ms")
	b.ReportMetric(op99, "ours_p99_ms")
	b.ReportMetric(ms(percentile(ours.latencies, 1)), "ours_max_ms")
	b.ReportMetric(rp50, "river_p50_ms")
	b.ReportMetric(rp99, "river_p99_ms")
	b.ReportMetric(ms(percentile(peer.latencies, 1)), "river_max_ms")
	if rp50 > 0 {
		b.ReportMetric(op50/rp50, "ours/river_p50")
	}
	if rp99 > 0 {
		b.ReportMetric(op99/rp99, "ours/river_p99")
	}
	b.ReportMetric(ms(percentile(ours.takeovers, .5)), "takeover_p50_ms")
	b.ReportMetric(ms(percentile(ours.takeovers, 1)), "takeover_max_ms")
	b.ReportMetric(ms(percentile(ours.working, .5)), "queues_worked_p50_ms")
	b.ReportMetric(ms(percentile(ours.working, 1)), "queues_worked_max_ms")
	b.ReportMetric(float64(ours.backlogMax), "ours_backlog_max")
	b.ReportMetric(float64(peer.backlogMax), "river_backlog_max")
	b.ReportMetric(float64(ours.handedBack), "ours_handed_back")
	b.ReportMetric(float64(peer.stuck), "river_stuck_jobs")
	b.ReportMetric(float64(peer.stuckRan), "river_stuck_ran")
	b.ReportMetric(float64(ours.expired), "lease_expired_takeovers")
	b.ReportMetric(float64(ours.kills), "kills")
	if !standby {
		b.ReportMetric(ms(percentile(peer.restarts, .5)), "river_restart_p50_ms")
	}
	b.Logf("%d kill -9 every %s, a new identity each, %d jobs/s, poll %s: ours p50 %.1f ms p99 %.1f ms (n=%d), River p50 %.1f ms p99 %.1f ms (n=%d); takeover p50 %.0f ms, max %.0f ms; backlog max ours %d, River %d; ours handed back %d, River stuck %d",
		ours.kills, cfg.every, cfg.rate, cfg.poll, op50, op99, len(ours.latencies), rp50, rp99, len(peer.latencies),
		ms(percentile(ours.takeovers, .5)), ms(percentile(ours.takeovers, 1)), ours.backlogMax, peer.backlogMax, ours.handedBack, peer.stuck)
}

// loadAverage is the machine's 1-minute load average ("?" where unknown).
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) > 0 {
		return f[0]
	}
	return "?"
}
