// Package workflowworker runs durable workflows (domain/workflow) in worker
// processes: the step worker (one River job per step, fenced three ways), the
// timer wake-ups on compute_now(), retention, the versioning check at start,
// and the registration an application's module uses (Add).
//
//	Register: func(r *workers.Registry) error {
//		return workers.AddWorkflow(r, Order)
//	}
package workflowworker

import (
	"context"
	"errors"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/rs/zerolog"

	"github.com/bettercompute/bettercompute/domain/workflow"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/internal/riverjob"
)

// Options configure the workflow machinery of a worker process.
type Options struct {
	// Retention is how long finished workflows and their history are kept
	// (default 7 days); PruneEvery how often they are pruned (default 10 min).
	Retention  time.Duration
	PruneEvery time.Duration
	// WakeEvery is how often each worker process wakes the jobs of sleeping
	// and waiting workflows whose deadline has come on compute_now()
	// (default 1 s).
	WakeEvery time.Duration
	// InlineSteps and InlineFor are the budget of one step job: when a step
	// commits a move to another step at once (Goto, or an OnError step), the
	// same job execution runs that step, in a fenced transaction of its own,
	// while it has run fewer than InlineSteps steps (default 100) for less
	// than InlineFor (default 1 s) and its shard lease holds; past the budget,
	// or at a sleep, a wait, children or the finish, the next step gets a job
	// of its own as before. InlineSteps 1 gives every step its own job.
	InlineSteps int
	InlineFor   time.Duration
}

// Defaults of Options.
const (
	defaultRetention   = 7 * 24 * time.Hour
	DefaultPruneEvery  = 10 * time.Minute
	DefaultWakeEvery   = time.Second
	DefaultInlineSteps = 100
	DefaultInlineFor   = time.Second
)

// part is a registry's workflow machinery: its definitions and options.
type part struct {
	mu      sync.Mutex
	defs    map[string]workflow.Definition
	meta    map[string]workflow.Meta // each definition's, made once at Add
	order   []string
	opts    Options
	metrics *metrics
	// afterStep, set by tests, runs after a step's function and before its
	// transaction commits (nil in production).
	afterStep func(ctx context.Context, args riverjob.WorkflowStep)
}

func newPart() *part {
	return &part{defs: map[string]workflow.Definition{}, meta: map[string]workflow.Meta{}, opts: Options{
		Retention: defaultRetention, PruneEvery: DefaultPruneEvery, WakeEvery: DefaultWakeEvery,
		InlineSteps: DefaultInlineSteps, InlineFor: DefaultInlineFor,
	}}
}

// Install implements workers.Part.
func (p *part) Install(r *workers.Registry) error {
	return errors.Join(
		workers.OnAdd(r, p.add),
		workers.AddWorker(r, &stepWorker{p: p}),
		workers.AddMaintenanceWorker(r, &pruneWorker{p: p}),
		workers.AddPeriodic(r, river.NewPeriodicJob(pruneSchedule{p},
			func() (river.JobArgs, *river.InsertOpts) { return riverjob.WorkflowPrune{}, nil },
			nil, // not at start: River's leader would enqueue one at every election
		)),
		func() error {
			r.OnRecord(func(ctx context.Context, db pg.DBTX) error { return workflow.RecordKinds(ctx, db, p.metas()) })
			r.OnCheck(func(ctx context.Context, db pg.DBTX) error { return workflow.CheckDefinitions(ctx, db, p.metas()) })
			r.OnStart(func(ctx context.Context, rt *workers.Runtime) error {
				p.metricsFor(rt)
				go p.wakeLoop(ctx, rt)
				return nil
			})
			return nil
		}(),
	)
}

// Register installs the workflow machinery in r, with o's options (nil: the
// defaults; zero fields keep what they were): the built-in module's
// registration, which cli.App makes before an application's modules. An
// application that sets options calls it again from its own Register. It
// returns INVALID_CONFIG for a negative duration or step count.
func Register(r *workers.Registry, o *Options) error {
	p, err := workers.Use(r, newPart)
	if err != nil || o == nil {
		return err
	}
	return p.configure(*o)
}

func (p *part) configure(o Options) error {
	if o.Retention < 0 || o.PruneEvery < 0 || o.WakeEvery < 0 || o.InlineFor < 0 {
		return fault.New(fault.InvalidConfig, "workflow options: a negative duration")
	}
	if o.InlineSteps < 0 {
		return fault.New(fault.InvalidConfig, "workflow options: InlineSteps %d is negative (1 runs every step in a job of its own)", o.InlineSteps)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if o.Retention > 0 {
		p.opts.Retention = o.Retention
	}
	if o.PruneEvery > 0 {
		p.opts.PruneEvery = o.PruneEvery
	}
	if o.WakeEvery > 0 {
		p.opts.WakeEvery = o.WakeEvery
	}
	if o.InlineSteps > 0 {
		p.opts.InlineSteps = o.InlineSteps
	}
	if o.InlineFor > 0 {
		p.opts.InlineFor = o.InlineFor
	}
	return nil
}

// options are the options in force.
func (p *part) options() Options {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.opts
}

// add is the module's OnAdd for workers.AddWorkflow.
func (p *part) add(d workflow.Definition) error {
	if d == nil {
		return fault.New(fault.InvalidConfig, "workers.AddWorkflow: nil definition")
	}
	if err := d.Validate(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	m := d.Meta()
	kind := m.Kind
	if _, dup := p.defs[kind]; dup {
		return fault.New(fault.InvalidConfig, "workflow %s is registered twice", kind)
	}
	p.defs[kind], p.meta[kind] = d, m
	p.order = append(p.order, kind)
	return nil
}

// Definitions returns the workflow definitions registered in r, by kind.
func Definitions(r *workers.Registry) map[string]workflow.Definition {
	p, err := workers.Use(r, newPart)
	if err != nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]workflow.Definition, len(p.defs))
	for k, d := range p.defs {
		out[k] = d
	}
	return out
}

func (p *part) metas() []workflow.Meta {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]workflow.Meta, 0, len(p.order))
	for _, k := range p.order {
		out = append(out, p.meta[k])
	}
	return out
}

// def returns kind's definition and its Meta (nil for an unknown kind).
func (p *part) def(kind string) (workflow.Definition, workflow.Meta) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.defs[kind], p.meta[kind]
}

// wakeLoop wakes the due timers every WakeEvery until the runtime stops.
func (p *part) wakeLoop(ctx context.Context, rt *workers.Runtime) {
	t := time.NewTicker(p.opts.WakeEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := workflow.WakeDue(ctx, rt.Pool())
		if err != nil && ctx.Err() == nil {
			log(rt).Debug().Err(err).Msg("could not wake due workflows; retrying")
		} else if n > 0 {
			log(rt).Debug().Int64("woken", n).Msg("woke workflows whose deadline came")
		}
	}
}

// pruneSchedule runs retention every PruneEvery, as configured when it asks.
type pruneSchedule struct{ p *part }

func (s pruneSchedule) Next(t time.Time) time.Time {
	s.p.mu.Lock()
	defer s.p.mu.Unlock()
	return t.Add(s.p.opts.PruneEvery)
}

// pruneWorker deletes finished workflows past their retention.
type pruneWorker struct {
	river.WorkerDefaults[riverjob.WorkflowPrune]
	p *part
}

func (w *pruneWorker) Work(ctx context.Context, job *river.Job[riverjob.WorkflowPrune]) error {
	rt := workers.RuntimeFrom(ctx)
	n, err := workflow.Prune(ctx, rt.Pool(), w.p.opts.Retention, 1000)
	if n > 0 {
		log(rt).Info().Int64("pruned", n).Dur("retention", w.p.opts.Retention).Msg("pruned finished workflows")
	}
	return err
}

// metrics are the workflow metrics of a worker process.
type metrics struct {
	started  *prometheus.CounterVec
	finished *prometheus.CounterVec
	steps    *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

func (p *part) metricsFor(rt *workers.Runtime) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.metrics != nil {
		return
	}
	m := &metrics{
		started: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bettercompute_workflows_started_total",
			Help: "Workflows whose first step this process ran, by workflow kind.",
		}, []string{"workflow"}),
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bettercompute_workflows_finished_total",
			Help: "Workflows this process finished, by workflow kind and status (completed, failed, cancelled).",
		}, []string{"workflow", "status"}),
		steps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bettercompute_workflow_steps_total",
			Help: "Workflow step executions by workflow kind, step and outcome (goto, sleep, await, children, completed, failed, cancelled, error, retry, stale, rearm).",
		}, []string{"workflow", "step", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "bettercompute_workflow_step_duration_seconds",
			Help:    "Time of one workflow step execution (its function and its transaction), by workflow kind and step.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 18),
		}, []string{"workflow", "step"}),
	}
	if reg := rt.Metrics().Registerer(); reg != nil {
		for _, c := range []prometheus.Collector{m.started, m.finished, m.steps, m.duration} {
			if err := reg.Register(c); err != nil {
				var are prometheus.AlreadyRegisteredError
				if !errors.As(err, &are) {
					log(rt).Warn().Err(err).Msg("cannot register workflow metrics")
				}
			}
		}
	}
	p.metrics = m
}

func (p *part) observe(kind, step, outcome string, took time.Duration, status workflow.Status, first bool) {
	p.mu.Lock()
	m := p.metrics
	p.mu.Unlock()
	if m == nil {
		return
	}
	m.steps.WithLabelValues(kind, step, outcome).Inc()
	if took > 0 {
		m.duration.WithLabelValues(kind, step).Observe(took.Seconds())
	}
	if first {
		m.started.WithLabelValues(kind).Inc()
	}
	if status.Finished() {
		m.finished.WithLabelValues(kind, string(status)).Inc()
	}
}

// Collector exports the workflows by kind and status and the signals waiting
// in inboxes, read from the database at each scrape (serve registers it).
type Collector struct {
	db       *pg.Pool
	byStatus *prometheus.Desc
	signals  *prometheus.Desc
}

// NewCollector returns a Collector reading db.
func NewCollector(db *pg.Pool) *Collector {
	return &Collector{db: db,
		byStatus: prometheus.NewDesc("bettercompute_workflows", "Workflows stored, by workflow kind and status.", []string{"workflow", "status"}, nil),
		signals:  prometheus.NewDesc("bettercompute_workflow_signals_waiting", "Signals sent and not yet consumed, across all workflows.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) { ch <- c.byStatus; ch <- c.signals }

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	counts, err := workflow.Count(ctx, c.db)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.byStatus, err) // the scrape reports it
		return
	}
	keys := make([][2]string, 0, len(counts.ByKindStatus))
	for k := range counts.ByKindStatus {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i][0]+keys[i][1] < keys[j][0]+keys[j][1] })
	for _, k := range keys {
		ch <- prometheus.MustNewConstMetric(c.byStatus, prometheus.GaugeValue, float64(counts.ByKindStatus[k]), k[0], k[1])
	}
	ch <- prometheus.MustNewConstMetric(c.signals, prometheus.GaugeValue, float64(counts.SignalsWaiting))
}

// Lookup returns the workflow definition of kind registered in r, or
// INVALID_ARGUMENT naming the kinds that are.
func Lookup(r *workers.Registry, kind string) (workflow.Definition, error) {
	defs := Definitions(r)
	if d := defs[kind]; d != nil {
		return d, nil
	}
	known := make([]string, 0, len(defs))
	for k := range defs {
		known = append(known, k)
	}
	sort.Strings(known)
	if len(known) == 0 {
		return nil, fault.New(fault.InvalidArgument, "unknown workflow kind %q: this binary defines no workflows (a module registers them with workers.AddWorkflow)", kind)
	}
	return nil, fault.New(fault.InvalidArgument, "unknown workflow kind %q: this binary defines %s", kind, strings.Join(known, ", "))
}

func log(rt *workers.Runtime) *zerolog.Logger {
	l := rt.Log().With().Str("component", "workflow").Logger()
	return &l
}
