package workflowworker

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/bettercompute/bettercompute/domain/workflow"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/workers"
)

// StepCollector reports, on each scrape, the workflows stuck on a step: how
// long the oldest unfinished workflow has been due on its step, by kind and
// step, and how many unfinished workflows have no live step job (doctor's
// 'workflows' check). serve registers it beside Collector.
type StepCollector struct {
	db        *pg.Pool
	oldest    *prometheus.Desc
	due       *prometheus.Desc
	withoutJb *prometheus.Desc
}

// NewStepCollector returns a StepCollector reading db.
func NewStepCollector(db *pg.Pool) *StepCollector {
	return &StepCollector{db: db,
		oldest: prometheus.NewDesc("bettercompute_workflow_step_oldest_seconds",
			"How long the oldest unfinished workflow has been due on its current step (running or cancelling: since the step was set; sleeping or waiting: since its wake-up time passed), by workflow kind and step.",
			[]string{"workflow", "step"}, nil),
		due: prometheus.NewDesc("bettercompute_workflow_steps_due",
			"Unfinished workflows whose current step is due, by workflow kind and step.", []string{"workflow", "step"}, nil),
		withoutJb: prometheus.NewDesc("bettercompute_workflows_without_job",
			"Unfinished workflows whose step job is no longer live (cancelled or deleted): they never advance until workflow retry (doctor's 'workflows' check).", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *StepCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.oldest
	ch <- c.due
	ch <- c.withoutJb
}

// Collect implements prometheus.Collector.
func (c *StepCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), workers.CollectTimeout)
	defer cancel()
	if ages, err := workflow.DueSteps(ctx, c.db); err != nil {
		ch <- prometheus.NewInvalidMetric(c.oldest, err)
		ch <- prometheus.NewInvalidMetric(c.due, err)
	} else {
		for _, a := range ages {
			ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, a.Oldest.Seconds(), a.Kind, a.Step)
			ch <- prometheus.MustNewConstMetric(c.due, prometheus.GaugeValue, float64(a.Workflows), a.Kind, a.Step)
		}
	}
	if _, total, err := workflow.FindStuck(ctx, c.db); err != nil {
		ch <- prometheus.NewInvalidMetric(c.withoutJb, fmt.Errorf("error looking for workflows without a live step job: %w", err))
	} else {
		ch <- prometheus.MustNewConstMetric(c.withoutJb, prometheus.GaugeValue, float64(total))
	}
}
