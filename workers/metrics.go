package workers

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/pg"
)

// Metrics are a worker process's Prometheus metrics. The zero value records
// nothing; NewMetrics registers them.
type Metrics struct {
	jobs        *prometheus.CounterVec
	jobSeconds  *prometheus.HistogramVec
	reconcile   *prometheus.HistogramVec
	latency     *prometheus.HistogramVec
	leasesHeld  prometheus.Gauge
	fences      *prometheus.CounterVec
	handedBackN prometheus.Counter
	takeovers   *prometheus.CounterVec
	reg         prometheus.Registerer
}

// Registerer is where these metrics are registered (nil for the zero value):
// modules register their own worker metrics there.
func (m *Metrics) Registerer() prometheus.Registerer { return m.reg }

// NewMetrics creates the worker metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		jobs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bettercompute_jobs_total",
			Help: "Jobs worked by this process, by kind, queue and outcome (completed, failed, cancelled, snoozed, fenced, panicked).",
		}, []string{"kind", "queue", "outcome"}),
		jobSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "bettercompute_job_duration_seconds",
			Help:    "Time to work one job, by kind.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"kind"}),
		reconcile: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "bettercompute_reconcile_duration_seconds",
			Help:    "Time of one reconcile's fenced transaction, by reconciler.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"reconciler"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "bettercompute_reconcile_latency_seconds",
			Help:    "Time from a key's first Dirty to the commit of its reconcile, by reconciler.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 18),
		}, []string{"reconciler"}),
		leasesHeld: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "bettercompute_leases_held",
			Help: "Shard leases this process holds.",
		}),
		fences: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bettercompute_fence_rejections_total",
			Help: "Fenced transactions refused because the lease or the job attempt was no longer current, by queue.",
		}, []string{"queue"}),
		handedBackN: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "bettercompute_jobs_handed_back_total",
			Help: "Running jobs of a previous shard holder handed back to the queue at takeover.",
		}),
		takeovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bettercompute_lease_takeovers_total",
			Help: "Shard leases this process took over from another holder, by shard queue and reason: restart (a later incarnation of the holder's identity), heartbeat_lost (the holder's heartbeat had stopped), lease_expired, released (the holder released it or stopped).",
		}, []string{"queue", "reason"}),
	}
	m.reg = reg
	reg.MustRegister(m.jobs, m.jobSeconds, m.reconcile, m.latency, m.leasesHeld, m.fences, m.handedBackN, m.takeovers)
	return m
}

func (m *Metrics) jobDone(kind, queue, outcome string, took time.Duration) {
	if m.jobs == nil {
		return
	}
	m.jobs.WithLabelValues(kind, queue, outcome).Inc()
	if took > 0 {
		m.jobSeconds.WithLabelValues(kind).Observe(took.Seconds())
	}
}

func (m *Metrics) reconciled(kind string, took, latency time.Duration) {
	if m.reconcile == nil {
		return
	}
	m.reconcile.WithLabelValues(kind).Observe(took.Seconds())
	if latency > 0 {
		m.latency.WithLabelValues(kind).Observe(latency.Seconds())
	}
}

func (m *Metrics) leases(n int) {
	if m.leasesHeld != nil {
		m.leasesHeld.Set(float64(n))
	}
}

func (m *Metrics) fenced(queue string) {
	if m.fences != nil {
		m.fences.WithLabelValues(queue).Inc()
	}
}

// tookOver counts an acquired shard lease taken from another holder, by why
// it could be taken (lease.Reason…); reason "" is no takeover.
func (m *Metrics) tookOver(queue, reason string) {
	if m.takeovers != nil && reason != "" {
		m.takeovers.WithLabelValues(queue, reason).Inc()
	}
}

func (m *Metrics) handedBack(n int64) {
	if m.handedBackN != nil {
		m.handedBackN.Add(float64(n))
	}
}

// QueueCollector reports, on each scrape, the jobs per queue and state and the
// shard leases per owner, read from the database.
type QueueCollector struct {
	DB      *pg.Pool
	depth   *prometheus.Desc
	leases  *prometheus.Desc
	timeout time.Duration
}

// NewQueueCollector returns a collector reading db.
func NewQueueCollector(db *pg.Pool) *QueueCollector {
	return &QueueCollector{
		DB:      db,
		depth:   prometheus.NewDesc("bettercompute_queue_jobs", "River jobs not yet finished, by queue and state.", []string{"queue", "state"}, nil),
		leases:  prometheus.NewDesc("bettercompute_leases", "Unexpired leases, by owner and kind (shard, sink, …).", []string{"owner", "kind"}, nil),
		timeout: 5 * time.Second,
	}
}

// Describe implements prometheus.Collector.
func (c *QueueCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.depth; ch <- c.leases }

// Collect implements prometheus.Collector. A query that fails is reported as
// an invalid metric, so /metrics logs it rather than leaving a family out
// without a word.
func (c *QueueCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	counts, err := jobs.CountUnfinished(ctx, c.DB)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.depth, fmt.Errorf("error counting unfinished jobs: %w", err))
	}
	for _, n := range counts {
		ch <- prometheus.MustNewConstMetric(c.depth, prometheus.GaugeValue, float64(n.Jobs), n.Queue, n.State)
	}
	type held struct {
		owner, kind string
		n           int64
	}
	rows, err := c.DB.Query(ctx, `SELECT owner, split_part(name, '/', 1), count(*) FROM compute_leases
		WHERE expires_at > compute_now() GROUP BY 1, 2`)
	var got []held
	if err == nil {
		got, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (held, error) {
			var h held
			return h, r.Scan(&h.owner, &h.kind, &h.n)
		})
	}
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.leases, fmt.Errorf("error counting leases: %w", err))
		return
	}
	for _, h := range got {
		ch <- prometheus.MustNewConstMetric(c.leases, prometheus.GaugeValue, float64(h.n), h.owner, h.kind)
	}
}
