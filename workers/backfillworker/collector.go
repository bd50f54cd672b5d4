package backfillworker

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/bettercompute/bettercompute/domain/backfill"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/workers"
)

// Collector reports, on each scrape, every backfill's progress as
// compute_backfills has it (what `better-compute backfill status` shows): rows
// done and the estimated total of its current run, and whether a running one
// has stalled. serve registers it. A failed read makes the metrics invalid.
type Collector struct {
	db                        *pg.Pool
	done, total, stalled, err *prometheus.Desc
}

// NewCollector returns a collector reading db.
func NewCollector(db *pg.Pool) *Collector {
	return &Collector{db: db,
		done: prometheus.NewDesc("bettercompute_backfill_rows_done",
			"Rows the backfill's current run has handled, by backfill and state (pending, running, paused, cancelled, done).", []string{"backfill", "state"}, nil),
		total: prometheus.NewDesc("bettercompute_backfill_rows_estimate",
			"Estimated rows of the backfill's current run (done plus left), by backfill; absent until the first estimate.", []string{"backfill"}, nil),
		stalled: prometheus.NewDesc("bettercompute_backfill_stalled",
			"1 when a running backfill has no live batch job (River discarded or an operator cancelled it: backfill resume carries it on), by backfill.", []string{"backfill"}, nil),
		err: prometheus.NewDesc("bettercompute_backfill_errors",
			"Failed batch attempts of the backfill's current run, by backfill.", []string{"backfill"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.done
	ch <- c.total
	ch <- c.stalled
	ch <- c.err
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), workers.CollectTimeout)
	defer cancel()
	ps, err := backfill.List(ctx, c.db)
	if err != nil {
		err = fmt.Errorf("error reading the backfills: %w", err)
		for _, d := range []*prometheus.Desc{c.done, c.total, c.stalled, c.err} {
			ch <- prometheus.NewInvalidMetric(d, err)
		}
		return
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	for _, p := range ps {
		gauge(c.done, float64(p.RowsDone), p.Name, string(p.State))
		if total, ok := p.Total(); ok {
			gauge(c.total, float64(total), p.Name)
		}
		stalled := 0.0
		if p.Stalled() {
			stalled = 1
		}
		gauge(c.stalled, stalled, p.Name)
		gauge(c.err, float64(p.Errors), p.Name)
	}
}
