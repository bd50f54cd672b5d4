package workers_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers/internal/lease"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

// These tests take shards over by heartbeat, from a worker of another identity:
// a hot standby on another host, or a replacement with a new name (a
// Kubernetes Deployment's new pod). The leases live 15 s (production timing),
// so a takeover that waited for their expiry would take 15 s; the heartbeat
// (500 ms, 4 missed beats) lets it happen about 2 s after the last beat.

// takeoverEnv is production lease timing under identity id, with a task that
// holds its transaction 30 ms, so a kill finds jobs running.
func takeoverEnv(id string) []string {
	return append(slices.Clone(crashLoopEnv), "BETTER_COMPUTE_WORKER_ID="+id, "EXAMPLE_RECONCILE_SLEEP=30ms")
}

// takeoverRounds is the number of kill rounds: a few in the default suite;
// BETTER_COMPUTE_TAKEOVER_ROUNDS=20 for the figures of docs/operating.md.
func takeoverRounds(t *testing.T, def int) int {
	return envInt(t, "BETTER_COMPUTE_TAKEOVER_ROUNDS", def)
}

// heartbeatTakeovers is compute_lease_takeovers' count for heartbeat_lost.
func heartbeatTakeovers(t *testing.T, db *pgtest.DB) int {
	return db.MustCount(t, `SELECT coalesce(sum(count), 0) FROM compute_lease_takeovers WHERE reason = $1`, lease.ReasonHeartbeatLost)
}

// killAndWaitForTakeover kill -9s holder and returns how long until next holds
// every shard; it requires that every shard changed hands because the holder's
// heartbeat stopped, well before the leases' 15 s expiry.
func killAndWaitForTakeover(t *testing.T, db *pgtest.DB, holder *proc, next func() *proc) (time.Duration, *proc) {
	t.Helper()
	before := heartbeatTakeovers(t, db)
	killed := time.Now()
	require.NoError(t, holder.cmd.Process.Signal(syscall.SIGKILL))
	<-holder.done
	n := next()
	workertest.WaitFor(t, 30*time.Second, "the next worker holds every shard", func() bool { return leasesOf(t, db, n) == 16 })
	took := time.Since(killed)
	require.Equal(t, before+16, heartbeatTakeovers(t, db), "every shard taken because the holder's heartbeat stopped")
	require.Less(t, took, 10*time.Second, "taken long before the leases' 15 s expiry")
	return took, n
}

// summary is the median and worst of ds.
func summary(ds []time.Duration) string {
	s := slices.Clone(ds)
	slices.Sort(s)
	return fmt.Sprintf("%d rounds: median %s, worst %s", len(s), s[len(s)/2].Round(time.Millisecond), s[len(s)-1].Round(time.Millisecond))
}

// TestProcessKill9StandbyOfAnotherIdentity: the holder is killed (kill -9)
// while a standby of another identity runs; the standby takes every shard
// about 2 s after the holder's last beat, not at the leases' expiry, and hands
// back the holder's running jobs. Each round starts a new standby under a new
// identity. Under a steady writer, every change converges and every task runs
// exactly once.
func TestProcessKill9StandbyOfAnotherIdentity(t *testing.T) {
	t.Parallel()
	db := appDB(t)
	holder := startWorker(t, db, takeoverEnv("host-0/0")...)
	workertest.WaitFor(t, 20*time.Second, "the first worker holds every shard", func() bool { return leasesOf(t, db, holder) == 16 })
	standby := startWorker(t, db, takeoverEnv("host-1/0")...)
	stopTasks := producer(t, db, 20*time.Millisecond)

	var took []time.Duration
	for r := 0; r < takeoverRounds(t, 3); r++ {
		// A reconcile sleeps 30 ms in its transaction: a look can miss all
		// ten, so each look that finds none changes the items again, until
		// one is caught mid-flight (seen once in a full run on 2 cores).
		qty := int64(r) * 1000
		workertest.WaitFor(t, 20*time.Second, "the holder is mid-reconcile", func() bool {
			if midReconcile(t, db) > 0 {
				return true
			}
			qty++
			for i := 0; i < 10; i++ {
				change(t, db, fmt.Sprintf("item-%02d", i), qty)
			}
			return false
		})
		d, next := killAndWaitForTakeover(t, db, holder, func() *proc { return standby })
		took = append(took, d)
		holder, standby = next, startWorker(t, db, takeoverEnv(fmt.Sprintf("host-%d/0", r+2))...)
	}
	t.Logf("kill -9 of the holder, a standby of another identity running: every shard held by it after %s", summary(took))

	inserted := stopTasks()
	workertest.WaitFor(t, 60*time.Second, "every change converges and every task runs", func() bool {
		return converged(t, db) && ranExactlyOnce(t, db, inserted)
	})
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM (SELECT task_id FROM example_task_runs GROUP BY task_id HAVING count(*) > 1) d`),
		"a task's fenced write recorded twice")
}

// TestProcessKill9ReplacementUnderANewIdentity: the only worker is killed and a
// replacement starts under a new identity, as a Deployment replaces a pod: it
// takes every shard once the dead worker's heartbeat deadline has passed, not
// at the leases' expiry.
func TestProcessKill9ReplacementUnderANewIdentity(t *testing.T) {
	t.Parallel()
	db := appDB(t)
	w := startWorker(t, db, takeoverEnv("pod-0")...)
	workertest.WaitFor(t, 20*time.Second, "the worker holds every shard", func() bool { return leasesOf(t, db, w) == 16 })
	stopTasks := producer(t, db, 20*time.Millisecond)
	var took []time.Duration
	for r := 0; r < takeoverRounds(t, 2); r++ {
		d, next := killAndWaitForTakeover(t, db, w, func() *proc { return startWorker(t, db, takeoverEnv(fmt.Sprintf("pod-%d", r+1))...) })
		took, w = append(took, d), next
	}
	t.Logf("kill -9 of the only worker, a replacement started after it under a new identity: every shard held after %s", summary(took))
	inserted := stopTasks()
	workertest.WaitFor(t, 60*time.Second, "every task runs", func() bool { return ranExactlyOnce(t, db, inserted) })
}

// TestProcessSIGSTOPPastMissedBeats: the holder is paused (SIGSTOP) past its
// missed beats, long before its leases' expiry; the standby, of another
// identity, takes every shard. Woken (SIGCONT), the paused process commits
// nothing more (its fenced transactions find the new epoch), learns at its next
// beat that it was silent too long, finds its leases taken, stops working the
// shards and stays up as a standby; the new holder keeps every shard.
func TestProcessSIGSTOPPastMissedBeats(t *testing.T) {
	t.Parallel()
	db := appDB(t)
	env := append(takeoverEnv("host-a/0"), "EXAMPLE_RECONCILE_SLEEP=300ms")
	a := startWorker(t, db, env...)
	workertest.WaitFor(t, 20*time.Second, "A holds every shard", func() bool { return leasesOf(t, db, a) == 16 })
	b := startWorker(t, db, append(takeoverEnv("host-b/0"), "EXAMPLE_RECONCILE_SLEEP=300ms")...)
	for i := 0; i < 20; i++ {
		change(t, db, fmt.Sprintf("item-%02d", i), 1)
	}
	workertest.WaitFor(t, 20*time.Second, "A is mid-reconcile", func() bool {
		return midReconcile(t, db) > 0
	})
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGSTOP))
	stoppedAt := dbNow(t, db)
	paused := time.Now()
	workertest.WaitFor(t, 30*time.Second, "B holds every shard", func() bool { return leasesOf(t, db, b) == 16 })
	require.Less(t, time.Since(paused), 10*time.Second, "taken long before the leases' 15 s expiry")
	require.Equal(t, 16, heartbeatTakeovers(t, db))
	epochs := db.MustCount(t, `SELECT sum(epoch) FROM compute_leases WHERE name LIKE 'shard/%'`)

	require.NoError(t, a.cmd.Process.Signal(syscall.SIGCONT))
	workertest.WaitFor(t, 30*time.Second, "A wakes, finds every lease taken and stops working every shard queue", func() bool {
		return lostLeases(t, a) == 16 && stoppedQueues(t, a) == 16
	})
	require.True(t, logHas(t, a, "heartbeat resumed after a silence longer than dead_after"), "A noticed its silence")
	for i := 0; i < 20; i++ {
		change(t, db, fmt.Sprintf("item-%02d", i), 2)
	}
	workertest.WaitFor(t, 30*time.Second, "B reconciles everything", func() bool { return converged(t, db) })
	require.Zero(t, db.MustCount(t, `SELECT count(*) FROM example_reconcile_log WHERE worker = $1 AND finished_at > $2`,
		strconv.Itoa(a.pid), stoppedAt), "the paused process committed a reconcile after it was paused")
	require.Equal(t, 16, leasesOf(t, db, b), "B keeps every shard")
	require.Zero(t, leasesOf(t, db, a), "A holds nothing: it stands by")
	require.Equal(t, epochs, db.MustCount(t, `SELECT sum(epoch) FROM compute_leases WHERE name LIKE 'shard/%'`),
		"no lease changed hands again")
	select {
	case <-a.done:
		t.Fatal("the woken process exited; it should stand by")
	default:
	}
	var silent float64
	require.NoError(t, db.QueryRow(context.Background(), `SELECT extract(epoch FROM compute_now() - seen_at) FROM compute_workers WHERE identity = 'host-a/0'`).Scan(&silent))
	require.Less(t, silent, 5.0, "the woken process beats again")
}

// logHas says whether p's log has a record whose message starts with msg.
func logHas(t *testing.T, p *proc, msg string) bool {
	t.Helper()
	return slices.ContainsFunc(workerLog(t, p.log), func(rec workerLogLine) bool { return strings.HasPrefix(rec.Message, msg) })
}
