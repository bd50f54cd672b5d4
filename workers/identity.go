package workers

import (
	"context"
	"time"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/workers/internal/lease"
	"github.com/bettercompute/bettercompute/workers/internal/riverjob"
)

// claim starts this process's incarnation of its worker identity (lease.Claim)
// and, when it replaced an earlier one, takes back at once what that process
// left: River's leadership, the maintenance jobs it was running, and the leases
// of shards this process does not want (released for whoever wants them). The
// shard leases it wants are taken over by its keeper's first round, with their
// running jobs (handBack).
func (rt *Runtime) claim(ctx context.Context, want []string) error {
	inc, err := lease.Claim(ctx, rt.ctl, lease.ClaimOptions{
		Identity: rt.o.Identity, Heartbeat: rt.o.Heartbeat, MissedBeats: rt.o.MissedBeats,
	})
	if err != nil {
		return err
	}
	rt.inc, rt.owner = inc, inc.Owner()
	if inc.Took == nil {
		return nil
	}
	p := inc.Took
	rt.log.Info().Str("identity", inc.Identity).Int64("incarnation", inc.Number).Int64("previous", p.Number).
		Str("previous_host", p.Host).Int("previous_pid", p.PID).Str("reason", p.Reason).
		Msg("took over the worker identity from its previous incarnation: its leases are taken at once")

	// River's leader, if it was that process, would hold leadership (the
	// scheduler of snoozed and retried jobs, periodic jobs) for up to 15 s.
	if err := riverjob.ClearEarlierLeader(ctx, rt.pool, inc.Identity, rt.owner); err != nil {
		rt.log.Warn().Err(err).Msg("could not clear River's leadership of the previous incarnation; River elects a new leader within 15 s")
	}
	// Its running maintenance jobs go back to the queue now, instead of after
	// River's rescue delay. (Its shard jobs go back when their leases are taken.)
	n, err := riverjob.HandBackEarlierIncarnation(ctx, rt.pool, inc.Identity, rt.owner, time.Now())
	if err != nil {
		rt.log.Warn().Err(err).Msg("could not hand back the previous incarnation's maintenance jobs; River rescues them later")
	} else if n > 0 {
		rt.log.Info().Int64("jobs", n).Str("queue", jobs.MaintenanceQueue).Msg("handed back the previous incarnation's running jobs")
		rt.metrics.handedBack(n)
	}
	if n, err := inc.ReleaseEarlier(ctx, want); err != nil {
		rt.log.Warn().Err(err).Msg("could not release the previous incarnation's other leases; they expire within one TTL")
	} else if n > 0 {
		rt.log.Info().Int64("leases", n).Msg("released the previous incarnation's leases this process does not serve")
	}
	return nil
}

// halt is called when a later incarnation of this identity took over: another
// live process was given the same identity. This one stops working at once (its
// leases are no longer its own) and closes Done, so the binary exits loudly.
func (rt *Runtime) halt(err error) {
	rt.doneOnce.Do(func() {
		rt.log.Error().Err(err).Msg("worker identity taken over by another process: stopping")
		rt.doneErr = err
		rt.mu.Lock()
		for _, jobs := range rt.inFlight {
			for _, cancel := range jobs {
				cancel(fault.Wrap(fault.Fenced, err, "worker identity taken over"))
			}
		}
		rt.mu.Unlock()
		close(rt.done)
	})
}

// retire records that this incarnation stopped (a graceful stop, or a start that
// failed after its claim), so the next start with the identity need not watch
// for a heartbeat, and closes the control pool: the last thing a stopping or
// failed runtime does with it.
func (rt *Runtime) retire() {
	defer func() {
		if rt.ctl != rt.pool {
			rt.ctl.Close() // the control pool, once nothing uses it
		}
	}()
	if rt.inc == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := rt.inc.Retire(ctx); err != nil {
		rt.log.Warn().Err(err).Msg("could not record the stop; the next start with this identity watches for a heartbeat first")
	}
}
