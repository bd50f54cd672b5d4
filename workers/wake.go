package workers

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivershared/baseservice"
	"github.com/riverqueue/river/rivershared/riverpilot"
	"github.com/riverqueue/river/rivertype"

	"github.com/bettercompute/bettercompute/jobs"
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
	pilot *wakePilot
}

var _ riverdriver.Driver[pgx.Tx] = (*pollDriver)(nil)

func newPollDriver(d *riverpgxv5.Driver) *pollDriver {
	return &pollDriver{Driver: d, pilot: &wakePilot{}}
}

// SupportsListener is false: River then wakes its producers in process.
func (d *pollDriver) SupportsListener() bool { return false }

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
