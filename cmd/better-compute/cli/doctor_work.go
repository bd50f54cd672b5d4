package cli

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/bettercompute/bettercompute/domain/lease"
	"github.com/bettercompute/bettercompute/platform/migrate"
	"github.com/bettercompute/bettercompute/platform/pg"
)

// StuckAfter is how long a job may sit available in a queue, or run, before
// doctor calls it stuck.
const StuckAfter = 5 * time.Minute

// doctorWork checks the work side: the shard count, who holds the shards, jobs
// stuck running, and the queues' depth.
func (s *Session) doctorWork(ctx context.Context, db *pg.Pool) []Check {
	var out []Check
	add := func(name string, ok bool, format string, args ...any) {
		out = append(out, Check{Name: name, OK: ok, Detail: fmt.Sprintf(format, args...)})
	}
	count, err := migrate.ShardCount(ctx, db)
	if err != nil {
		add("shards", false, "%v", err)
		return out
	}
	if count != s.Config.ShardCount {
		add("shards", false, "the database has %d shards, BETTER_COMPUTE_SHARD_COUNT says %d: the count is fixed at the first migrate; set it to %d", count, s.Config.ShardCount, count)
	} else {
		add("shards", true, "%d shards, as configured", count)
	}

	// Shard leases and their owners; a shard with waiting work and no holder is stuck.
	leases, err := lease.List(ctx, db, "shard/")
	if err != nil {
		add("leases", false, "%v", err)
		return out
	}
	now := time.Now()
	var dbNow time.Time
	_ = db.QueryRow(ctx, "SELECT compute_now()").Scan(&dbNow)
	if !dbNow.IsZero() {
		now = dbNow
	}
	held := map[int]bool{}
	owners := map[string]int{}
	for _, l := range leases {
		var n int
		if _, err := fmt.Sscanf(l.Name, "shard/%d", &n); err == nil && l.ExpiresAt.After(now) {
			held[n] = true
			owners[l.Owner]++
		}
	}
	waiting := map[int]int{}
	rows, err := db.Query(ctx, `SELECT queue, count(*) FROM river_job WHERE state = 'available' AND queue LIKE 'shard\_%' GROUP BY 1`)
	if err == nil {
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

	// Queue depth: what waits, and for how long.
	type depth struct {
		queue  string
		n      int
		oldest time.Duration
	}
	var depths []depth
	rows, err = db.Query(ctx, `SELECT queue, count(*), extract(epoch FROM compute_now() - min(scheduled_at))
		FROM river_job WHERE state IN ('available', 'retryable') AND scheduled_at <= compute_now() GROUP BY 1 ORDER BY 2 DESC`)
	if err != nil {
		add("queues", false, "%v", err)
		return out
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
	return out
}
