package workers

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivershared/baseservice"
	"github.com/riverqueue/river/rivershared/riverpilot"
	"github.com/riverqueue/river/rivertype"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/workers/internal/riverjob"
)

// A working runtime wakes its River producer of a shard queue as soon as a
// transaction of this process that made a job of that shard available
// commits (jobs.WakeAfterCommit: a workflow's start, a signal, a step handing
// over to a new job), instead of waiting for the next poll. River offers this
// for poll-only clients (its pilot's NotifyNonTxJobInsert, which its own
// inserts use when the driver has no listener); pollDriver is River's pgx
// driver saying it has none (this client never listens: PollOnly) and
// handing River a pilot that keeps that function.

// pollDriver is riverpgxv5's driver for a poll-only client whose producers
// this process wakes.
type pollDriver struct {
	*riverpgxv5.Driver
	pool     *pgxpool.Pool
	pilot    *wakePilot
	settings queueSettings
}

var _ riverdriver.Driver[pgx.Tx] = (*pollDriver)(nil)

func newPollDriver(pool *pgxpool.Pool) *pollDriver {
	return &pollDriver{Driver: riverpgxv5.New(pool), pool: pool, pilot: &wakePilot{}}
}

// SupportsListener is false: River then wakes its producers in process.
func (d *pollDriver) SupportsListener() bool { return false }

// GetExecutor is River's executor, but for the settings of the shard queues,
// which every producer of a poll-only client reads on its own every 2 s (to
// see a pause or resume from River UI): those come from one list of every
// queue, read at most once a second for all of them (queueSettings), so an
// idle process's load does not grow with its shards.
func (d *pollDriver) GetExecutor() riverdriver.Executor {
	return &settingsExecutor{Executor: d.Driver.GetExecutor(), cache: &d.settings, pool: d.pool}
}

// queueSettings are the rows of river_queue, as last listed.
type queueSettings struct {
	mu     sync.Mutex
	at     time.Time
	byName map[string]*rivertype.Queue
}

// queueSettingsFor is how long a list of the queues' settings serves.
const queueSettingsFor = time.Second

type settingsExecutor struct {
	riverdriver.Executor
	cache *queueSettings
	pool  *pgxpool.Pool
}

func (e *settingsExecutor) QueueGet(ctx context.Context, params *riverdriver.QueueGetParams) (*rivertype.Queue, error) {
	if !strings.HasPrefix(params.Name, jobs.ShardQueuePrefix) {
		return e.Executor.QueueGet(ctx, params)
	}
	c := e.cache
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.at) > queueSettingsFor {
		qs, err := e.Executor.QueueList(ctx, &riverdriver.QueueListParams{Max: 100_000, Schema: params.Schema})
		if err != nil {
			return nil, err
		}
		c.byName = make(map[string]*rivertype.Queue, len(qs))
		for _, q := range qs {
			c.byName[q.Name] = q
		}
		c.at = time.Now()
	}
	if q, ok := c.byName[params.Name]; ok {
		return q, nil
	}
	return e.Executor.QueueGet(ctx, params) // added since the list
}

// PluginInit and PluginPilot make pollDriver a River driver plugin.
func (d *pollDriver) PluginInit(*baseservice.Archetype) {}

// PluginPilot is River's standard pilot, keeping NotifyNonTxJobInsert.
func (d *pollDriver) PluginPilot() riverpilot.Pilot { return d.pilot }

type wakePilot struct {
	riverpilot.StandardPilot
	notify func(ctx context.Context, res []*rivertype.JobInsertResult)
}

func (p *wakePilot) PilotInit(a *baseservice.Archetype, params *riverpilot.PilotInitParams) {
	p.notify = params.NotifyNonTxJobInsert
	p.StandardPilot.PilotInit(a, params)
}

// wake makes the producer of queue fetch now (a no-op for a queue this
// client does not work).
func (p *wakePilot) wake(ctx context.Context, queue string) {
	if p.notify != nil {
		p.notify(ctx, []*rivertype.JobInsertResult{{Job: &rivertype.JobRow{Queue: queue}}})
	}
}

// wakeKey wakes the producer of key's shard queue when this process works
// that queue (jobs.OnWake).
func (rt *Runtime) wakeKey(key string) {
	rt.wakeQueue(jobs.ShardQueue(jobs.ShardOf(key, rt.shardCount)))
}

// wakeQueue makes the producer of queue fetch now, if this process works
// the queue. Only once River's Queues().Add has returned (rt.active): a
// producer's fetch trigger is not safe to call while the producer starts.
func (rt *Runtime) wakeQueue(queue string) {
	rt.mu.Lock()
	active := rt.active[queue]
	rt.mu.Unlock()
	if active && rt.driver != nil {
		rt.driver.pilot.wake(rt.runCtx, queue)
	}
}

// IdleQueuePollFactor times the poll interval, and at least MinIdleQueuePoll,
// is how often a shard queue's producer polls on its own: a backstop. The
// scout polls for all of them once a poll interval in one statement, so an
// idle process's load does not grow with its shards.
const (
	IdleQueuePollFactor = 100
	MinIdleQueuePoll    = 30 * time.Second
)

func (o *Options) idleQueuePoll() time.Duration {
	return max(IdleQueuePollFactor*o.PollInterval, MinIdleQueuePoll)
}

// scoutLoop asks, once a poll interval and in one statement for all the
// shards this process holds (riverjob.DueWorkSQL), which have a due dirty key of
// a reconciler it runs, and which have a job due in their queue, and wakes
// their claim loops and producers: an idle process costs the database one
// statement a poll interval, not one per shard.
func (rt *Runtime) scoutLoop() {
	defer rt.claimWG.Done()
	kinds, _ := rt.o.Registry.claimKinds()
	t := time.NewTicker(rt.o.PollInterval)
	defer t.Stop()
	for {
		select {
		case <-rt.claimStop:
			return
		case <-t.C:
		}
		shards := rt.HeldShards()
		if len(shards) == 0 {
			continue
		}
		queues := make([]string, len(shards))
		for i, s := range shards {
			queues[i] = jobs.ShardQueue(s)
		}
		ctx, cancel := context.WithTimeout(rt.runCtx, 30*time.Second)
		rows, err := rt.pool.Query(ctx, riverjob.DueWorkSQL, shards, queues, kinds)
		var shard int
		var dirty, due bool
		if err == nil {
			_, err = pgx.ForEachRow(rows, []any{&shard, &dirty, &due}, func() error {
				if dirty {
					rt.wakeClaimLoop(shard)
				}
				if due {
					rt.wakeQueue(jobs.ShardQueue(shard))
				}
				return nil
			})
		}
		cancel()
		if err != nil && rt.runCtx.Err() == nil {
			rt.log.Debug().Err(err).Msg("could not look for due work; retrying at the next poll")
		}
	}
}
