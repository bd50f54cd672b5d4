package outboxworker

import (
	"context"
	"errors"
	"sort"
	"sync"
	"time"

	"github.com/riverqueue/river"

	"github.com/bettercompute/bettercompute/domain/outbox"
	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/internal/riverjob"
)

// Options configure the outbox machinery of one worker registry.
type Options struct {
	// PollEvery is how often each worker process checks its idle sinks for new
	// events and starts their delivery (default 50 ms). No LISTEN/NOTIFY: the
	// commit-to-delivery latency is about PollEvery plus River's poll interval.
	PollEvery time.Duration
	// Retain is the replay window: retention never deletes an event younger
	// than this, even when every sink has passed it, so SSE clients can resume
	// within it (default 24 h).
	Retain time.Duration
	// RetentionEvery is how often the retention job runs (default 1 min).
	RetentionEvery time.Duration
	// RetentionBatch is the most events one retention statement deletes
	// (default 10,000); RetentionMaxBatches bounds one run (default 100).
	RetentionBatch      int
	RetentionMaxBatches int
	// SinkMaxBackoff caps the wait before a failed delivery is retried: 1 s,
	// 2 s, 4 s … up to this (default 1 min).
	SinkMaxBackoff time.Duration
}

func (o Options) withDefaults() Options {
	if o.PollEvery <= 0 {
		o.PollEvery = 50 * time.Millisecond
	}
	if o.Retain <= 0 {
		o.Retain = 24 * time.Hour
	}
	if o.RetentionEvery <= 0 {
		o.RetentionEvery = time.Minute
	}
	if o.RetentionBatch <= 0 {
		o.RetentionBatch = 10000
	}
	if o.RetentionMaxBatches <= 0 {
		o.RetentionMaxBatches = 100
	}
	if o.SinkMaxBackoff <= 0 {
		o.SinkMaxBackoff = time.Minute
	}
	return o
}

// state is the outbox machinery of one registry (its workers.Part): its
// options, sinks and dispatchers, which the workers it installs carry.
type state struct {
	mu          sync.Mutex
	opts        Options
	sinks       map[string]*workers.Sink
	dispatchers map[string]passer
	busy        map[string]chan struct{} // per sink: held while a delivery runs in this process

	// Test hooks (nil outside tests): after a sink handler returned, before the
	// cursor moves; and after the fenced advance, with its result. For a
	// HandleTx sink afterHandle runs inside the delivery's transaction (in its
	// savepoint, after the fence and the handler, before the advance): it must
	// not wait for a lock that transaction holds (the lease's takeover, the
	// job's row). afterAdvance is not called when the handler failed.
	afterHandle  func(sink string, events []outbox.Event)
	afterAdvance func(sink string, err error)
}

func newState() *state {
	return &state{opts: Options{}.withDefaults(), sinks: map[string]*workers.Sink{}, dispatchers: map[string]passer{}, busy: map[string]chan struct{}{}}
}

// stateOf returns reg's outbox machinery, installing it on first use.
func stateOf(reg *workers.Registry) (*state, error) { return workers.Use(reg, newState) }

// Register adds the outbox machinery to reg, with o's options (nil: the
// defaults; zero fields take their defaults): the sink delivery worker, the
// dispatcher pass worker, the periodic retention job, and the start hook that
// creates sink state and polls idle sinks; it then runs the sinks added with
// workers.AddSink. The built-in outbox module registers it in every worker
// process (cli.App, before an application's modules), so retention runs even
// with no sink; an application that sets options calls it again from its own
// Register, and the last options win. It returns INVALID_CONFIG for bad
// options, or if one of its job kinds is already taken in reg.
func Register(reg *workers.Registry, o *Options) error {
	st, err := stateOf(reg)
	if err != nil || o == nil {
		return err
	}
	if o.PollEvery < 0 || o.Retain < 0 || o.RetentionEvery < 0 || o.SinkMaxBackoff < 0 || o.RetentionBatch < 0 || o.RetentionMaxBatches < 0 {
		return fault.New(fault.InvalidConfig, "outbox options: durations and counts must not be negative")
	}
	if o.PollEvery > 0 && o.PollEvery < time.Millisecond {
		return fault.New(fault.InvalidConfig, "outbox options: PollEvery %s is too short (at least 1ms)", o.PollEvery)
	}
	st.mu.Lock()
	st.opts = o.withDefaults()
	st.mu.Unlock()
	return nil
}

func (st *state) options() Options {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.opts
}

// Install implements workers.Part.
func (st *state) Install(reg *workers.Registry) error {
	reg.OnStart(st.start)
	return errors.Join(
		workers.OnAdd(reg, st.addSink),
		workers.AddMaintenanceWorker(reg, &deliverWorker{st: st}),
		workers.AddMaintenanceWorker(reg, &retentionWorker{st: st}),
		workers.AddMaintenanceWorker(reg, &dispatchWorker{st: st}),
		workers.AddPeriodic(reg, river.NewPeriodicJob(retentionSchedule{st},
			func() (river.JobArgs, *river.InsertOpts) {
				return riverjob.OutboxRetention{}, &river.InsertOpts{Queue: jobs.MaintenanceQueue, Tags: []string{"outbox"}}
			}, nil)),
	)
}

// retentionSchedule runs retention every RetentionEvery, read at each run so
// that Configure after Install applies.
type retentionSchedule struct{ st *state }

// Next implements river.PeriodicSchedule.
func (s retentionSchedule) Next(t time.Time) time.Time { return t.Add(s.st.options().RetentionEvery) }

// start runs when a worker process starts: it creates the state of every
// registered sink (at its From position) and starts polling them.
func (st *state) start(ctx context.Context, rt *workers.Runtime) error {
	sinks := st.sinkList()
	for _, s := range sinks {
		if err := outbox.EnsureSink(ctx, rt.Pool(), s.Name, s.From); err != nil {
			return err
		}
	}
	if len(sinks) > 0 {
		go st.pump(rt)
	}
	return nil
}

func (st *state) sinkList() []*workers.Sink {
	st.mu.Lock()
	defer st.mu.Unlock()
	out := make([]*workers.Sink, 0, len(st.sinks))
	for _, s := range st.sinks {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func (st *state) sink(name string) *workers.Sink {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.sinks[name]
}

func (st *state) dispatcher(name string) passer {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.dispatchers[name]
}

// sinks returns the names of the sinks registered in reg, sorted.
func sinks(reg *workers.Registry) []string {
	st, err := stateOf(reg)
	if err != nil {
		return nil
	}
	var out []string
	for _, s := range st.sinkList() {
		out = append(out, s.Name)
	}
	return out
}

// EnsureSinks creates the state of every sink registered in reg that has none
// yet (at its From position), as a worker process does when it starts. The
// operator verbs call it so that a registered sink is listed before any worker
// ran.
func EnsureSinks(ctx context.Context, db pg.DBTX, reg *workers.Registry) error {
	st, err := stateOf(reg)
	if err != nil {
		return err
	}
	for _, s := range st.sinkList() {
		if err := outbox.EnsureSink(ctx, db, s.Name, s.From); err != nil {
			return err
		}
	}
	return nil
}
