package outboxworker

import (
	"context"
	"fmt"
	"sort"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/bettercompute/bettercompute/domain/outbox"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/workers"
)

// Collector reports, on each scrape, the outbox as the database has it: each
// sink's lag (the events after its cursor and the age of the first),
// whether it is paused and its failures in a row; each registered
// dispatcher's backlog and failing keys; and what holds every reader back (the
// oldest write transaction on the server, the events it holds back). serve
// registers it. A query that fails makes its metrics invalid, so /metrics
// reports the error instead of leaving them out.
type Collector struct {
	db          *pg.Pool
	dispatchers []passer

	lagEvents, lagSeconds, paused, failures *prometheus.Desc
	backlog, failing                        *prometheus.Desc
	oldestXact, heldBack                    *prometheus.Desc
}

// NewCollector returns a collector reading db, for the dispatchers registered
// in reg (sinks are read from the database: every sink with state).
func NewCollector(db *pg.Pool, reg *workers.Registry) (*Collector, error) {
	c := &Collector{db: db,
		lagEvents: prometheus.NewDesc("bettercompute_outbox_sink_lag_events",
			fmt.Sprintf("Events after the sink's cursor, not yet delivered (counted up to %d), by sink.", outbox.LagCap), []string{"sink"}, nil),
		lagSeconds: prometheus.NewDesc("bettercompute_outbox_sink_lag_seconds",
			"Age of the oldest readable event the sink has not delivered (0 when none), by sink.", []string{"sink"}, nil),
		paused: prometheus.NewDesc("bettercompute_outbox_sink_paused",
			"1 when the sink is paused (better-compute outbox pause), by sink.", []string{"sink"}, nil),
		failures: prometheus.NewDesc("bettercompute_outbox_sink_failures",
			"The sink's failed deliveries in a row (0 after a success), by sink.", []string{"sink"}, nil),
		backlog: prometheus.NewDesc("bettercompute_outbox_dispatcher_backlog",
			fmt.Sprintf("Rows waiting in the dispatcher's outbox table (counted up to %d), by dispatcher.", outbox.StatsCap), []string{"dispatcher"}, nil),
		failing: prometheus.NewDesc("bettercompute_outbox_dispatcher_failing_keys",
			"Keys of the dispatcher's table with a row whose publish failed and waits for its retry, by dispatcher.", []string{"dispatcher"}, nil),
		oldestXact: prometheus.NewDesc("bettercompute_outbox_oldest_write_transaction_seconds",
			"Age of the oldest write transaction open anywhere on the server (whose start this role may see): every outbox reader waits for it (doctor's 'snapshot' check).", nil, nil),
		heldBack: prometheus.NewDesc("bettercompute_outbox_events_held_back",
			"Committed events of this database no outbox reader may read yet, held back by the oldest open write transaction.", nil, nil),
	}
	if reg != nil {
		st, err := stateOf(reg)
		if err != nil {
			return nil, err
		}
		st.mu.Lock()
		for _, d := range st.dispatchers {
			c.dispatchers = append(c.dispatchers, d)
		}
		st.mu.Unlock()
		sort.Slice(c.dispatchers, func(i, j int) bool { return c.dispatchers[i].Name() < c.dispatchers[j].Name() })
	}
	return c, nil
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.lagEvents, c.lagSeconds, c.paused, c.failures, c.backlog, c.failing, c.oldestXact, c.heldBack} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), workers.CollectTimeout)
	defer cancel()
	invalid := func(err error, ds ...*prometheus.Desc) {
		for _, d := range ds {
			ch <- prometheus.NewInvalidMetric(d, err)
		}
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	if sinks, err := outbox.ListSinks(ctx, c.db); err != nil {
		invalid(err, c.lagEvents, c.lagSeconds, c.paused, c.failures)
	} else {
		for _, s := range sinks {
			gauge(c.lagEvents, float64(s.LagRows), s.Name)
			gauge(c.lagSeconds, s.LagAge.Seconds(), s.Name)
			gauge(c.paused, b2f(s.Paused), s.Name)
			gauge(c.failures, float64(s.Failures), s.Name)
		}
	}
	for _, d := range c.dispatchers {
		st, err := d.stats(ctx, c.db)
		if err != nil {
			invalid(fmt.Errorf("dispatcher %s: %w", d.Name(), err), c.backlog, c.failing)
			continue
		}
		gauge(c.backlog, float64(st.Backlog), d.Name())
		gauge(c.failing, float64(st.FailingKeys), d.Name())
	}
	if age, _, err := outbox.OldestWriteXact(ctx, c.db); err != nil {
		invalid(fmt.Errorf("error listing the open write transactions: %w", err), c.oldestXact)
	} else {
		gauge(c.oldestXact, age.Seconds())
	}
	if _, n, err := outbox.HeldBack(ctx, c.db); err != nil {
		invalid(fmt.Errorf("error counting the events held back: %w", err), c.heldBack)
	} else {
		gauge(c.heldBack, float64(n))
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
