package lease

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/bettercompute/bettercompute/platform/clock"
	"github.com/bettercompute/bettercompute/platform/config"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
)

// KeeperOptions configure a Keeper.
type KeeperOptions struct {
	DB    *pg.Pool
	Owner string        // this process's unique owner id
	TTL   time.Duration // default config.DefaultLeaseTTL
	Renew time.Duration // default TTL/3 (config.DefaultLeaseRenew for the default TTL); at most TTL/3
	Log   zerolog.Logger
	// Anchor is re-sampled at every renewal; nil makes a private one.
	Anchor *clock.Anchor

	// Taken runs inside the transaction that acquires l, when this keeper did not
	// hold l before (a start, or a takeover from another owner). An error rolls
	// the acquisition back; it is retried at the next renewal.
	Taken func(ctx context.Context, tx pgx.Tx, l Lease) error
	// OnAcquired is called after the acquisition of a holding committed, with
	// the owner it was taken from and why (Acquired).
	OnAcquired func(a Acquired)
	// Kept is called after every round that renewed or took leases, with every
	// lease held after it, outside the keeper's lock: what the holder must do
	// for its leases at least once per renewal interval (the worker hands back
	// the jobs of its shards that another process attempted).
	Kept func(ctx context.Context, held []Lease)
	// OnLost is called at once when l is lost: another owner took it, or it
	// expired by this process's clock without a successful renewal.
	OnLost func(l Lease)
	// Liveness, optional, is the process's own heartbeat (a worker's
	// Incarnation): Held trusts no holding while it says not to, and a round
	// whose renewal succeeded confirms the holdings to it.
	Liveness Liveness
	// OnRound, optional, is called after every round that acquired, renewed
	// or lost a holding, with what it did (the worker makes it a span). A
	// round that changed nothing and renewed nothing is not reported.
	OnRound func(r Round)
}

// Liveness is what a keeper asks of its process's heartbeat (Incarnation).
type Liveness interface {
	// Trusted says whether the holdings may be trusted now, and the
	// generation of the latest silence.
	Trusted() (ok bool, gen uint64)
	// Confirm is called after a round that began at generation gen renewed
	// the holdings.
	Confirm(gen uint64)
}

// Round is what one keeper round did, for OnRound.
type Round struct {
	Start    time.Time // when the round began
	Renewed  []Lease
	Acquired []Acquired
	Lost     []Lost
}

// Acquired is a holding a round took. Previous is the name's owner before it:
// "" for a name never held, another owner's for a takeover, this keeper's
// own for a holding it had let expire. Reason says why a takeover could take
// it (one of the Reason… constants), "" when it was not a takeover.
type Acquired struct {
	Lease
	Previous string
	Reason   string
}

// Why a lease changed hands (Acquired.Reason, and the rows of
// compute_lease_takeovers).
const (
	// ReasonRestart: a later incarnation of the holder's worker identity
	// took it (the identity restarted).
	ReasonRestart = "restart"
	// ReasonHeartbeatLost: the holder's heartbeat had stopped for longer than
	// the dead_after it declared (its interval times the beats it may miss).
	ReasonHeartbeatLost = "heartbeat_lost"
	// ReasonLeaseExpired: the holding had expired without a renewal.
	ReasonLeaseExpired = "lease_expired"
	// ReasonReleased: the holder had released it, or had stopped gracefully.
	ReasonReleased = "released"
)

// Lost is a holding a round lost, and why.
type Lost struct {
	Lease
	Why string
}

// Why a holding is lost (Lost.Why).
const (
	lostTaken   = "renewal found it held by another owner"
	LostExpired = "expired by this process's clock without a renewal"
)

// standbyPoll is how often a keeper that wants a lease held by another looks for
// it to be released (it also retries at the holder's expiry).
const standbyPoll = time.Second

// Keeper keeps a process's leases: see the package doc.
type Keeper struct {
	o KeeperOptions

	mu    sync.Mutex
	want  map[string]bool
	held  map[string]Lease
	retry map[string]time.Time // a name held by another: try again at its expiry
	wake  chan struct{}
	// failing counts the rounds in a row that could not reach the database;
	// while it is not zero, rounds come every FailedRoundRetry.
	failing int
}

// failedRoundRetry is how soon a keeper tries again after a round that could not
// reach the database (a restart, a network cut): the leases come back, and their
// work resumes, within this of the server accepting connections again.
const failedRoundRetry = 100 * time.Millisecond

// NewKeeper returns a keeper; call Run to start it.
func NewKeeper(o KeeperOptions) *Keeper {
	if o.TTL <= 0 {
		o.TTL = config.DefaultLeaseTTL
	}
	if o.Renew <= 0 {
		o.Renew = o.TTL / 3
	}
	if o.Anchor == nil {
		o.Anchor = &clock.Anchor{}
	}
	return &Keeper{o: o, want: map[string]bool{}, held: map[string]Lease{}, retry: map[string]time.Time{}, wake: make(chan struct{}, 1)}
}

// Owner is the keeper's owner id.
func (k *Keeper) Owner() string { return k.o.Owner }

// Want adds names to acquire and keep.
func (k *Keeper) Want(names ...string) {
	k.mu.Lock()
	for _, n := range names {
		k.want[n] = true
		delete(k.retry, n)
	}
	k.mu.Unlock()
	k.Wake()
}

// Held returns the current holding of name, if this keeper holds it and it has
// not expired by this process's clock (less the safety margin): a process that
// was paused past its lease does not trust it before its next renewal says so,
// so work it fetched meanwhile is not started.
func (k *Keeper) Held(name string) (Lease, bool) {
	k.mu.Lock()
	l, ok := k.held[name]
	k.mu.Unlock()
	if !ok || !k.o.Anchor.Now().Before(l.ExpiresAt.Add(-k.margin())) {
		return Lease{}, false
	}
	if k.o.Liveness != nil {
		if trusted, _ := k.o.Liveness.Trusted(); !trusted {
			return Lease{}, false
		}
	}
	return l, true
}

// HeldAll returns every holding of this keeper, by name.
func (k *Keeper) HeldAll() []Lease {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make([]Lease, 0, len(k.held))
	for _, l := range k.held {
		out = append(out, l)
	}
	slices.SortFunc(out, func(a, b Lease) int {
		if a.Name < b.Name {
			return -1
		}
		return 1
	})
	return out
}

// Wake makes the keeper run a round now: it wants new names, or its process
// has reason to think its holdings changed (it was silent past its heartbeat
// deadline, so a standby may have taken them).
func (k *Keeper) Wake() {
	select {
	case k.wake <- struct{}{}:
	default:
	}
}

// Run acquires and renews until ctx is done. It does not release the leases;
// call Release for a graceful stop.
func (k *Keeper) Run(ctx context.Context) {
	for {
		k.tick(ctx)
		wait := k.nextWait()
		select {
		case <-ctx.Done():
			return
		case <-k.wake:
		case <-time.After(wait):
		}
	}
}

// nextWait is the time until the next renewal, the earliest retry of a name held
// by another, or the earliest local expiry of a holding, whichever comes first.
func (k *Keeper) nextWait() time.Duration {
	k.mu.Lock()
	defer k.mu.Unlock()
	wait := k.o.Renew
	now := k.o.Anchor.Now()
	if k.failing > 0 {
		wait = min(wait, failedRoundRetry)
	}
	if len(k.held) < len(k.want) {
		// A standby looks for released leases every second (a cheap, lock-free
		// check), so a graceful stop hands over at once, not at the next renewal.
		wait = min(wait, standbyPoll)
	}
	for _, at := range k.retry {
		if d := at.Sub(now) + 5*time.Millisecond; d < wait {
			wait = d
		}
	}
	for _, l := range k.held {
		if d := l.ExpiresAt.Add(-k.margin()).Sub(now); d < wait {
			wait = d
		}
	}
	return max(wait, time.Millisecond)
}

// margin: a holding is treated as lost this long before its expiry when it could
// not be renewed, so the work it fences has stopped by the time another owner
// can take it.
func (k *Keeper) margin() time.Duration { return min(time.Second, k.o.TTL/10) }

// tick runs one round, the way River's elector splits its loop into attempt
// elect, keep leadership and resign: renew what is held, take what is wanted
// and not held, re-sample the clock, then record the outcome and tell the
// holder. Run schedules the next round (nextWait).
func (k *Keeper) tick(ctx context.Context) {
	start := time.Now()
	var gen uint64
	if k.o.Liveness != nil {
		_, gen = k.o.Liveness.Trusted()
	}
	held, toTake := k.roundNames()
	renewed, lost, ok := k.renewHeld(ctx, held)
	if !ok {
		k.report(start, nil, nil, lost, LostExpired)
		return
	}
	taken, others, unreachable := k.takeWanted(ctx, toTake)
	k.sampleClock(ctx, unreachable)
	acquired := k.record(renewed, lost, taken, others, unreachable)
	if k.o.Liveness != nil {
		// What it holds now, it held at the renewal, after the silence.
		k.o.Liveness.Confirm(gen)
	}
	k.announce(ctx, renewed, lost, acquired)
	k.report(start, renewed, acquired, lost, lostTaken)
}

// report hands a round that did something to OnRound.
func (k *Keeper) report(start time.Time, renewed []Lease, acquired []Acquired, lost []Lease, why string) {
	if k.o.OnRound == nil || len(renewed)+len(acquired)+len(lost) == 0 {
		return
	}
	r := Round{Start: start, Renewed: renewed, Acquired: acquired}
	for _, l := range lost {
		r.Lost = append(r.Lost, Lost{Lease: l, Why: why})
	}
	k.o.OnRound(r)
}

// roundNames splits the wanted names into the holdings to renew and the names
// to take (sorted).
func (k *Keeper) roundNames() (held []Lease, toTake []string) {
	k.mu.Lock()
	held = make([]Lease, 0, len(k.held))
	for n := range k.want {
		if l, ok := k.held[n]; ok {
			held = append(held, l)
		} else {
			toTake = append(toTake, n)
		}
	}
	k.mu.Unlock()
	slices.Sort(toTake)
	return held, toTake
}

// renewHeld renews held: a plain update of expires_at, which never waits for
// this process's own fenced transactions. It returns the renewed holdings and
// those another owner took (lost). When the renewal fails, it declares lost the
// holdings about to expire by this process's clock (returned as lost) and
// returns ok false: the round ends there.
func (k *Keeper) renewHeld(ctx context.Context, held []Lease) (renewed, lost []Lease, ok bool) {
	if len(held) == 0 {
		return nil, nil, true
	}
	got, err := Renew(ctx, k.o.DB, k.o.TTL, held...)
	if err != nil {
		if ctx.Err() == nil {
			if fault.Has(err, fault.Unavailable) {
				k.roundFailed(err, "lease renewal failed")
			} else {
				k.o.Log.Warn().Err(err).Msg("lease renewal failed")
			}
		}
		return nil, k.expireLocally(), false
	}
	still := map[string]bool{}
	for _, l := range got {
		still[l.Name] = true
	}
	for _, l := range held {
		if !still[l.Name] {
			lost = append(lost, l)
		}
	}
	return got, lost, true
}

// takeWanted takes toTake: the guarded upsert, waiting (at most one renewal
// interval) for the previous holder's fenced transactions; the running jobs it
// left are handed back in the same transaction (Taken). When that wait runs
// out (a previous holder paused inside a fenced transaction holds one of the
// leases until its idle-in-transaction timeout), the names are taken one by
// one, each waiting a moment, so that the others change hands now instead of
// all waiting for that one. It returns the holdings taken, those held by
// others, and whether the database could not be reached.
func (k *Keeper) takeWanted(ctx context.Context, toTake []string) (taken []Acquired, others []holding, unreachable bool) {
	if len(toTake) == 0 {
		return nil, nil, false
	}
	taken, others, err := k.takeTx(ctx, toTake, k.o.Renew)
	if err != nil && pg.SQLState(err) == "55P03" && len(toTake) > 1 && ctx.Err() == nil {
		taken, others = nil, nil
		wait := max(k.o.Renew/time.Duration(4*len(toTake)), 10*time.Millisecond)
		var waiting []string
		for _, name := range toTake {
			t, o, err1 := k.takeTx(ctx, []string{name}, wait)
			if err1 != nil {
				if pg.SQLState(err1) == "55P03" {
					waiting = append(waiting, name)
					continue
				}
				err = err1
				break
			}
			taken, others, err = append(taken, t...), append(others, o...), nil
		}
		if err == nil && len(waiting) > 0 {
			k.o.Log.Info().Strs("leases", waiting).Msg("takeover waits for the previous holder's transactions; retrying")
		}
	}
	if err == nil {
		return taken, others, false
	}
	if ctx.Err() == nil {
		switch {
		case pg.SQLState(err) == "55P03":
			k.o.Log.Info().Strs("leases", toTake).Msg("takeover waits for the previous holder's transactions; retrying")
		case fault.Has(pg.Translate(err), fault.Unavailable):
			k.roundFailed(err, "lease acquisition failed")
			unreachable = true
		default:
			k.o.Log.Warn().Err(err).Msg("lease acquisition failed")
		}
	}
	return taken, others, unreachable
}

// takeTx takes names in one transaction, waiting at most lockTimeout for
// the previous holders' fenced transactions.
func (k *Keeper) takeTx(ctx context.Context, names []string, lockTimeout time.Duration) (taken []Acquired, others []holding, err error) {
	err = pg.InTx(ctx, k.o.DB, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", max(lockTimeout.Milliseconds(), 1))); err != nil {
			return err
		}
		got, err := acquireMany(ctx, tx, names, k.o.Owner, k.o.TTL)
		if err != nil {
			return err
		}
		taken, others = taken[:0], others[:0]
		for _, h := range got {
			if h.Owner != k.o.Owner {
				others = append(others, h)
				continue
			}
			if k.o.Taken != nil {
				if err := k.o.Taken(ctx, tx, h.Lease); err != nil {
					return err
				}
			}
			taken = append(taken, Acquired{Lease: h.Lease, Previous: h.Previous, Reason: h.Reason})
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return taken, others, nil
}

// sampleClock re-samples the clock anchor; unreachable says this round already
// logged an outage.
func (k *Keeper) sampleClock(ctx context.Context, unreachable bool) {
	err := k.o.Anchor.Sample(ctx, k.o.DB)
	if err == nil || ctx.Err() != nil {
		return
	}
	if fault.Has(err, fault.ClockSkew) {
		k.o.Log.Error().Err(err).Msg("clock skew: fencing still holds (it uses the database clock), but fix this host's clock")
	} else if k.failing > 0 || unreachable {
		k.o.Log.Debug().Err(err).Msg("clock sample failed") // the outage is logged once above
	} else {
		k.o.Log.Warn().Err(err).Msg("clock sample failed")
	}
}

// record applies a round's outcome to the keeper's state: it ends a run of
// failed rounds, forgets lost holdings, stores renewed and taken ones that are
// still wanted, and retries names held by others when they become takeable
// (their expiry, or their holder's heartbeat deadline). It returns the
// holdings newly acquired.
func (k *Keeper) record(renewed, lost []Lease, taken []Acquired, others []holding, unreachable bool) (acquired []Acquired) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.failing > 0 && !unreachable {
		k.o.Log.Info().Int("failed_rounds", k.failing).Msg("lease rounds reach the database again")
		k.failing = 0
	}
	for _, l := range lost {
		delete(k.held, l.Name)
	}
	for _, l := range renewed {
		if k.want[l.Name] {
			k.held[l.Name] = l
		}
	}
	for _, a := range taken {
		if k.want[a.Name] {
			k.held[a.Name] = a.Lease
			delete(k.retry, a.Name)
			acquired = append(acquired, a)
		}
	}
	for _, h := range others {
		if h.Owner != "" { // held by another: try again when it can be taken
			k.retry[h.Name] = h.TakeableAt
		}
	}
	return acquired
}

// announce logs a round's losses and acquisitions and calls the holder's
// OnLost, OnAcquired and Kept, outside the keeper's lock.
func (k *Keeper) announce(ctx context.Context, renewed, lost []Lease, acquired []Acquired) {
	for _, l := range lost {
		k.o.Log.Warn().Str("lease", l.Name).Int64("epoch", l.Epoch).Msg("lease lost: another owner took it")
		if k.o.OnLost != nil {
			k.o.OnLost(l)
		}
	}
	for _, a := range acquired {
		ev := k.o.Log.Info().Str("lease", a.Name).Int64("epoch", a.Epoch)
		if a.Reason != "" {
			ev = ev.Str("previous_owner", a.Previous).Str("reason", a.Reason)
		}
		ev.Msg("lease acquired")
		if k.o.OnAcquired != nil {
			k.o.OnAcquired(a)
		}
	}
	if k.o.Kept != nil && len(renewed)+len(acquired) > 0 && ctx.Err() == nil {
		held := slices.Clone(renewed)
		for _, a := range acquired {
			held = append(held, a.Lease)
		}
		k.o.Kept(ctx, held)
	}
}

// roundFailed counts a round that could not reach the database; it logs the
// first of a run (the rest at debug level: they come every FailedRoundRetry).
func (k *Keeper) roundFailed(err error, msg string) {
	k.mu.Lock()
	k.failing++
	first := k.failing == 1
	k.mu.Unlock()
	if first {
		k.o.Log.Warn().Err(err).Msg(msg + "; retrying every " + failedRoundRetry.String())
	} else {
		k.o.Log.Debug().Err(err).Int("failed_rounds", k.failing).Msg(msg)
	}
}

// expireLocally declares lost every holding that is about to expire by this
// process's clock, when it could not be renewed, and returns them.
func (k *Keeper) expireLocally() []Lease {
	now := k.o.Anchor.Now()
	var lost []Lease
	k.mu.Lock()
	for n, l := range k.held {
		if !now.Before(l.ExpiresAt.Add(-k.margin())) {
			delete(k.held, n)
			lost = append(lost, l)
		}
	}
	k.mu.Unlock()
	for _, l := range lost {
		k.o.Log.Warn().Str("lease", l.Name).Int64("epoch", l.Epoch).Msg("lease expired without renewal")
		if k.o.OnLost != nil {
			k.o.OnLost(l)
		}
	}
	return lost
}

// Release gives up every holding (and stops wanting them), so other processes
// can take them at once. Call it after the work they fence has stopped.
func (k *Keeper) Release(ctx context.Context) error {
	k.mu.Lock()
	ls := make([]Lease, 0, len(k.held))
	for _, l := range k.held {
		ls = append(ls, l)
	}
	k.held = map[string]Lease{}
	k.want = map[string]bool{}
	k.mu.Unlock()
	if len(ls) == 0 {
		return nil
	}
	err := Release(ctx, k.o.DB, ls...)
	if err == nil {
		k.o.Log.Info().Int("leases", len(ls)).Msg("leases released")
	}
	return err
}
