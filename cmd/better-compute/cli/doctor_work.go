package cli

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/bettercompute/bettercompute/domain/lease"
	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/migrate"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/workers"
)

// StuckAfter is how long a job may sit available in a queue, or run, before
// doctor calls it stuck.
const StuckAfter = 5 * time.Minute

// doctorWork checks the work side: the shard count, who holds the shards, jobs
// stuck running, running jobs outside their shard's holder, the queues' depth,
// and dirty keys no reconciler handles. now is the server's clock.
func (s *Session) doctorWork(ctx context.Context, db *pg.Pool, r *report, now time.Time) {
	add := r.add
	count, err := migrate.ShardCount(ctx, db)
	if err != nil {
		r.fail("shards", err, "")
		return
	}
	if count != s.Config.ShardCount {
		add("shards", false, "the database has %d shards, BETTER_COMPUTE_SHARD_COUNT says %d: the count is fixed at the first migrate; set it to %d", count, s.Config.ShardCount, count)
	} else {
		add("shards", true, "%d shards, as configured", count)
	}

	// Shard leases and their owners; a shard with waiting work and no holder is stuck.
	// Leases expire by compute_now(), the clock their holders renew them by.
	leases, leaseErr := lease.List(ctx, db, "shard/")
	leaseNow := now
	var dbNow time.Time
	_ = db.QueryRow(ctx, "SELECT compute_now()").Scan(&dbNow)
	if !dbNow.IsZero() {
		leaseNow = dbNow
	}
	held := map[int]bool{}
	holder := map[int]string{} // shard -> owner of its unexpired lease
	owners := map[string]int{}
	for _, l := range leases {
		var n int
		if _, err := fmt.Sscanf(l.Name, "shard/%d", &n); err == nil && l.Name == workers.ShardLease(n) && l.ExpiresAt.After(leaseNow) {
			held[n] = true
			holder[n] = l.Owner
			owners[l.Owner]++
		}
	}
	waiting := map[int]int{}
	rows, waitErr := db.Query(ctx, `SELECT queue, count(*) FROM river_job WHERE state = 'available' AND queue LIKE 'shard\_%' GROUP BY 1`)
	if waitErr == nil {
		for rows.Next() {
			var q string
			var c int
			var n int
			if rows.Scan(&q, &c) == nil {
				if _, err := fmt.Sscanf(q, "shard_%d", &n); err == nil {
					waiting[n] = c
				}
			}
		}
		rows.Close()
		waitErr = rows.Err()
	}
	var unheld, stuck []string
	for i := 0; i < count; i++ {
		if !held[i] {
			unheld = append(unheld, fmt.Sprint(i))
			if waiting[i] > 0 {
				stuck = append(stuck, fmt.Sprintf("%d (%d jobs waiting)", i, waiting[i]))
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
		r.fail("leases", leaseErr, "cannot list the shard leases")
	case waitErr != nil:
		r.fail("leases", waitErr, "cannot count the jobs waiting")
	case len(stuck) > 0:
		add("leases", false, "no worker holds shard %s: start better-compute worker for them", strings.Join(stuck, ", "))
	case len(unheld) == count:
		add("leases", true, "no worker holds any shard (no work is waiting)")
	case len(unheld) > 0:
		add("leases", true, "%d/%d shards held by %s; unheld (no work waiting): %s", count-len(unheld), count, strings.Join(ownerList, ", "), strings.Join(unheld, ","))
	default:
		add("leases", true, "%d/%d shards held by %s", count, count, strings.Join(ownerList, ", "))
	}

	// Jobs running for longer than they may: their process died or is wedged.
	var runningLong int
	var oldestRunning *time.Time
	_ = db.QueryRow(ctx, `SELECT count(*), min(attempted_at) FROM river_job
		WHERE state = 'running' AND attempted_at < compute_now() - make_interval(secs => $1)`, StuckAfter.Seconds()).Scan(&runningLong, &oldestRunning)
	if runningLong > 0 {
		add("running", false, "%d jobs running for more than %s (oldest since %s): their worker died or hangs; a new shard holder hands them back", runningLong, StuckAfter, oldestRunning.Format(time.RFC3339))
	} else {
		var running int
		_ = db.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE state = 'running'`).Scan(&running)
		add("running", true, "%d jobs running, none for more than %s", running, StuckAfter)
	}

	s.doctorStrays(ctx, db, r, now, holder)

	s.doctorQueues(ctx, db, r)
	s.doctorReconcilers(ctx, db, r)
}

// doctorQueues checks the queues' depth: what waits, and for how long.
func (s *Session) doctorQueues(ctx context.Context, db *pg.Pool, r *report) {
	add := r.add
	type depth struct {
		queue  string
		n      int
		oldest time.Duration
	}
	var depths []depth
	rows, err := db.Query(ctx, `SELECT queue, count(*), extract(epoch FROM compute_now() - min(scheduled_at))
		FROM river_job WHERE state IN ('available', 'retryable') AND scheduled_at <= compute_now() GROUP BY 1 ORDER BY 2 DESC`)
	if err != nil {
		r.fail("queues", err, "")
		return
	}
	for rows.Next() {
		var d depth
		var secs float64
		if rows.Scan(&d.queue, &d.n, &secs) == nil {
			d.oldest = time.Duration(secs * float64(time.Second))
			depths = append(depths, d)
		}
	}
	rows.Close()
	total, late := 0, []string{}
	for _, d := range depths {
		total += d.n
		if d.oldest > StuckAfter {
			late = append(late, fmt.Sprintf("%s: %d waiting, oldest %s", d.queue, d.n, d.oldest.Round(time.Second)))
		}
	}
	switch {
	case len(late) > 0:
		add("queues", false, "work waits longer than %s: %s", StuckAfter, strings.Join(late, "; "))
	case total == 0:
		add("queues", true, "no job is waiting")
	default:
		add("queues", true, "%d jobs due in %d queues, none waiting longer than %s", total, len(depths), StuckAfter)
	}
}

// strayRunSQL groups the running jobs of shard queues by queue and by the client
// that last attempted them; $1 is the cut-off before which an attempt is old.
const strayRunSQL = `
SELECT queue, coalesce(attempted_by[array_length(attempted_by, 1)], ''),
       count(*), count(*) FILTER (WHERE attempted_at IS NULL OR attempted_at < $1), min(attempted_at)
FROM river_job
WHERE state = 'running' AND queue ~ '^shard_[0-9]+$'
GROUP BY 1, 2`

// stray is the running jobs of one shard attempted by one client other than the
// shard's holder.
type stray struct {
	shard       int
	client      string
	n, old      int
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
	cutoff := now.Add(-2 * renew)
	rows, err := db.Query(ctx, strayRunSQL, cutoff)
	if err != nil {
		r.fail(name, err, "cannot list the running jobs")
		return
	}
	var strays []stray
	young := 0
	for rows.Next() {
		var q string
		var st stray
		if err := rows.Scan(&q, &st.client, &st.n, &st.old, &st.attemptedAt); err != nil {
			rows.Close()
			r.fail(name, err, "cannot list the running jobs")
			return
		}
		n, err := strconv.Atoi(strings.TrimPrefix(q, "shard_"))
		if err != nil || jobs.ShardQueue(n) != q {
			continue
		}
		st.shard = n
		if h, ok := holder[n]; ok && h == st.client {
			continue
		}
		young += st.n - st.old
		if st.old > 0 {
			strays = append(strays, st)
		}
	}
	if err := rows.Err(); err != nil {
		r.fail(name, err, "cannot list the running jobs")
		return
	}
	if len(strays) == 0 {
		if young > 0 {
			r.add(name, true, "%s attempted by a client that does not hold the shard, for less than %s: the shard's holder hands them back within one renewal (%s)", plural(young, "running job"), 2*renew, renew)
		} else {
			r.add(name, true, "every running job of a shard queue was attempted by the shard's holder")
		}
		return
	}
	sort.Slice(strays, func(i, j int) bool {
		if strays[i].shard != strays[j].shard {
			return strays[i].shard < strays[j].shard
		}
		return strays[i].client < strays[j].client
	})
	parts := make([]string, 0, len(strays))
	for _, st := range strays {
		since := ""
		if st.attemptedAt != nil {
			since = fmt.Sprintf(", the oldest %s ago", now.Sub(*st.attemptedAt).Round(time.Second))
		}
		whose := fmt.Sprintf("none holds shard %d: start a worker for it", st.shard)
		if h, ok := holder[st.shard]; ok {
			whose = fmt.Sprintf("held by %s, which has not handed them back: is it stuck, or an older release?", h)
		}
		parts = append(parts, fmt.Sprintf("shard %d: %s attempted by %s%s (%s)", st.shard, plural(st.old, "running job"), orDash(st.client), since, whose))
	}
	r.add(name, false, "running jobs not attempted by their shard's holder, for more than %s: %s; the shard's holder hands them back within one renewal (%s)",
		2*renew, strings.Join(parts, "; "), renew)
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
		r.add(name, false, "no registered reconciler handles the dirty keys of %s: a typo in jobs.Dirty, or a module missing from this binary (registered: %s)",
			strings.Join(unknown, ", "), orNone(strings.Join(reg.Reconcilers(), ", ")))
		return
	}
	r.add(name, true, "%d reconcilers registered; %s dirty, of %d kinds, all handled", len(known), plural(keys, "key"), kinds)
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
