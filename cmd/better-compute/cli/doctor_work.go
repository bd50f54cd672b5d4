package cli

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/bettercompute/bettercompute/domain/workflow"
	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/migrate"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/workers"
)

// StuckAfter is how long a job may sit available in a queue, or run, before
// doctor calls it stuck.
const StuckAfter = 5 * time.Minute

// doctorWork checks the work side, one check after another: the shard count,
// who holds the shards, each worker's heartbeat, the takeovers so far, jobs
// stuck running, running jobs outside their shard's
// holder, the queues' depth, dirty keys no reconciler handles, and workflows
// whose step job is gone. now is the
// server's clock.
func (s *Session) doctorWork(ctx context.Context, db *pg.Pool, r *report, now time.Time) {
	count, ok := s.doctorShards(ctx, db, r)
	if !ok {
		return
	}
	holder := s.doctorLeases(ctx, db, r, now, count)
	s.doctorWorkers(ctx, db, r)
	s.doctorTakeovers(ctx, db, r)
	s.doctorRunning(ctx, db, r)
	s.doctorStrays(ctx, db, r, now, holder)
	s.doctorQueues(ctx, db, r, count)
	s.doctorReconcilers(ctx, db, r)
	s.doctorWorkflows(ctx, db, r)
}

// doctorShards checks the database's shard count against the configured one
// and returns it; false when it cannot be read (the other work checks need it).
func (s *Session) doctorShards(ctx context.Context, db *pg.Pool, r *report) (int, bool) {
	const name = "shards"
	count, err := migrate.ShardCount(ctx, db)
	if err != nil {
		r.fail(name, err, "")
		return 0, false
	}
	if count != s.Config.ShardCount {
		r.add(name, false, "the database has %d shards, BETTER_COMPUTE_SHARD_COUNT says %d: the count is fixed at the first migrate; set it to %d", count, s.Config.ShardCount, count)
	} else {
		r.add(name, true, "%d shards, as configured", count)
	}
	return count, true
}

// doctorLeases checks the shard leases and their owners: a shard with waiting
// work and no holder is stuck. It returns the owner of each held shard's
// unexpired lease.
func (s *Session) doctorLeases(ctx context.Context, db *pg.Pool, r *report, now time.Time, count int) map[int]string {
	const name = "leases"
	holder, leaseErr := workers.ShardHolders(ctx, db, now)
	waiting, waitErr := workers.WaitingByShard(ctx, db)
	owners := map[string]int{}
	for _, o := range holder {
		owners[o]++
	}
	var unheld, stuck []string
	for i := 0; i < count; i++ {
		if _, held := holder[i]; !held {
			unheld = append(unheld, fmt.Sprint(i))
			if waiting[i] > 0 {
				stuck = append(stuck, fmt.Sprintf("%d (%d jobs or dirty keys waiting)", i, waiting[i]))
			}
		}
	}
	ownerList := make([]string, 0, len(owners))
	for o, n := range owners {
		ownerList = append(ownerList, fmt.Sprintf("%s (%d)", o, n))
	}
	sort.Strings(ownerList)
	switch {
	case leaseErr != nil:
		r.fail(name, leaseErr, "cannot list the shard leases")
	case waitErr != nil:
		r.fail(name, waitErr, "cannot count the jobs waiting")
	case len(stuck) > 0:
		r.add(name, false, "no worker holds shard %s: start better-compute worker for them", strings.Join(stuck, ", "))
	case len(unheld) == count:
		r.add(name, true, "no worker holds any shard (no work is waiting)")
	case len(unheld) > 0:
		r.add(name, true, "%d/%d shards held by %s; unheld (no work waiting): %s", count-len(unheld), count, strings.Join(ownerList, ", "), strings.Join(unheld, ","))
	default:
		r.add(name, true, "%d/%d shards held by %s", count, count, strings.Join(ownerList, ", "))
	}
	return holder
}

// doctorRunning checks for jobs running for longer than StuckAfter: their
// process died or is wedged.
func (s *Session) doctorRunning(ctx context.Context, db *pg.Pool, r *report) {
	const name = "running"
	runningLong, oldest, _ := jobs.CountRunningLonger(ctx, db, StuckAfter)
	if runningLong > 0 && oldest != nil {
		r.add(name, false, "%d jobs running for more than %s (oldest since %s): their worker died or hangs; a new shard holder hands them back", runningLong, StuckAfter, oldest.Format(time.RFC3339))
		return
	}
	running, _ := jobs.CountRunning(ctx, db)
	r.add(name, true, "%d jobs running, none for more than %s", running, StuckAfter)
}

// doctorQueues checks the queues' depth: what waits, and for how long; and
// that nothing waits in a queue no worker works (River's default queue, a shard
// beyond the count), where it would wait for ever.
func (s *Session) doctorQueues(ctx context.Context, db *pg.Pool, r *report, shardCount int) {
	const name = "queues"
	unfinished, err := jobs.CountUnfinished(ctx, db)
	if err != nil {
		r.fail(name, err, "")
		return
	}
	if stranded := waitingOutside(unfinished, jobs.WorkedQueues(shardCount)); len(stranded) > 0 {
		var parts []string
		for _, q := range stranded {
			parts = append(parts, fmt.Sprintf("%s: %s", q.Queue, plural(int(q.Jobs), "job")))
		}
		r.add(name, false, "jobs wait in queues no worker works, and will never run: %s (workers work %s0-%d and %s; insert fenced jobs with workers.InsertForKeyTx)",
			strings.Join(parts, "; "), jobs.ShardQueuePrefix, shardCount-1, jobs.MaintenanceQueue)
		return
	}
	depths, err := jobs.DueByQueue(ctx, db)
	if err != nil {
		r.fail(name, err, "")
		return
	}
	total, late := 0, []string{}
	for _, d := range depths {
		total += d.Jobs
		if d.Oldest > StuckAfter {
			late = append(late, fmt.Sprintf("%s: %d waiting, oldest %s", d.Queue, d.Jobs, d.Oldest.Round(time.Second)))
		}
	}
	switch {
	case len(late) > 0:
		r.add(name, false, "work waits longer than %s: %s", StuckAfter, strings.Join(late, "; "))
	case total == 0:
		r.add(name, true, "no job is waiting")
	default:
		r.add(name, true, "%d jobs due in %d queues, none waiting longer than %s", total, len(depths), StuckAfter)
	}
}

// waitingOutside sums, per queue not in worked, the jobs of counts that wait
// (any state but running): they would wait for ever. The most first, then by name.
func waitingOutside(counts []jobs.QueueCount, worked []string) []jobs.QueueCount {
	byQueue := map[string]int64{}
	for _, c := range counts {
		if c.State != "running" && !slices.Contains(worked, c.Queue) {
			byQueue[c.Queue] += c.Jobs
		}
	}
	out := make([]jobs.QueueCount, 0, len(byQueue))
	for q, n := range byQueue {
		out = append(out, jobs.QueueCount{Queue: q, Jobs: n})
	}
	slices.SortFunc(out, func(a, b jobs.QueueCount) int {
		return cmp.Or(cmp.Compare(b.Jobs, a.Jobs), cmp.Compare(a.Queue, b.Queue))
	})
	return out
}

// stray is the running jobs of one shard attempted by one client other than the
// shard's holder.
type stray struct {
	shard       int
	client      string
	old         int // attempted before the cut-off
	attemptedAt *time.Time
}

// doctorStrays checks that every running job of a shard queue was attempted by
// the holder of the shard's lease. Another client's (a process that lost the
// lease, paused, woke and fetched) runs unfenced by anyone: the holder hands it
// back within one renewal interval, so only one older than two intervals is a
// problem (no holder, or a holder that does not hand back). now is the
// server's clock, which River stamps attempts with.
func (s *Session) doctorStrays(ctx context.Context, db *pg.Pool, r *report, now time.Time, holder map[int]string) {
	const name = "strays"
	renew := s.Config.LeaseRenew
	groups, err := jobs.RunningByAttempter(ctx, db, now.Add(-2*renew))
	if err != nil {
		r.fail(name, err, "cannot list the running jobs")
		return
	}
	strays, young := findStrays(groups, holder)
	if len(strays) == 0 {
		if young > 0 {
			r.add(name, true, "%s attempted by a client that does not hold the shard, for less than %s: the shard's holder hands them back within one renewal (%s)", plural(young, "running job"), 2*renew, renew)
		} else {
			r.add(name, true, "every running job of a shard queue was attempted by the shard's holder")
		}
		return
	}
	parts := make([]string, 0, len(strays))
	for _, st := range strays {
		parts = append(parts, st.describe(now, holder))
	}
	r.add(name, false, "running jobs not attempted by their shard's holder, for more than %s: %s; the shard's holder hands them back within one renewal (%s)",
		2*renew, strings.Join(parts, "; "), renew)
}

// findStrays picks, from the running jobs grouped by shard queue and client,
// those of a client other than the shard's holder: the groups with old
// attempts, by shard and client, and how many younger attempts there are.
func findStrays(groups []jobs.RunningGroup, holder map[int]string) ([]stray, int) {
	var strays []stray
	young := 0
	for _, g := range groups {
		n, err := strconv.Atoi(strings.TrimPrefix(g.Queue, jobs.ShardQueuePrefix))
		if err != nil || jobs.ShardQueue(n) != g.Queue {
			continue
		}
		if h, ok := holder[n]; ok && h == g.Client {
			continue
		}
		young += g.Jobs - g.Old
		if g.Old > 0 {
			strays = append(strays, stray{shard: n, client: g.Client, old: g.Old, attemptedAt: g.OldestAttempt})
		}
	}
	sort.Slice(strays, func(i, j int) bool {
		if strays[i].shard != strays[j].shard {
			return strays[i].shard < strays[j].shard
		}
		return strays[i].client < strays[j].client
	})
	return strays, young
}

// describe says what st is and what to do about it.
func (st stray) describe(now time.Time, holder map[int]string) string {
	since := ""
	if st.attemptedAt != nil {
		since = fmt.Sprintf(", the oldest %s ago", now.Sub(*st.attemptedAt).Round(time.Second))
	}
	whose := fmt.Sprintf("none holds shard %d: start a worker for it", st.shard)
	if h, ok := holder[st.shard]; ok {
		whose = fmt.Sprintf("held by %s, which has not handed them back: is it stuck, or an older release?", h)
	}
	return fmt.Sprintf("shard %d: %s attempted by %s%s (%s)", st.shard, plural(st.old, "running job"), orDash(st.client), since, whose)
}

// doctorReconcilers checks that every kind of dirty key has a reconciler
// registered in this binary: keys of another kind wait forever.
func (s *Session) doctorReconcilers(ctx context.Context, db *pg.Pool, r *report) {
	const name = "reconcilers"
	reg, err := s.Registry()
	if err != nil {
		r.fail(name, err, "cannot build the registry")
		return
	}
	known := map[string]bool{}
	for _, k := range reg.Reconcilers() {
		known[k] = true
	}
	rows, err := db.Query(ctx, `SELECT kind, count(*) FROM compute_dirty GROUP BY kind ORDER BY kind`)
	if err != nil {
		r.fail(name, err, "cannot count the dirty keys")
		return
	}
	var unknown []string
	keys, kinds := 0, 0
	for rows.Next() {
		var kind string
		var n int
		if err := rows.Scan(&kind, &n); err != nil {
			rows.Close()
			r.fail(name, err, "cannot count the dirty keys")
			return
		}
		kinds++
		keys += n
		if !known[kind] {
			unknown = append(unknown, fmt.Sprintf("%s (%s)", kind, plural(n, "key")))
		}
	}
	if err := rows.Err(); err != nil {
		r.fail(name, err, "cannot count the dirty keys")
		return
	}
	if len(unknown) > 0 {
		r.add(name, false, "no registered reconciler handles the dirty keys of %s: a typo in workers.DirtyTx, or a module missing from this binary (registered: %s)",
			strings.Join(unknown, ", "), orNone(strings.Join(reg.Reconcilers(), ", ")))
		return
	}
	r.add(name, true, "%d reconcilers registered; %s dirty, of %d kinds, all handled", len(known), plural(keys, "key"), kinds)
}

// doctorWorkflows checks that every unfinished workflow has a live step job:
// one whose job was cancelled or deleted (in River UI, say) never advances.
func (s *Session) doctorWorkflows(ctx context.Context, db *pg.Pool, r *report) {
	const name = "workflows"
	stuck, total, err := workflow.FindStuck(ctx, db)
	if err != nil {
		r.fail(name, err, "cannot look for stuck workflows")
		return
	}
	if total == 0 {
		var unfinished int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM compute_workflows WHERE finished_at IS NULL`).Scan(&unfinished); err != nil {
			r.fail(name, err, "cannot count the workflows")
			return
		}
		r.add(name, true, "%s, each with a live step job", plural(unfinished, "unfinished workflow"))
		return
	}
	parts := make([]string, len(stuck))
	for i, w := range stuck {
		parts[i] = fmt.Sprintf("%s (%s at step %s, job %d %s)", w.ID, w.Kind, w.Step, w.JobID, w.JobState)
	}
	more := ""
	if total > len(stuck) {
		more = fmt.Sprintf(" and %d more", total-len(stuck))
	}
	r.add(name, false, "%s have no live step job and will never advance: %s%s (better-compute workflow retry ID gives one a new job; workflow cancel ID ends it)",
		plural(total, "unfinished workflow"), strings.Join(parts, "; "), more)
}

// plural is "1 key" or "n keys".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
