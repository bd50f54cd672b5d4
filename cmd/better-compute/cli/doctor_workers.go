package cli

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/workers"
)

// doctorListMax is how many workers the workers check names; the rest are
// counted.
const doctorListMax = 8

// doctorWorkers checks each running worker's last heartbeat: a worker silent
// past its dead_after that still holds leases has no standby taking them.
func (s *Session) doctorWorkers(ctx context.Context, db *pg.Pool, r *report) {
	const name = "workers"
	ws, err := workers.ListWorkers(ctx, db, workers.WorkersRecent)
	if err != nil {
		r.fail(name, err, "cannot list the workers")
		return
	}
	if len(ws) == 0 {
		r.add(name, true, "no worker has beaten in the last %s", workers.WorkersRecent)
		return
	}
	var listed, orphaned []string
	live := 0
	for _, w := range ws {
		if !w.Silenced() {
			live++
		}
		if w.Silenced() && w.Leases > 0 {
			orphaned = append(orphaned, fmt.Sprintf("%s (host %s, pid %d) holds %s but has not beaten for %s (dead after %s)",
				w.Owner(), w.Host, w.PID, plural(w.Leases, "lease"), w.Silent.Round(100*time.Millisecond), w.DeadAfter))
		}
		if len(listed) < doctorListMax {
			listed = append(listed, describeWorker(w))
		}
	}
	if more := len(ws) - len(listed); more > 0 {
		listed = append(listed, fmt.Sprintf("and %d more", more))
	}
	if len(orphaned) > 0 {
		r.add(name, false, "%s: no standby has taken them (none runs for those shards, or it cannot reach the database); they free at their expiry", strings.Join(orphaned, "; "))
		return
	}
	r.add(name, true, "%d live: %s", live, strings.Join(listed, ", "))
}

// describeWorker is one worker in doctor's workers check.
func describeWorker(w workers.Worker) string {
	state := fmt.Sprintf("beat %s ago", w.Silent.Round(100*time.Millisecond))
	switch {
	case w.Silenced():
		state = fmt.Sprintf("silent for %s, taken for dead", w.Silent.Round(time.Second))
	case w.DeadAfter == 0:
		state += ", an older binary: its leases are taken at expiry only"
	}
	held := "standby"
	if w.Leases > 0 {
		held = plural(w.Leases, "lease")
	}
	return fmt.Sprintf("%s on %s (%s, %s)", w.Owner(), w.Host, state, held)
}

// doctorTakeovers reports the leases that changed hands since the database was
// created, by reason, and the last of each. It never fails: a takeover is the
// system working; the workers and leases checks say whether one is stuck.
func (s *Session) doctorTakeovers(ctx context.Context, db *pg.Pool, r *report) {
	const name = "takeovers"
	ts, err := workers.ListTakeovers(ctx, db)
	if err != nil {
		r.fail(name, err, "cannot read the takeovers")
		return
	}
	if len(ts) == 0 {
		r.add(name, true, "no lease has changed hands")
		return
	}
	parts := make([]string, len(ts))
	for i, t := range ts {
		parts[i] = fmt.Sprintf("%d %s (last %s: %s from %s to %s)", t.Count, takeoverReason(t.Reason),
			t.LastAt.UTC().Format(time.RFC3339), t.LastLease, t.LastFrom, t.LastTo)
	}
	r.add(name, true, "leases changed hands: %s", strings.Join(parts, "; "))
}

// takeoverReason says a reason of compute_lease_takeovers in words.
func takeoverReason(reason string) string {
	switch reason {
	case workers.TakeoverRestart:
		return "at a restart of the holder's identity"
	case workers.TakeoverHeartbeatLost:
		return "after the holder's heartbeat stopped"
	case workers.TakeoverLeaseExpired:
		return "after the holding expired"
	case workers.TakeoverReleased:
		return "released by the holder"
	}
	return reason
}
