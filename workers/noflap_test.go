package workers_test

import (
	"context"
	"encoding/json"
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
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/platform/embedded"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

// This test binary, re-executed, is the test's helpers: with noflapBurnEnv=1
// a CPU burner, spinning on one core from init until it is killed (see
// startBurners); with noflapStallEnv="PID DURATION" one stall of the database
// server whose postmaster is PID (see stallOnce).
const (
	noflapBurnEnv  = "BETTER_COMPUTE_NOFLAP_BURN"
	noflapStallEnv = "BETTER_COMPUTE_NOFLAP_STALL"
)

func init() {
	if os.Getenv(noflapBurnEnv) == "1" {
		for {
		}
	}
	if arg := os.Getenv(noflapStallEnv); arg != "" {
		stallMain(arg)
	}
}

const (
	noflapStall      = 300 * time.Millisecond // each database stall
	noflapStallEvery = 2 * time.Second        // between stalls, ±500 ms
	noflapSample     = 50 * time.Millisecond  // the heartbeat sampler's period
)

// noflapLoad is how long TestChaosNoFlapUnderLoad loads the holder, and with
// how many CPU burners: BETTER_COMPUTE_NOFLAP_DURATION (go tool task chaos sets
// 10m) with one burner per core, or by default 15 s with a single burner, so
// the rest of the suite, running beside it, is not starved.
func noflapLoad(t *testing.T) (time.Duration, int) {
	t.Helper()
	if s := os.Getenv("BETTER_COMPUTE_NOFLAP_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		require.NoError(t, err, "BETTER_COMPUTE_NOFLAP_DURATION")
		return d, runtime.NumCPU()
	}
	return 15 * time.Second, 1
}

// noflapEnv: production lease timing and statement timeout over the process
// tests' fast ones; heartbeat and missed beats stay at their defaults (500 ms ×
// 4: dead_after 2 s).
var noflapEnv = []string{
	"BETTER_COMPUTE_LEASE_TTL=15s", "BETTER_COMPUTE_LEASE_RENEW=5s", "BETTER_COMPUTE_STATEMENT_TIMEOUT=15s",
	"EXAMPLE_RECONCILE_SLEEP=5ms",
}

// TestChaosNoFlapUnderLoad: a live holder keeps its shards under load. The
// risk of taking the shards of a worker silent past its dead_after (heartbeat ×
// missed beats, 2 s by default) without waiting out the 15 s lease TTL is
// flapping: a live holder on a loaded machine losing its shards because its
// beats came late.
//
// A holder (identity holder) holds all 16 shards, a standby (identity standby)
// waits, both with production lease timing and the default heartbeat. A steady
// writer makes reconcile work and tasks, CPU burners keep the cores busy, and
// every ~2 s the whole database server (the postmaster and every child) is
// stopped (SIGSTOP) for 300 ms, on a private cluster of its own. Each stall is
// made and timed by a helper process at nice -10 (the test binary
// re-executed), which continues (SIGCONT) every process it stopped however the
// test ends; the test's cleanup continues them all again too. Throughout,
// nothing changes hands: compute_lease_takeovers stays empty, every shard keeps
// its owner and epoch, the standby holds nothing and the holder logs no lost
// lease; after the load the work converges and every task ran exactly once.
// It logs the stalls, the largest gap between the holder's heartbeats (seen_at
// sampled every 50 ms), its dead_after and the margin left.
//
// By default the load lasts 15 s with a single burner process, since the test
// runs beside the rest of the parallel suite; go tool task chaos runs it for 10
// minutes with a burner per core (BETTER_COMPUTE_NOFLAP_DURATION=10m, or
// NOFLAP=…).
func TestChaosNoFlapUnderLoad(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("stalls the server's processes found in /proc")
	}
	t.Parallel()
	ctx := context.Background()
	duration, burners := noflapLoad(t)

	// A cluster of its own: the test stalls the whole server.
	cluster, err := embedded.Start(ctx, embedded.Options{Fast: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cluster.Stop() })
	postmaster := postmasterPID(t, cluster.Dir())
	// Registered after the cluster's Stop, so it runs first: no process of the
	// server stays stopped, whatever way the test ends.
	t.Cleanup(func() { continueCluster(postmaster) })
	out, err := exec.Command(exampleApp(t), "migrate", "--database-url", cluster.URL(), "--log-level", "warn").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "applied example/0002_reconcile_log")
	pool, err := pg.Open(ctx, pg.Options{URL: cluster.URL(), MaxConns: 10})
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	db := &pgtest.DB{Pool: pool, Name: embedded.Database, URL: cluster.URL()}

	holder := startWorker(t, db, append([]string{"BETTER_COMPUTE_WORKER_ID=holder"}, noflapEnv...)...)
	workertest.WaitFor(t, 30*time.Second, "the holder holds every shard", func() bool { return leasesOf(t, db, holder) == 16 })
	standby := startWorker(t, db, append([]string{"BETTER_COMPUTE_WORKER_ID=standby"}, noflapEnv...)...)
	workertest.WaitFor(t, 30*time.Second, "the standby has claimed its identity and beats", func() bool {
		return db.MustCount(t, `SELECT count(*) FROM compute_workers WHERE identity = 'standby' AND pid = $1
			AND stopped_at IS NULL AND seen_at > started_at`, standby.pid) == 1
	})
	owner := ownerOf(t, db, holder)
	require.Equal(t, "holder#1", owner)
	require.Equal(t, "standby#1", ownerOf(t, db, standby))
	before := epochs(t, db)
	require.Len(t, before, 16)
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM compute_lease_takeovers`), "a takeover before the load")
	var deadAfterSecs float64
	require.NoError(t, db.QueryRow(ctx, `SELECT extract(epoch FROM dead_after)::float8 FROM compute_workers
		WHERE identity = 'holder'`).Scan(&deadAfterSecs))
	deadAfter := time.Duration(deadAfterSecs * float64(time.Second))

	// The work: changes over 200 keys to reconcile, and tasks. Their stops are
	// registered before the stall loop's, so at a failure the server is running
	// again before they wait for their last statement.
	var stopWriter atomic.Bool
	var changes atomic.Int64
	var writeErr atomic.Value
	var writerWG sync.WaitGroup
	writerWG.Go(func() {
		for i := 0; !stopWriter.Load(); i++ {
			if err := exampleChange(db, fmt.Sprintf("item-%03d", rand.IntN(200)), int64(i)); err != nil {
				writeErr.Store(err)
				return
			}
			changes.Add(1)
			time.Sleep(2 * time.Millisecond)
		}
	})
	stopWriting := func() { stopWriter.Store(true); writerWG.Wait() }
	t.Cleanup(stopWriting)
	stopTasks := producer(t, db, 10*time.Millisecond)

	beats := sampleHeartbeat(t, cluster.URL(), "holder")
	stopBurners := startBurners(t, burners)
	stalls := stallEvery(t, postmaster)

	loadStart := time.Now()
	time.Sleep(duration)
	st, stallErr := stalls.stop()
	stopBurners()
	stopWriting()
	inserted := stopTasks()
	loaded := time.Since(loadStart)
	hb := beats.stop()
	require.NoError(t, stallErr, "a stall")
	if err, _ := writeErr.Load().(error); err != nil {
		t.Fatalf("the writer failed: %v", err)
	}

	t.Logf("no-flap load: %s, %d CPU burners (%d cores), %d changes, %d tasks", loaded.Round(time.Second), burners, runtime.NumCPU(),
		changes.Load(), inserted)
	t.Logf("stalls: %d of %s (SIGSTOP of %d to %d server processes; held %s at most, %d longer than %s%s); not seen stopped at a stall's end: %d %v",
		st.count, noflapStall, st.minProcs, st.maxProcs, st.longest.Round(time.Millisecond), len(st.long), noflapStall+100*time.Millisecond,
		st.longAt(loadStart), len(st.notStopped), st.notStopped)
	t.Logf("holder's heartbeat: %d samples, %d beats seen, largest gap between beats %s (at %s into the load), %d gaps over 1 s; largest silence seen by a sample %s; slowest sample %s; %d failed samples",
		hb.samples, hb.beats, hb.maxGap.Round(time.Millisecond), hb.maxGapAt.Sub(loadStart).Round(time.Millisecond), hb.over1s,
		hb.maxAge.Round(time.Millisecond), hb.maxLatency.Round(time.Millisecond), hb.failed)
	if hb.over1s > 0 {
		t.Logf("holder's heartbeat gaps over 1 s, seen at: %s", hb.bigGaps(loadStart))
	}
	t.Logf("holder's dead_after %s: margin left %s (%.0f%% of dead_after)", deadAfter, (deadAfter - hb.maxGap).Round(time.Millisecond),
		100*float64(deadAfter-hb.maxGap)/float64(deadAfter))
	warnings := logWarnings(t, holder)
	t.Logf("holder's warnings and errors: %v", warnings)
	require.Positive(t, st.count, "no stall happened")
	require.GreaterOrEqual(t, hb.maxLatency, noflapStall*2/3, "no sample waited out a stall: did the stalls stop the server?")
	require.Positive(t, hb.beats, "no heartbeat of the holder was seen")

	// Nothing changed hands.
	takeovers := takeoverRows(t, db)
	leases := noflapLeases(t, db)
	if len(takeovers) > 0 || lostLeases(t, holder) > 0 {
		t.Logf("takeovers: %s", strings.Join(takeovers, "; "))
		t.Logf("shard leases: %s", strings.Join(leases, "; "))
		t.Logf("holder's log around the losses:\n%s", logAround(t, holder, isLossLine, 8))
		t.Logf("standby's log, leases acquired:\n%s", logAround(t, standby, func(m string) bool { return m == "lease acquired" }, 0))
	}
	require.Empty(t, takeovers, "a lease changed hands (compute_lease_takeovers); leases now: %s", strings.Join(leases, "; "))
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM compute_leases WHERE name LIKE 'shard/%' AND owner <> $1`, owner),
		"a shard is not the holder's: %s", strings.Join(leases, "; "))
	require.Equal(t, before, epochs(t, db), "a shard lease's epoch changed: %s", strings.Join(leases, "; "))
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM compute_leases WHERE owner = $1`, ownerOf(t, db, standby)),
		"the standby holds a lease: %s", strings.Join(leases, "; "))
	require.Equal(t, 16, leasesOf(t, db, holder), "the holder's leases are unexpired")
	require.Zero(t, lostLeases(t, holder), "the holder logged a lost lease:\n%s", logAround(t, holder, isLossLine, 8))

	// The work converges, and the holder did all of it.
	workertest.WaitFor(t, 90*time.Second, "every change is reconciled", func() bool { return converged(t, db) })
	workertest.WaitFor(t, 90*time.Second, "every task ran", func() bool { return ranExactlyOnce(t, db, inserted) })
	require.Equal(t, inserted, db.MustCount(t, `SELECT count(*) FROM example_task_runs`), "a task's fenced write recorded twice")
	require.Equal(t, inserted, db.MustCount(t, `SELECT count(*) FROM example_task_runs WHERE worker = $1`, strconv.Itoa(holder.pid)),
		"a task ran elsewhere than on the holder")
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM example_reconcile_log WHERE worker <> $1`, strconv.Itoa(holder.pid)),
		"a reconcile ran elsewhere than on the holder")
	require.Empty(t, takeoverRows(t, db), "a lease changed hands after the load")
	require.Equal(t, before, epochs(t, db), "a shard lease's epoch changed after the load")
}

// postmasterPID reads the server's pid from dir/postmaster.pid.
func postmasterPID(t *testing.T, dir string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "postmaster.pid"))
	require.NoError(t, err)
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	require.NoError(t, err, "postmaster.pid")
	return pid
}

// childrenOf lists the processes whose parent is pid, from /proc.
func childrenOf(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // exited meanwhile
		}
		// pid (comm) state ppid …: comm may hold spaces and parentheses.
		s := string(b)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) > 1 && fields[1] == strconv.Itoa(pid) {
			out = append(out, n)
		}
	}
	return out
}

// stallCluster stops the postmaster, then every child of it (the postmaster
// stopped forks none meanwhile), for d, and continues each before it returns,
// however it returns. It returns how many processes it stopped, and those /proc
// did not show stopped (nor exited) at the end of d, as "pid (comm) state": a
// process in uninterruptible sleep (D) stops only when its I/O ends, a runnable
// one (R) once it gets a CPU again.
func stallCluster(postmaster int, d time.Duration) (n int, notStopped []string, err error) {
	var stopped []int
	defer func() {
		for i := len(stopped) - 1; i >= 0; i-- {
			_ = syscall.Kill(stopped[i], syscall.SIGCONT)
		}
	}()
	if err := syscall.Kill(postmaster, syscall.SIGSTOP); err != nil {
		return 0, nil, fmt.Errorf("SIGSTOP postmaster %d: %w", postmaster, err)
	}
	stopped = append(stopped, postmaster)
	for _, c := range childrenOf(postmaster) {
		if syscall.Kill(c, syscall.SIGSTOP) == nil {
			stopped = append(stopped, c)
		}
	}
	time.Sleep(d)
	for _, p := range stopped {
		if comm, st := procState(p); st != "T" && st != "Z" && st != "" {
			notStopped = append(notStopped, fmt.Sprintf("%d %s %s", p, comm, st))
		}
	}
	return len(stopped), notStopped, nil
}

// procState is the "(comm)" and state letter of process pid in /proc (state ""
// when it is gone).
func procState(pid int) (comm, state string) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", ""
	}
	s := string(b)
	end := strings.LastIndexByte(s, ')')
	comm = s[strings.IndexByte(s, '(') : end+1]
	if f := strings.Fields(s[end+1:]); len(f) > 0 {
		state = f[0]
	}
	return comm, state
}

// continueCluster sends SIGCONT to the postmaster and every child of it.
func continueCluster(postmaster int) {
	_ = syscall.Kill(postmaster, syscall.SIGCONT)
	for _, c := range childrenOf(postmaster) {
		_ = syscall.Kill(c, syscall.SIGCONT)
	}
}

type stallStats struct {
	count              int
	minProcs, maxProcs int
	notStopped         []string      // processes /proc did not show stopped at a stall's end
	longest            time.Duration // from the SIGSTOP of the postmaster to the last SIGCONT
	long               []stallAt     // the stalls longer than noflapStall + 100 ms
}

type stallAt struct {
	at   time.Time
	held time.Duration
}

// stallReport is what a stall helper process writes on its stdout.
type stallReport struct {
	Procs      int
	NotStopped []string
	Held       time.Duration
	Err        string
}

// stallMain is the stall helper process: one stall (stallCluster), reported on
// stdout. Its stopped processes are continued even if the test binary that
// started it died meanwhile.
func stallMain(arg string) {
	var rep stallReport
	f := strings.Fields(arg)
	pid, err := strconv.Atoi(f[0])
	d, err2 := time.ParseDuration(f[len(f)-1])
	if err != nil || err2 != nil || len(f) != 2 {
		rep.Err = fmt.Sprintf("%s=%q: want PID DURATION", noflapStallEnv, arg)
	} else {
		t0 := time.Now()
		rep.Procs, rep.NotStopped, err = stallCluster(pid, d)
		rep.Held = time.Since(t0)
		if err != nil {
			rep.Err = err.Error()
		}
	}
	_ = json.NewEncoder(os.Stdout).Encode(rep)
	os.Exit(0)
}

// stallOnce runs one stall in a helper process (this test binary re-executed)
// at nice -10 where it may (root): a stall is timed by the helper, so that the
// load on the machine, which delays the test's own goroutines, does not
// stretch it.
func stallOnce(postmaster int, d time.Duration) (stallReport, error) {
	self, err := os.Executable()
	if err != nil {
		return stallReport{}, err
	}
	cmd := exec.Command(self, "-test.run=^$")
	if nice, err := exec.LookPath("nice"); err == nil && os.Geteuid() == 0 {
		cmd = exec.Command(nice, "-n", "-10", self, "-test.run=^$")
	}
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d %s", noflapStallEnv, postmaster, d))
	out, err := cmd.Output()
	if err != nil {
		return stallReport{}, fmt.Errorf("stall helper: %v: %s", err, out)
	}
	var rep stallReport
	if err := json.Unmarshal(out, &rep); err != nil {
		return rep, fmt.Errorf("stall helper: %v: %s", err, out)
	}
	if rep.Err != "" {
		return rep, fmt.Errorf("stall helper: %s", rep.Err)
	}
	return rep, nil
}

type staller struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	stats  stallStats
	err    error
	once   sync.Once
}

// stallEvery stalls the cluster of postmaster for noflapStall every
// noflapStallEvery (±500 ms) until stop, which t's cleanup also calls: each
// stall in a helper process (stallOnce).
func stallEvery(t *testing.T, postmaster int) *staller {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &staller{cancel: cancel}
	s.wg.Go(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(noflapStallEvery - 500*time.Millisecond + rand.N(time.Second)):
			}
			at := time.Now()
			rep, err := stallOnce(postmaster, noflapStall)
			if err != nil {
				s.err = err
				return
			}
			s.stats.count++
			s.stats.notStopped = append(s.stats.notStopped, rep.NotStopped...)
			s.stats.longest = max(s.stats.longest, rep.Held)
			if rep.Held > noflapStall+100*time.Millisecond {
				s.stats.long = append(s.stats.long, stallAt{at: at, held: rep.Held})
			}
			s.stats.maxProcs = max(s.stats.maxProcs, rep.Procs)
			if s.stats.minProcs == 0 || rep.Procs < s.stats.minProcs {
				s.stats.minProcs = rep.Procs
			}
		}
	})
	t.Cleanup(func() {
		if _, err := s.stop(); err != nil {
			t.Error(err)
		}
	})
	return s
}

// longAt lists the long stalls, by their start from the load's.
func (st stallStats) longAt(from time.Time) string {
	var parts []string
	for _, l := range st.long {
		parts = append(parts, fmt.Sprintf("%s at +%s", l.held.Round(time.Millisecond), l.at.Sub(from).Round(time.Millisecond)))
	}
	if len(parts) == 0 {
		return ""
	}
	return ": " + strings.Join(parts, ", ")
}

// stop ends the stalls (the one under way ends with its SIGCONTs) and returns
// what they were, or why a stall could not be made.
func (s *staller) stop() (stallStats, error) {
	s.once.Do(func() { s.cancel(); s.wg.Wait() })
	return s.stats, s.err
}

// startBurners starts n CPU burners (this test binary re-executed, spinning on
// one core each); the returned function, also run at cleanup, kills them.
func startBurners(t *testing.T, n int) (stop func()) {
	t.Helper()
	self, err := os.Executable()
	require.NoError(t, err)
	var cmds []*exec.Cmd
	var once sync.Once
	stop = func() {
		once.Do(func() {
			for _, c := range cmds {
				_ = c.Process.Kill()
				_ = c.Wait()
			}
		})
	}
	t.Cleanup(stop)
	for range n {
		c := exec.Command(self, "-test.run=^$")
		c.Env = append(os.Environ(), noflapBurnEnv+"=1")
		c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // gone with the test binary
		require.NoError(t, c.Start())
		cmds = append(cmds, c)
	}
	return stop
}

type beatStats struct {
	samples, beats, failed, over1s int
	maxGap                         time.Duration // the largest increase of seen_at between two samples
	maxGapAt                       time.Time     // when (local clock) the sample that saw it was taken
	maxAge                         time.Duration // the largest now() - seen_at a sample saw
	maxLatency                     time.Duration // the slowest sample: a stall shows here
	gaps                           []beatGap     // those over 1 s
}

type beatGap struct {
	at   time.Time     // when (local clock) the sample that saw it was taken
	from time.Time     // the seen_at before the gap (the database's clock)
	gap  time.Duration // to the next seen_at
}

func (b beatStats) bigGaps(from time.Time) string {
	var parts []string
	for _, g := range b.gaps {
		parts = append(parts, fmt.Sprintf("%s at +%s (beats at %s and %s UTC)", g.gap.Round(time.Millisecond),
			g.at.Sub(from).Round(time.Millisecond), g.from.UTC().Format("15:04:05.000"), g.from.Add(g.gap).UTC().Format("15:04:05.000")))
	}
	return strings.Join(parts, ", ")
}

type beatSampler struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	stats  beatStats
	once   sync.Once
}

// sampleHeartbeat reads identity's seen_at every noflapSample, on a connection
// of its own, until stop (also at cleanup), tracking the largest increase of
// seen_at between two samples: the largest gap between two heartbeats. A stall
// stalls the sampler too, which does not hide a gap: seen_at is the beat's.
func sampleHeartbeat(t *testing.T, url, identity string) *beatSampler {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	s := &beatSampler{cancel: cancel}
	s.wg.Go(func() {
		defer conn.Close(context.Background())
		var last time.Time
		for ctx.Err() == nil {
			var seen time.Time
			var age float64
			qctx, qcancel := context.WithTimeout(ctx, 10*time.Second)
			t0 := time.Now()
			err := conn.QueryRow(qctx, `SELECT seen_at, extract(epoch FROM clock_timestamp() - seen_at)::float8
				FROM compute_workers WHERE identity = $1`, identity).Scan(&seen, &age)
			qcancel()
			s.stats.maxLatency = max(s.stats.maxLatency, time.Since(t0))
			switch {
			case ctx.Err() != nil:
				return
			case err != nil:
				s.stats.failed++
			default:
				s.stats.samples++
				s.stats.maxAge = max(s.stats.maxAge, time.Duration(age*float64(time.Second)))
				if !last.IsZero() && seen.After(last) {
					s.stats.beats++
					gap := seen.Sub(last)
					if gap > s.stats.maxGap {
						s.stats.maxGap, s.stats.maxGapAt = gap, time.Now()
					}
					if gap > time.Second {
						s.stats.over1s++
						s.stats.gaps = append(s.stats.gaps, beatGap{at: time.Now(), from: last, gap: gap})
					}
				}
				if seen.After(last) {
					last = seen
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(noflapSample):
			}
		}
	})
	t.Cleanup(func() { s.stop() })
	return s
}

func (s *beatSampler) stop() beatStats {
	s.once.Do(func() { s.cancel(); s.wg.Wait() })
	return s.stats
}

// noflapLeases lists the shard leases: owner, epoch, acquisition and expiry.
func noflapLeases(t *testing.T, db *pgtest.DB) []string {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT format('%s %s epoch %s acquired %s expires %s',
		name, owner, epoch, acquired_at, expires_at) FROM compute_leases WHERE name LIKE 'shard/%' ORDER BY name`)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return out
}

func isLossLine(msg string) bool {
	return msg == "lease lost: another owner took it" || msg == "lease expired without renewal" ||
		strings.HasPrefix(msg, "heartbeat resumed after a silence")
}

// logWarnings counts p's warning and error log lines by message.
func logWarnings(t *testing.T, p *proc) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, l := range workerLog(t, p.log) {
		if l.Level == "warn" || l.Level == "error" {
			out[l.Message]++
		}
	}
	return out
}

// logAround returns p's log lines whose message matches, each with context
// lines before and after it.
func logAround(t *testing.T, p *proc, match func(msg string) bool, around int) string {
	t.Helper()
	b, err := os.ReadFile(p.log)
	require.NoError(t, err)
	lines := strings.Split(string(b), "\n")
	var keep []int
	for i, l := range lines {
		var rec workerLogLine
		if json.Unmarshal([]byte(l), &rec) == nil && match(rec.Message) {
			for j := max(0, i-around); j <= min(len(lines)-1, i+around); j++ {
				keep = append(keep, j)
			}
		}
	}
	slices.Sort(keep)
	keep = slices.Compact(keep)
	var out []string
	for k, i := range keep {
		if k > 0 && i != keep[k-1]+1 {
			out = append(out, "…")
		}
		out = append(out, lines[i])
	}
	if len(out) > 400 {
		out = append(out[:400], fmt.Sprintf("… (%d more lines)", len(out)-400))
	}
	return strings.Join(out, "\n")
}
