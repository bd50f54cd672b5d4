package workers

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/clock"
	"github.com/bettercompute/bettercompute/platform/config"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/logging"
	"github.com/bettercompute/bettercompute/platform/migrate"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/workers/internal/lease"
	"github.com/bettercompute/bettercompute/workers/internal/riverjob"
)

// Options configure a Runtime.
type Options struct {
	Pool     *pg.Pool
	Log      zerolog.Logger
	Registry *Registry // nil: only the built-in workers
	// Identity is this worker's stable identity: a restart
	// with the same identity takes its predecessor's leases over at once. ""
	// picks HOST/SLOT, the lowest slot on this host no running process holds.
	Identity string
	// Heartbeat is how often the incarnation records it is alive; default
	// config.DefaultHeartbeat.
	Heartbeat time.Duration
	// MissedBeats is how many heartbeats it may miss before any standby takes
	// its shards; default config.DefaultMissedBeats.
	MissedBeats int
	// Shards to serve. Empty: the process works only the maintenance queue.
	Shards []int
	// Work false makes an insert-only client (serve uses one for River UI).
	Work bool

	// Zero timings and counts take the defaults of platform/config
	// (config.DefaultLeaseTTL, …), the same as the configuration's.
	LeaseTTL        time.Duration
	LeaseRenew      time.Duration
	StopGrace       time.Duration
	PollInterval    time.Duration
	ResyncEvery     time.Duration
	WorkersPerShard int
	// MaintenanceWorkers is the concurrency of the maintenance queue.
	MaintenanceWorkers int
	// JobTimeout bounds one job's Work; default one minute (River's).
	JobTimeout time.Duration
	// Secrets are removed from every error stored in a job row.
	Secrets []string
	// Metrics, nil for none.
	Metrics *Metrics
	// TracerProvider makes the spans of this process's work (platform/telemetry
	// builds one from the OTEL_* variables); nil records none, at no cost.
	TracerProvider trace.TracerProvider
}

// Runtime is a running worker process: a River client, its shard leases and
// their queues.
type Runtime struct {
	o    Options
	pool *pg.Pool
	// ctl is the control loops' own small pool (lease rounds, the identity
	// heartbeat, clock samples): jobs holding every connection of pool never
	// delay a renewal. It is pool itself for an insert-only client.
	ctl        *pg.Pool
	log        zerolog.Logger
	client     *river.Client[pgx.Tx]
	driver     *pollDriver
	keeper     *lease.Keeper
	inc        *lease.Incarnation // nil for an insert-only client
	owner      string
	anchor     *clock.Anchor
	shardCount int
	metrics    *Metrics
	tp         trace.TracerProvider // never nil: a no-op one when Options has none
	leaseTrace leaseTrace

	runCtx    context.Context // lives until Stop completes
	runCancel context.CancelFunc
	keeperWG  sync.WaitGroup

	mu        sync.Mutex
	inFlight  map[string]map[int64]context.CancelCauseFunc // queue -> job id -> cancel
	finished  map[int64]time.Time                          // job id -> when its attempt returned (see outcomeGrace)
	claiming  map[int]chan struct{}                        // shard -> its running claim loop's wake-up
	claimStop chan struct{}                                // closed when Stop begins: claim loops stop claiming
	claimWG   sync.WaitGroup                               // the claim loops
	queueOps  chan queueOp
	opsDone   chan struct{}
	active    map[string]bool // queues added to River
	stopping  bool

	done     chan struct{} // closed when the runtime must stop by itself
	doneErr  error
	doneOnce sync.Once

	hardStop     chan struct{} // closed when Stop stops waiting for jobs
	hardStopOnce sync.Once
}

type queueOp struct {
	queue string
	add   bool
}

// ShardLease is the lease name of shard n.
func ShardLease(n int) string { return "shard/" + strconv.Itoa(n) }

// shardOfLease is the shard whose lease is name (ShardLease), if it is one.
func shardOfLease(name string) (int, bool) {
	s, ok := strings.CutPrefix(name, "shard/")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	return n, err == nil
}

func shardOfQueue(queue string) (int, bool) {
	s, ok := strings.CutPrefix(queue, jobs.ShardQueuePrefix)
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	return n, err == nil
}

// insertOnlyID is the River client id of an insert-only runtime: host-pid-random.
func insertOnlyID() string {
	host, _ := os.Hostname()
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b))
}

// Start starts a Runtime. It returns INVALID_CONFIG for a shard outside the
// stored shard count, NOT_FOUND before the first migrate.
func Start(ctx context.Context, o Options) (*Runtime, error) {
	if o.Pool == nil {
		return nil, fault.New(fault.InvalidConfig, "workers: no pool")
	}
	o = o.withDefaults()
	count, err := migrate.ShardCount(ctx, o.Pool)
	if err != nil {
		return nil, err
	}
	for _, s := range o.Shards {
		if s < 0 || s >= count {
			return nil, fault.New(fault.InvalidConfig, "shard %d is out of range: this deployment has %d shards (0-%d)", s, count, count-1)
		}
	}
	if o.Work {
		// Before any job of this registry can run: inserts of its fenced kinds
		// outside the shard queues are refused from now on, its workflow kinds
		// are known, and no unfinished workflow sits on a step it lacks.
		if err := o.Registry.Record(ctx, o.Pool); err != nil {
			return nil, err
		}
		if err := o.Registry.Check(ctx, o.Pool); err != nil {
			return nil, err
		}
	}
	rt := newRuntime(o, count)
	if o.Work {
		if rt.ctl, err = o.Pool.Sibling(controlConns); err != nil {
			return nil, err
		}
	}
	if err := rt.anchor.Sample(ctx, rt.ctl); err != nil && !fault.Has(err, fault.ClockSkew) {
		rt.retire()
		return nil, err
	} else if err != nil {
		rt.log.Error().Err(err).Msg("clock skew at start")
	}
	names := make([]string, len(o.Shards))
	for i, s := range o.Shards {
		names[i] = ShardLease(s)
	}
	if o.Work {
		if err := rt.claim(ctx, names); err != nil {
			rt.retire()
			return nil, err
		}
	}
	rt.driver = newPollDriver(o.Pool.Pool)
	if rt.client, err = river.NewClient[pgx.Tx](rt.driver, rt.riverConfig()); err != nil {
		rt.retire()
		return nil, fault.Wrap(fault.InvalidConfig, err, "cannot configure River")
	}
	rt.runCtx, rt.runCancel = context.WithCancel(context.WithoutCancel(ctx))
	if !o.Work {
		return rt, nil
	}
	if err := rt.run(names); err != nil {
		return nil, err
	}
	rt.log.Info().Str("owner", rt.owner).Str("identity", rt.inc.Identity).Int64("incarnation", rt.inc.Number).Ints("shards", o.Shards).Int("shard_count", count).Msg("worker started")
	return rt, nil
}

// controlConns is the size of a working runtime's control pool: a lease round
// and a heartbeat at once.
const controlConns = 2

// withDefaults is o with its zero fields defaulted (platform/config's defaults).
func (o Options) withDefaults() Options {
	if o.Registry == nil {
		o.Registry = NewRegistry()
	}
	o.LeaseTTL = cmpOr(o.LeaseTTL, config.DefaultLeaseTTL)
	o.LeaseRenew = cmpOr(o.LeaseRenew, config.DefaultLeaseRenew)
	o.StopGrace = cmpOr(o.StopGrace, config.DefaultStopGrace)
	o.PollInterval = cmpOr(o.PollInterval, config.DefaultPollInterval)
	o.ResyncEvery = cmpOr(o.ResyncEvery, config.DefaultResyncEvery)
	if o.WorkersPerShard <= 0 {
		o.WorkersPerShard = config.DefaultWorkersPerShard
	}
	if o.MaintenanceWorkers <= 0 {
		o.MaintenanceWorkers = config.DefaultMaintenanceWorkers
	}
	return o
}

// newRuntime is a Runtime of o, not started, for a deployment of count shards.
func newRuntime(o Options, count int) *Runtime {
	rt := &Runtime{
		o: o, pool: o.Pool, ctl: o.Pool, log: o.Log, shardCount: count, anchor: &clock.Anchor{},
		metrics:   o.Metrics,
		inFlight:  map[string]map[int64]context.CancelCauseFunc{},
		finished:  map[int64]time.Time{},
		active:    map[string]bool{},
		claiming:  map[int]chan struct{}{},
		claimStop: make(chan struct{}),
		queueOps:  make(chan queueOp, 4*len(o.Shards)+16),
		opsDone:   make(chan struct{}),
		done:      make(chan struct{}),
		hardStop:  make(chan struct{}),
		owner:     insertOnlyID(),
	}
	rt.tp = o.TracerProvider
	if rt.tp == nil {
		rt.tp = noop.NewTracerProvider()
	}
	if rt.metrics == nil {
		rt.metrics = &Metrics{}
	}
	return rt
}

// riverConfig is the River client's configuration: poll-only, our middleware
// and error handler, and for a working runtime the maintenance queue and the
// periodic jobs (the shard queues are added as their leases are taken).
func (rt *Runtime) riverConfig() *river.Config {
	o := rt.o
	cfg := &river.Config{
		ID:                rt.owner,
		Logger:            logging.Slog(o.Log.With().Str("component", "river").Logger()),
		PollOnly:          true, // no LISTEN/NOTIFY: PgBouncer in transaction mode
		FetchPollInterval: o.PollInterval,
		// The cooldown spaces fetches that follow a full one (8 jobs a fetch):
		// short, so a backlog (after a database restart, a takeover) drains at
		// the machine's pace rather than 8 jobs a cooldown. An idle queue still
		// fetches once a poll interval.
		FetchCooldown: min(o.PollInterval, 5*time.Millisecond),
		JobTimeout:    o.JobTimeout,
		Workers:       o.Registry.workers,
		Middleware:    append(rt.tracingMiddleware(), &jobMiddleware{rt: rt}), // tracing's (if on) outside ours
		ErrorHandler:  &errorHandler{rt: rt},
	}
	if o.Work {
		cfg.Queues = map[string]river.QueueConfig{jobs.MaintenanceQueue: {MaxWorkers: o.MaintenanceWorkers}}
		cfg.PeriodicJobs = append(rt.resyncJobs(), o.Registry.periodic...)
	}
	return cfg
}

// run starts a working runtime: the River client, the queue loop, the identity
// heartbeat, the lease keeper wanting the shards' leases, and the registry's
// start hooks. On an error it leaves nothing running.
func (rt *Runtime) run(names []string) error {
	if err := rt.client.Start(rt.runCtx); err != nil {
		rt.runCancel()
		rt.retire()
		return fault.Wrap(fault.Unavailable, err, "cannot start River")
	}
	go rt.queueLoop()
	rt.keeper = rt.newKeeper()
	rt.claimWG.Add(1)
	go rt.scoutLoop() // after the keeper is set: it reads rt.keeper
	// Registered once the keeper is set: OnWake's lock orders this write
	// before the hook's read of rt.keeper from another goroutine's commit.
	stopWakes := jobs.OnWake(rt.wakeKey)
	context.AfterFunc(rt.runCtx, stopWakes)
	go rt.inc.Run(rt.runCtx, lease.Hooks{
		Superseded: rt.halt,
		Failed:     func(err error) { rt.log.Debug().Err(err).Msg("heartbeat failed; retrying") },
		Resumed: func(silent time.Duration) {
			rt.log.Warn().Dur("silent", silent).Dur("dead_after", rt.inc.DeadAfter()).
				Msg("heartbeat resumed after a silence longer than dead_after (paused, or cut off from the database): a standby may have taken this worker's shards; checking its leases now")
			rt.keeper.Wake()
		},
	})
	rt.keeper.Want(names...)
	rt.keeperWG.Add(1)
	go func() { defer rt.keeperWG.Done(); rt.keeper.Run(rt.runCtx) }()

	for _, f := range rt.o.Registry.onStart {
		if err := f(rt.runCtx, rt); err != nil {
			_ = rt.Stop(context.Background())
			return err
		}
	}
	return nil
}

// newKeeper is the runtime's lease keeper: at a takeover and after every round
// it hands back the shard jobs it owns but does not work; acquired and lost
// leases add and remove their queues.
func (rt *Runtime) newKeeper() *lease.Keeper {
	o := rt.o
	return lease.NewKeeper(lease.KeeperOptions{
		DB: rt.ctl, Owner: rt.owner, TTL: o.LeaseTTL, Renew: o.LeaseRenew, Anchor: rt.anchor,
		Log: o.Log.With().Str("component", "lease").Logger(),
		Taken: func(ctx context.Context, tx pgx.Tx, l lease.Lease) error {
			n, err := rt.handBack(ctx, tx, "at its takeover", l)
			if rt.o.TracerProvider != nil {
				rt.leaseTrace.noteTakeover(l.Name, n)
			}
			return err
		},
		Kept: func(ctx context.Context, held []lease.Lease) {
			if _, err := rt.handBack(ctx, rt.ctl, "after a lease round", held...); err != nil && ctx.Err() == nil {
				rt.log.Warn().Err(err).Msg("could not hand back stray jobs; the next lease round retries")
			}
			// A claim loop ends when Held says no, which a silence of this
			// process's heartbeat makes it say until a round confirms the
			// lease: start again those of the leases still held.
			for _, l := range held {
				if shard, ok := shardOfLease(l.Name); ok {
					rt.startClaimLoop(shard)
				}
			}
		},
		Liveness:   rt.inc,
		OnAcquired: func(a lease.Acquired) { rt.leaseChanged(a.Lease, true, a.Reason) },
		OnLost:     func(l lease.Lease) { rt.leaseChanged(l, false, "") },
		OnRound:    rt.leaseRoundHook(), // nil unless tracing
	})
}

// jobTimeout is how long a job (or a batch run as one) may run: JobTimeout,
// or River's default when it is not set.
func (o *Options) jobTimeout() time.Duration { return cmpOr(o.JobTimeout, river.JobTimeoutDefault) }

func cmpOr(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// Redact returns err with every configured secret (Options.Secrets) removed
// from its message, for storing or showing it.
func (rt *Runtime) Redact(err error) error { return rt.redactErr(err) }

// Metrics returns the process's worker metrics (never nil).
func (rt *Runtime) Metrics() *Metrics { return rt.metrics }

// LeaseForQueue returns the shard lease this process holds for queue, if it
// holds it unexpired by its own clock (the lease a fenced transaction of the
// queue's jobs is fenced by).
func (rt *Runtime) LeaseForQueue(queue string) (lease.Lease, bool) { return rt.leaseForQueue(queue) }

// Client is the River client (for inserting jobs and for River UI).
func (rt *Runtime) Client() *river.Client[pgx.Tx] { return rt.client }

// Pool is the runtime's pool.
func (rt *Runtime) Pool() *pg.Pool { return rt.pool }

// Owner is this process's lease owner id: its identity and incarnation,
// "IDENTITY#N" (River's client id and the jobs' attempted_by name it too).
func (rt *Runtime) Owner() string { return rt.owner }

// Identity is this worker's identity ("" for an insert-only client).
func (rt *Runtime) Identity() string {
	if rt.inc == nil {
		return ""
	}
	return rt.inc.Identity
}

// Done is closed when the runtime must stop by itself: a later incarnation of
// its identity took over (two live processes were given one identity). Err says
// why; call Stop.
func (rt *Runtime) Done() <-chan struct{} { return rt.done }

// Err is why Done was closed (CONFLICT), or nil.
func (rt *Runtime) Err() error {
	select {
	case <-rt.done:
		return rt.doneErr
	default:
		return nil
	}
}

// ShardCount is the deployment's shard count.
func (rt *Runtime) ShardCount() int { return rt.shardCount }

// Anchor is the process's clock anchor, re-sampled at every lease renewal.
func (rt *Runtime) Anchor() *clock.Anchor { return rt.anchor }

// Log is the runtime's logger.
func (rt *Runtime) Log() zerolog.Logger { return rt.log }

// Options are the runtime's options (defaults applied).
func (rt *Runtime) Options() Options { return rt.o }

// Context lives until the runtime has stopped: background work started by a
// module's OnStart uses it.
func (rt *Runtime) Context() context.Context { return rt.runCtx }

// HeldShards returns the shards whose lease this process holds now.
func (rt *Runtime) HeldShards() []int {
	if rt.keeper == nil {
		return nil
	}
	var out []int
	for _, l := range rt.keeper.HeldAll() {
		if shard, ok := shardOfLease(l.Name); ok {
			out = append(out, shard)
		}
	}
	slices.Sort(out)
	return out
}

// leaseForQueue is the lease that fences jobs of queue.
func (rt *Runtime) leaseForQueue(queue string) (lease.Lease, bool) {
	n, ok := shardOfQueue(queue)
	if !ok || rt.keeper == nil {
		return lease.Lease{}, false
	}
	return rt.keeper.Held(ShardLease(n))
}

// ownStrayAfter is how long after its attempt began a running job of this
// process's own that none of its goroutines works is taken for one whose outcome
// was lost: well past River's fetch-to-work handoff and its completer's batching.
const ownStrayAfter = 5 * time.Second

// handBack returns to their queues the running jobs of the shards of ls that
// another client attempted (see riverjob.HandBackShardJobs): at a takeover, in the
// transaction that acquires the lease (the previous holder's jobs), and after
// every lease round (a paused process that woke, fetched and died), so a shard's
// holder owns every running job of its queue within one renewal interval. It
// returns how many jobs it handed back.
func (rt *Runtime) handBack(ctx context.Context, db pg.DBTX, when string, ls ...lease.Lease) (int, error) {
	names := make([]string, 0, len(ls))
	epochs := make([]int64, 0, len(ls))
	queues := make([]string, 0, len(ls))
	for _, l := range ls {
		shard, ok := shardOfLease(l.Name)
		if !ok {
			continue
		}
		names, epochs, queues = append(names, l.Name), append(epochs, l.Epoch), append(queues, jobs.ShardQueue(shard))
	}
	if len(names) == 0 {
		return 0, nil
	}
	byQueue, err := riverjob.HandBackShardJobs(ctx, db, &riverjob.HandBackParams{
		Leases: names, Epochs: epochs, Queues: queues, Owner: rt.owner, At: time.Now(), When: when,
		Working: rt.inFlightIDs(), OwnAfter: max(rt.o.LeaseRenew, ownStrayAfter),
	})
	if err != nil {
		return 0, fmt.Errorf("error handing back the running jobs of shards %v: %w", queues, err)
	}
	if len(byQueue) == 0 {
		return 0, nil
	}
	counts := map[string]int{}
	for _, q := range byQueue {
		counts[q]++
	}
	for q, n := range counts {
		rt.log.Info().Str("queue", q).Int("jobs", n).Str("when", when).Msg("handed back running jobs another process attempted")
	}
	rt.metrics.handedBack(int64(len(byQueue)))
	return len(byQueue), nil
}

// leaseChanged reacts to an acquired or lost shard lease; reason is why an
// acquisition could take it from another holder ("" for none).
func (rt *Runtime) leaseChanged(l lease.Lease, acquired bool, reason string) {
	shard, ok := shardOfLease(l.Name)
	if !ok {
		return
	}
	queue := jobs.ShardQueue(shard)
	rt.metrics.leases(len(rt.keeper.HeldAll()))
	if !acquired {
		// Stop the shard's work now; its fenced transactions fail anyway.
		rt.cancelQueue(queue, fault.New(fault.Fenced, "lease %s lost", l.Name))
		rt.wakeClaimLoop(shard) // it sees the loss and ends
	} else {
		rt.metrics.tookOver(queue, reason)
		rt.startClaimLoop(shard)
	}
	rt.mu.Lock()
	stopping := rt.stopping
	rt.mu.Unlock()
	if stopping {
		return
	}
	select {
	case rt.queueOps <- queueOp{queue: queue, add: acquired}:
	case <-rt.runCtx.Done():
	}
}

// startClaimLoop starts shard's claim loop unless it runs or the runtime stops.
func (rt *Runtime) startClaimLoop(shard int) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if _, running := rt.claiming[shard]; rt.stopping || running || len(rt.o.Registry.order) == 0 {
		return
	}
	wake := make(chan struct{}, 1)
	rt.claiming[shard] = wake
	rt.claimWG.Add(1)
	go rt.claimLoop(shard, wake)
}

// wakeClaimLoop wakes shard's claim loop if it waits.
func (rt *Runtime) wakeClaimLoop(shard int) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if wake, ok := rt.claiming[shard]; ok {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
}

// claimingShards are the shards whose claim loop runs.
func (rt *Runtime) claimingShards() []int {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	out := make([]int, 0, len(rt.claiming))
	for s := range rt.claiming {
		out = append(out, s)
	}
	return out
}

// claimLoopDone marks shard's claim loop ended, and starts it again if the lease
// came back meanwhile (its acquisition found the loop still running).
func (rt *Runtime) claimLoopDone(shard int) {
	rt.mu.Lock()
	delete(rt.claiming, shard)
	rt.mu.Unlock()
	if _, ok := rt.keeper.Held(ShardLease(shard)); ok {
		rt.startClaimLoop(shard)
	}
}

// queueLoop adds and removes River queues one at a time, in order.
func (rt *Runtime) queueLoop() {
	defer close(rt.opsDone)
	for {
		select {
		case <-rt.runCtx.Done():
			return
		case op, ok := <-rt.queueOps:
			if !ok {
				return
			}
			rt.applyQueueOp(op)
		}
	}
}

func (rt *Runtime) applyQueueOp(op queueOp) {
	rt.mu.Lock()
	active := rt.active[op.queue]
	rt.mu.Unlock()
	switch {
	case op.add && !active:
		// The producer's own poll is a backstop: the scout (scoutLoop) wakes
		// it when its queue has a job due, one statement for every queue.
		qc := river.QueueConfig{MaxWorkers: rt.o.WorkersPerShard, FetchPollInterval: rt.o.idleQueuePoll()}
		if err := rt.client.Queues().Add(op.queue, qc); err != nil {
			rt.log.Error().Err(err).Str("queue", op.queue).Msg("cannot add queue")
			return
		}
		rt.mu.Lock()
		rt.active[op.queue] = true
		rt.mu.Unlock()
		rt.log.Info().Str("queue", op.queue).Msg("working queue")
	case !op.add && active:
		ctx, cancel := context.WithTimeout(rt.runCtx, rt.o.StopGrace+time.Second)
		err := rt.client.Queues().Remove(ctx, op.queue)
		cancel()
		if err != nil {
			rt.log.Error().Err(err).Str("queue", op.queue).Msg("cannot remove queue")
			return
		}
		rt.mu.Lock()
		delete(rt.active, op.queue)
		rt.mu.Unlock()
		rt.log.Info().Str("queue", op.queue).Msg("stopped working queue")
	}
}

// track registers a job's cancel function under its queue.
func (rt *Runtime) track(queue string, id int64, cancel context.CancelCauseFunc) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	m := rt.inFlight[queue]
	if m == nil {
		m = map[int64]context.CancelCauseFunc{}
		rt.inFlight[queue] = m
	}
	m[id] = cancel
}

// outcomeGrace is how long after a job's attempt returned this process still
// counts the job as its own work: River's completer records the outcome
// asynchronously, in batches, retrying a failed write (3 tries of up to 10 s),
// so a job can stay running in the database for a while after its Work
// returned. Handing it back meanwhile would run a finished job again.
const outcomeGrace = time.Minute

// inFlightIDs are the ids of the jobs this process is working now, and of those
// whose attempt returned within outcomeGrace (their outcome may not be recorded
// yet).
func (rt *Runtime) inFlightIDs() []int64 {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	ids := []int64{}
	for _, m := range rt.inFlight {
		for id := range m {
			ids = append(ids, id)
		}
	}
	for id, at := range rt.finished {
		if time.Since(at) > outcomeGrace {
			delete(rt.finished, id)
			continue
		}
		ids = append(ids, id)
	}
	return ids
}

func (rt *Runtime) untrack(queue string, id int64) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	delete(rt.inFlight[queue], id)
	rt.finished[id] = time.Now()
}

// cancelAll cancels every job this process works.
func (rt *Runtime) cancelAll(cause error) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	for _, m := range rt.inFlight {
		for _, cancel := range m {
			cancel(cause)
		}
	}
}

func (rt *Runtime) cancelQueue(queue string, cause error) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	for _, cancel := range rt.inFlight[queue] {
		cancel(cause)
	}
}

// Stop stops gracefully: no new jobs are fetched; in-flight jobs may finish
// within the stop grace, then are cancelled and handed back; the leases are
// released so other processes take the shards at once. ctx bounds the whole stop.
func (rt *Runtime) Stop(ctx context.Context) error {
	rt.mu.Lock()
	if rt.stopping {
		rt.mu.Unlock()
		return nil
	}
	rt.stopping = true
	rt.mu.Unlock()
	defer rt.runCancel()
	if !rt.o.Work {
		return nil
	}
	grace := rt.o.StopGrace
	if rt.Err() != nil {
		grace = 0 // taken over: nothing this process does now can commit
	}
	rt.log.Info().Dur("grace", grace).Msg("worker stopping: finishing in-flight jobs")
	close(rt.claimStop)
	graceCtx, cancel := context.WithTimeout(ctx, grace)
	// Fenced attempts waiting out a live attempt (waitOutLiveAttempt) stop
	// waiting when the grace is over.
	context.AfterFunc(graceCtx, func() { rt.hardStopOnce.Do(func() { close(rt.hardStop) }) })
	claimsDone := make(chan struct{})
	go func() { rt.claimWG.Wait(); close(claimsDone) }()
	err := rt.client.Stop(graceCtx)
	if err == nil {
		select {
		case <-claimsDone:
		case <-graceCtx.Done():
			err = graceCtx.Err()
		}
	}
	cancel()
	if err != nil {
		rt.log.Warn().Msg("grace period over: cancelling in-flight jobs")
		hardCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		rt.cancelAll(fault.New(fault.Unavailable, "the worker is stopping and its stop grace is over"))
		_ = rt.client.StopAndCancel(hardCtx)
		select {
		case <-claimsDone:
		case <-hardCtx.Done():
		}
		cancel()
	}
	// Whatever is still running under this process goes back to its queue.
	held := rt.keeper.HeldAll()
	if len(held) > 0 {
		queues := make([]string, 0, len(held))
		for _, l := range held {
			if n, ok := strings.CutPrefix(l.Name, "shard/"); ok {
				queues = append(queues, jobs.ShardQueuePrefix+n)
			}
		}
		relCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_, herr := riverjob.HandBackOwnRunning(relCtx, rt.pool, queues, rt.owner)
		if herr != nil {
			rt.log.Warn().Err(herr).Msg("could not hand back in-flight jobs; the next shard holder will")
		}
		cancel()
	}
	rt.runCancel() // stops the keeper loop
	rt.keeperWG.Wait()
	relCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := rt.keeper.Release(relCtx); err != nil {
		rt.log.Warn().Err(err).Msg("could not release leases; they expire within one TTL")
	}
	rt.retire()
	rt.metrics.leases(0)
	rt.log.Info().Msg("worker stopped")
	return nil
}

// TracerProvider is the provider of this process's spans (Options.TracerProvider,
// or a no-op one): modules' workers start their spans with it
// (tracing.Start).
func (rt *Runtime) TracerProvider() trace.TracerProvider { return rt.tp }
