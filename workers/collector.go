package workers

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/migrate"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/workers/internal/lease"
	"github.com/bettercompute/bettercompute/workers/internal/riverjob"
)

// CollectTimeout bounds one scrape of a collector that reads the database.
const CollectTimeout = 5 * time.Second

// ShardHolders reads the unexpired shard leases: the owner of each held shard.
// Leases expire by compute_now(), the clock their holders renew them by
// (fallback, when it cannot be read). doctor's 'leases' check and
// WorkCollector read it. A failed listing returns its error and no holder.
func ShardHolders(ctx context.Context, db pg.DBTX, fallback time.Time) (map[int]string, error) {
	leases, err := lease.List(ctx, db, "shard/")
	now := fallback
	var dbNow time.Time
	_ = db.QueryRow(ctx, "SELECT compute_now()").Scan(&dbNow)
	if !dbNow.IsZero() {
		now = dbNow
	}
	holder := map[int]string{}
	for _, l := range leases {
		var n int
		if _, err := fmt.Sscanf(l.Name, "shard/%d", &n); err == nil && l.Name == ShardLease(n) && l.ExpiresAt.After(now) {
			holder[n] = l.Owner
		}
	}
	return holder, err
}

// WaitingByShard counts the work waiting for each shard's holder: available
// jobs of its queue and due dirty keys not yet claimed (shards with none are
// absent).
func WaitingByShard(ctx context.Context, db pg.DBTX) (map[int]int, error) {
	byQueue, err := riverjob.CountWaitingInShardQueues(ctx, db)
	waiting := map[int]int{}
	for q, c := range byQueue {
		var n int
		if _, err := fmt.Sscanf(q, jobs.ShardQueuePrefix+"%d", &n); err == nil && jobs.ShardQueue(n) == q {
			waiting[n] = c
		}
	}
	return waiting, err
}

// WorkCollector reports, on each scrape, what doctor's work checks read: how
// long the oldest due job of each queue has waited, how long the oldest
// running job of each queue and kind has run, and each shard's holder and
// waiting work. serve registers it. A query that fails makes its metrics
// invalid, so /metrics reports the error instead of leaving them out.
type WorkCollector struct {
	db            *pg.Pool
	oldestDue     *prometheus.Desc
	oldestRunning *prometheus.Desc
	shards        *prometheus.Desc
	held          *prometheus.Desc
	waiting       *prometheus.Desc
	unheld        *prometheus.Desc
	heartbeat     *prometheus.Desc
	deadAfter     *prometheus.Desc
	changes       *prometheus.Desc
}

// WorkersRecent is how long after its last heartbeat a worker that holds no
// lease is still reported (a process killed long ago drops out).
const WorkersRecent = 10 * time.Minute

// Worker is one worker identity's current incarnation as compute_workers and
// compute_leases say: its host and pid, how long it has been silent, the
// dead_after it declared and the leases it holds. Owner is its lease owner;
// Silenced says whether standbys may take its leases now.
type Worker = lease.Worker

// ListWorkers lists, by identity, the worker identities that have not stopped
// and either beat within recent (WorkersRecent for doctor and WorkCollector) or
// still hold an unexpired lease.
func ListWorkers(ctx context.Context, db pg.DBTX, recent time.Duration) ([]Worker, error) {
	return lease.Workers(ctx, db, recent)
}

// Takeover is how many leases changed hands for one reason since the database
// was created (Reason is one of the Takeover… constants), and the last of them.
type Takeover = lease.Takeover

// Why a lease changed hands: Takeover.Reason, and the reason label of the
// bettercompute_lease_changes_total metric.
const (
	// TakeoverRestart: a later incarnation of the holder's worker identity
	// took it (the identity restarted).
	TakeoverRestart = lease.ReasonRestart
	// TakeoverHeartbeatLost: the holder's heartbeat had stopped for longer
	// than the dead_after it declared.
	TakeoverHeartbeatLost = lease.ReasonHeartbeatLost
	// TakeoverLeaseExpired: the holding had expired without a renewal.
	TakeoverLeaseExpired = lease.ReasonLeaseExpired
	// TakeoverReleased: the holder had released it, or had stopped gracefully.
	TakeoverReleased = lease.ReasonReleased
)

// ListTakeovers returns the takeovers counted so far, one per reason, by
// reason.
func ListTakeovers(ctx context.Context, db pg.DBTX) ([]Takeover, error) {
	return lease.Takeovers(ctx, db)
}

// NewWorkCollector returns a collector reading db.
func NewWorkCollector(db *pg.Pool) *WorkCollector {
	return &WorkCollector{
		db: db,
		oldestDue: prometheus.NewDesc("bettercompute_queue_oldest_seconds",
			"Age of the oldest job due in a queue (available, or retryable and scheduled by now), by queue: how long work has waited.", []string{"queue"}, nil),
		oldestRunning: prometheus.NewDesc("bettercompute_running_oldest_seconds",
			"Time the oldest running job has run since its attempt began, by queue and kind.", []string{"queue", "kind"}, nil),
		shards: prometheus.NewDesc("bettercompute_shards", "The database's shard count.", nil, nil),
		held: prometheus.NewDesc("bettercompute_shard_held",
			"1 when a worker holds the shard's unexpired lease, 0 when none does, by shard queue.", []string{"queue"}, nil),
		waiting: prometheus.NewDesc("bettercompute_shard_waiting",
			"Work waiting for the shard's holder (available jobs and due dirty keys not yet claimed), by shard queue.", []string{"queue"}, nil),
		unheld: prometheus.NewDesc("bettercompute_shards_unheld_waiting",
			"Shards that no worker holds while work waits for them: that work waits until a worker takes the shard (doctor's 'leases' check).", nil, nil),
		heartbeat: prometheus.NewDesc("bettercompute_worker_heartbeat_age_seconds",
			"Time since each running worker's last heartbeat, by worker identity (workers that stopped, or that hold nothing and have not beaten for 10 minutes, are left out). Past its dead_after any standby takes its shards.", []string{"identity"}, nil),
		deadAfter: prometheus.NewDesc("bettercompute_worker_dead_after_seconds",
			"How long each running worker may be silent before any standby takes its shards (its heartbeat interval times the beats it may miss), by worker identity.", []string{"identity"}, nil),
		changes: prometheus.NewDesc("bettercompute_lease_changes_total",
			"Leases that changed hands since the database was created, across every process, by reason: restart, heartbeat_lost, lease_expired, released (doctor's 'takeovers' check).", []string{"reason"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *WorkCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.oldestDue, c.oldestRunning, c.shards, c.held, c.waiting, c.unheld, c.heartbeat, c.deadAfter, c.changes} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *WorkCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), CollectTimeout)
	defer cancel()
	if due, err := jobs.DueByQueue(ctx, c.db); err != nil {
		ch <- prometheus.NewInvalidMetric(c.oldestDue, fmt.Errorf("error reading the due jobs: %w", err))
	} else {
		for _, d := range due {
			ch <- prometheus.MustNewConstMetric(c.oldestDue, prometheus.GaugeValue, d.Oldest.Seconds(), d.Queue)
		}
	}
	if running, err := riverjob.OldestRunning(ctx, c.db); err != nil {
		ch <- prometheus.NewInvalidMetric(c.oldestRunning, fmt.Errorf("error reading the running jobs: %w", err))
	} else {
		for _, r := range running {
			ch <- prometheus.MustNewConstMetric(c.oldestRunning, prometheus.GaugeValue, r.Oldest.Seconds(), r.Queue, r.Kind)
		}
	}
	c.collectShards(ctx, ch)
	c.collectWorkers(ctx, ch)
}

// collectWorkers reports each running worker's heartbeat age and dead_after,
// and the leases that changed hands by reason.
func (c *WorkCollector) collectWorkers(ctx context.Context, ch chan<- prometheus.Metric) {
	if ws, err := lease.Workers(ctx, c.db, WorkersRecent); err != nil {
		err = fmt.Errorf("error reading the workers: %w", err)
		ch <- prometheus.NewInvalidMetric(c.heartbeat, err)
		ch <- prometheus.NewInvalidMetric(c.deadAfter, err)
	} else {
		for _, w := range ws {
			ch <- prometheus.MustNewConstMetric(c.heartbeat, prometheus.GaugeValue, w.Silent.Seconds(), w.Identity)
			ch <- prometheus.MustNewConstMetric(c.deadAfter, prometheus.GaugeValue, w.DeadAfter.Seconds(), w.Identity)
		}
	}
	ts, err := lease.Takeovers(ctx, c.db)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.changes, fmt.Errorf("error reading the takeovers: %w", err))
		return
	}
	for _, t := range ts {
		ch <- prometheus.MustNewConstMetric(c.changes, prometheus.CounterValue, float64(t.Count), t.Reason)
	}
}

// collectShards reports the shard count and each shard's holder and waiting work.
func (c *WorkCollector) collectShards(ctx context.Context, ch chan<- prometheus.Metric) {
	count, err := migrate.ShardCount(ctx, c.db)
	var holder map[int]string
	var waiting map[int]int
	if err == nil {
		holder, err = ShardHolders(ctx, c.db, time.Now())
	}
	if err == nil {
		waiting, err = WaitingByShard(ctx, c.db)
	}
	if err != nil {
		err = fmt.Errorf("error reading the shards: %w", err)
		for _, d := range []*prometheus.Desc{c.shards, c.held, c.waiting, c.unheld} {
			ch <- prometheus.NewInvalidMetric(d, err)
		}
		return
	}
	ch <- prometheus.MustNewConstMetric(c.shards, prometheus.GaugeValue, float64(count))
	unheld := 0
	for i := 0; i < count; i++ {
		q := jobs.ShardQueue(i)
		_, ok := holder[i]
		held := 0.0
		if ok {
			held = 1
		} else if waiting[i] > 0 {
			unheld++
		}
		ch <- prometheus.MustNewConstMetric(c.held, prometheus.GaugeValue, held, q)
		ch <- prometheus.MustNewConstMetric(c.waiting, prometheus.GaugeValue, float64(waiting[i]), q)
	}
	ch <- prometheus.MustNewConstMetric(c.unheld, prometheus.GaugeValue, float64(unheld))
}
