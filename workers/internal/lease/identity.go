package lease

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/platform/config"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
)

// HeartbeatEvery is how often a live incarnation records, in compute_workers,
// that it is alive, unless configured otherwise (BETTER_COMPUTE_HEARTBEAT).
const HeartbeatEvery = config.DefaultHeartbeat

// MissedBeats is how many heartbeats an incarnation may miss before it is
// taken for dead, unless configured otherwise (BETTER_COMPUTE_MISSED_BEATS).
const MissedBeats = config.DefaultMissedBeats

// legacyDeadAfter is how long an incarnation that declared no dead_after (a
// binary from before heartbeat takeovers) may be silent before a restart of its
// identity takes it for dead: three of its one-second beats.
const legacyDeadAfter = 3 * time.Second

var identityRe = regexp.MustCompile(`^[A-Za-z0-9._:@/-]{1,200}$`)

// ValidIdentity returns INVALID_CONFIG unless identity is 1 to 200 letters,
// digits and . _ : @ / - (no #: it separates the incarnation in a lease owner).
func ValidIdentity(identity string) error {
	if !identityRe.MatchString(identity) {
		return fault.New(fault.InvalidConfig, "worker identity %q: want 1 to 200 letters, digits and . _ : @ / -", identity)
	}
	return nil
}

// ClaimOptions configure Claim.
type ClaimOptions struct {
	// Identity is the worker identity. "" picks HOST/SLOT: the host name and the
	// lowest slot (0, 1, …) that no running process on this host holds, so a
	// process restarted on its host takes back the slot its predecessor held.
	Identity string
	// Host is this host's name; default os.Hostname().
	Host string
	// Heartbeat is the interval Run beats at; default HeartbeatEvery.
	Heartbeat time.Duration
	// MissedBeats is how many beats the incarnation may miss before any
	// standby takes its leases (default MissedBeats): it declares
	// Heartbeat × MissedBeats as its dead_after.
	MissedBeats int
}

// Incarnation is one start of a worker identity. Its leases are owned by
// Owner(), "<identity>#<number>".
type Incarnation struct {
	Identity string
	Number   int64
	// Took describes the incarnation this one replaced and why it was taken for
	// gone; nil for a new identity.
	Took *predecessor

	db        pg.DBTX
	hb        time.Duration
	deadAfter time.Duration

	mu      sync.Mutex
	attempt time.Time // the start of the last beat Run attempted
	doubt   uint64    // the generation of a silence not yet confirmed; 0: none
	gen     uint64
}

// DeadAfter is how long this incarnation may be silent before any standby
// takes its leases: its heartbeat interval times the beats it may miss.
func (i *Incarnation) DeadAfter() time.Duration { return i.deadAfter }

// predecessor is the incarnation a Claim replaced.
type predecessor struct {
	Number int64
	Host   string
	PID    int
	Reason string // why it was taken for gone: "it stopped gracefully", …
}

// Owner is the lease owner of this incarnation.
func (i *Incarnation) Owner() string { return ownerOf(i.Identity, i.Number) }

// ownerOf is the lease owner of incarnation n of identity: "<identity>#<n>".
func ownerOf(identity string, n int64) string { return identity + "#" + strconv.FormatInt(n, 10) }

// OwnerIdentity splits a lease owner "<identity>#<n>" into its identity and
// incarnation; ok is false for an owner of another form.
func OwnerIdentity(owner string) (identity string, incarnation int64, ok bool) {
	at := strings.LastIndexByte(owner, '#')
	if at <= 0 {
		return "", 0, false
	}
	n, err := strconv.ParseInt(owner[at+1:], 10, 64)
	if err != nil || n <= 0 {
		return "", 0, false
	}
	return owner[:at], n, true
}

// ownerArgs are the $identity, $incarnation arguments of the lease statements:
// NULL for an owner that is not a worker incarnation.
func ownerArgs(owner string) (any, int64) {
	id, n, ok := OwnerIdentity(owner)
	if !ok {
		return nil, 0
	}
	return id, n
}

// procID names one process on one host.
type procID struct {
	pid    int
	bootID string
	start  int64
}

type workerRow struct {
	incarnation int64
	host        string
	proc        procID
	stopped     bool
	silent      time.Duration // since the last heartbeat, by the database clock
	seenAt      time.Time
	deadAfter   time.Duration // as the incarnation declared it, or legacyDeadAfter
}

const readWorkerSQL = `SELECT incarnation, host, pid, boot_id, proc_start, stopped_at IS NOT NULL,
       extract(epoch FROM compute_now() - seen_at)::float8, seen_at,
       coalesce(extract(epoch FROM dead_after)::float8, 0)
FROM compute_workers WHERE identity = $1`

func readWorker(ctx context.Context, db pg.DBTX, identity string) (workerRow, bool, error) {
	var r workerRow
	var silent, deadAfter float64
	err := db.QueryRow(ctx, readWorkerSQL, identity).Scan(&r.incarnation, &r.host, &r.proc.pid, &r.proc.bootID,
		&r.proc.start, &r.stopped, &silent, &r.seenAt, &deadAfter)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, false, nil
	}
	if err != nil {
		return r, false, pg.Translate(fmt.Errorf("error reading worker identity %s: %w", identity, err))
	}
	r.silent = time.Duration(silent * float64(time.Second))
	r.deadAfter = time.Duration(deadAfter * float64(time.Second))
	if r.deadAfter <= 0 {
		r.deadAfter = legacyDeadAfter
	}
	return r, true, nil
}

// Claim starts a new incarnation of a worker identity. The incarnation it
// replaces must be gone: stopped gracefully, its process exited (checked on this
// host by pid, boot id and start time), or silent for longer than the dead_after
// it declared; when none of these can be told at once (another host), Claim
// watches its heartbeat until that long has passed since its last beat. A live one makes Claim return CONFLICT: two live
// processes with one identity would take each other's leases. With no Identity
// configured, a live process on a slot makes Claim try the next slot instead.
//
// The new incarnation's leases (Owner) take over those of the earlier ones at
// once with a new epoch (AcquireMany), so the earlier processes are fenced as
// after any takeover; call Run to keep the heartbeat.
func Claim(ctx context.Context, db pg.DBTX, o ClaimOptions) (*Incarnation, error) {
	if o.Host == "" {
		o.Host, _ = os.Hostname()
		if o.Host == "" {
			o.Host = "localhost"
		}
	}
	if o.Heartbeat <= 0 {
		o.Heartbeat = HeartbeatEvery
	}
	if o.MissedBeats <= 0 {
		o.MissedBeats = MissedBeats
	}
	if o.Identity != "" {
		if err := ValidIdentity(o.Identity); err != nil {
			return nil, err
		}
		inc, err := claimOne(ctx, db, o, o.Identity, false)
		if err != nil {
			return nil, err
		}
		return inc, nil
	}
	host := strings.Map(func(r rune) rune {
		if identityRe.MatchString(string(r)) {
			return r
		}
		return '-'
	}, o.Host)
	for slot := 0; slot < 1000; slot++ {
		inc, err := claimOne(ctx, db, o, fmt.Sprintf("%s/%d", host, slot), true)
		if fault.Has(err, fault.Conflict) {
			continue
		}
		return inc, err
	}
	return nil, fault.New(fault.Unavailable, "every worker slot 0-999 of host %s is held by a running process", host)
}

type verdict int

const (
	gone verdict = iota
	live
	unknown
)

// judge tells whether the incarnation in r is gone, live, or cannot be told yet.
func judge(r workerRow, host string, auto bool) (verdict, string) {
	if r.stopped {
		return gone, "it stopped gracefully"
	}
	silent := r.silent.Round(time.Millisecond)
	if r.host == host {
		if alive, ok := r.proc.running(); ok {
			switch {
			case !alive:
				return gone, fmt.Sprintf("its process %d on this host has exited", r.proc.pid)
			case auto:
				return live, fmt.Sprintf("its process %d on this host is running", r.proc.pid)
			case r.silent >= r.deadAfter:
				return gone, fmt.Sprintf("its process %d on this host runs but has not beaten for %s (paused?): it stops when it resumes", r.proc.pid, silent)
			default:
				return live, fmt.Sprintf("its process %d on this host is running (last heartbeat %s ago)", r.proc.pid, silent)
			}
		}
	}
	if r.silent >= r.deadAfter {
		return gone, fmt.Sprintf("no heartbeat for %s", silent)
	}
	return unknown, ""
}

func claimOne(ctx context.Context, db pg.DBTX, o ClaimOptions, identity string, auto bool) (*Incarnation, error) {
	me := thisProcess()
	deadAfter := o.Heartbeat * time.Duration(o.MissedBeats)
	for {
		var n int64
		err := db.QueryRow(ctx, `INSERT INTO compute_workers (identity, incarnation, host, pid, boot_id, proc_start, dead_after)
VALUES ($1, 1, $2, $3, $4, $5, make_interval(secs => $6)) ON CONFLICT (identity) DO NOTHING RETURNING incarnation`,
			identity, o.Host, me.pid, me.bootID, me.start, deadAfter.Seconds()).Scan(&n)
		if err == nil {
			return &Incarnation{Identity: identity, Number: n, db: db, hb: o.Heartbeat, deadAfter: deadAfter}, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return nil, pg.Translate(fmt.Errorf("error claiming worker identity %s: %w", identity, err))
		}
		r, found, err := readWorker(ctx, db, identity)
		if err != nil {
			return nil, err
		}
		if !found {
			continue // deleted meanwhile: insert again
		}
		v, why := judge(r, o.Host, auto)
		if v == unknown {
			if v, why, err = watch(ctx, db, identity, r, o.Heartbeat); err != nil {
				return nil, err
			}
		}
		if v == live {
			return nil, fault.New(fault.Conflict,
				"worker identity %s is in use by a live process (incarnation %d on host %s, pid %d): %s; two live processes with one identity would take each other's leases, so give each worker its own identity",
				identity, r.incarnation, r.host, r.proc.pid, why)
		}
		err = db.QueryRow(ctx, `UPDATE compute_workers
SET incarnation = incarnation + 1, host = $3, pid = $4, boot_id = $5, proc_start = $6,
    started_at = compute_now(), seen_at = compute_now(), stopped_at = NULL, dead_after = make_interval(secs => $7)
WHERE identity = $1 AND incarnation = $2 RETURNING incarnation`,
			identity, r.incarnation, o.Host, me.pid, me.bootID, me.start, deadAfter.Seconds()).Scan(&n)
		if errors.Is(err, pgx.ErrNoRows) {
			continue // another process claimed it first: judge that one
		}
		if err != nil {
			return nil, pg.Translate(fmt.Errorf("error claiming worker identity %s: %w", identity, err))
		}
		return &Incarnation{Identity: identity, Number: n, db: db, hb: o.Heartbeat, deadAfter: deadAfter,
			Took: &predecessor{Number: r.incarnation, Host: r.host, PID: r.proc.pid, Reason: why}}, nil
	}
}

// watch waits for the incarnation of r to beat, until it has been silent for
// its dead_after: it is live if it beats (or another process claimed the
// identity meanwhile), gone if not. hb, this process's heartbeat interval,
// paces the looks.
func watch(ctx context.Context, db pg.DBTX, identity string, r workerRow, hb time.Duration) (verdict, string, error) {
	deadline := time.Now().Add(r.deadAfter - r.silent)
	for time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return 0, "", fault.Wrap(fault.Unavailable, ctx.Err(), "claiming worker identity %s", identity)
		case <-time.After(hb / 4):
		}
		now, found, err := readWorker(ctx, db, identity)
		if err != nil {
			return 0, "", err
		}
		if !found || now.incarnation != r.incarnation || !now.seenAt.Equal(r.seenAt) || now.stopped {
			return live, fmt.Sprintf("its heartbeat went on (host %s, pid %d)", r.host, r.proc.pid), nil
		}
	}
	return gone, fmt.Sprintf("no heartbeat for %s", r.deadAfter.Round(time.Millisecond)), nil
}

// Beat records that this incarnation is alive. It returns CONFLICT when a later
// incarnation of the identity has replaced it: this process must stop at once
// (its leases are taken over, so its fenced work fails anyway).
func (i *Incarnation) Beat(ctx context.Context) error {
	tag, err := i.db.Exec(ctx, `UPDATE compute_workers SET seen_at = compute_now()
WHERE identity = $1 AND incarnation = $2 AND stopped_at IS NULL`, i.Identity, i.Number)
	if err != nil {
		return pg.Translate(fmt.Errorf("error recording the heartbeat of %s: %w", i.Owner(), err))
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	r, found, err := readWorker(ctx, i.db, i.Identity)
	if err != nil {
		return err
	}
	if found && r.incarnation == i.Number {
		return nil // retired by this process's own graceful stop
	}
	if !found {
		return fault.New(fault.Conflict, "worker identity %s was deleted from compute_workers: this process (incarnation %d) stops", i.Identity, i.Number)
	}
	return fault.New(fault.Conflict,
		"worker identity %s was taken over by incarnation %d on host %s (pid %d): another process runs with this identity, so this one (incarnation %d) stops",
		i.Identity, r.incarnation, r.host, r.proc.pid, i.Number)
}

// Hooks are what Run tells its process.
type Hooks struct {
	// Superseded is called once, with the CONFLICT, when a later incarnation
	// of the identity replaced this one; Run returns after it.
	Superseded func(error)
	// Failed, optional, is called for every beat that failed (the database
	// away); the next tick retries.
	Failed func(error)
	// Resumed, optional, is called after a beat that ended a silence longer
	// than DeadAfter (the process was paused, or cut off from the database):
	// any standby may have taken its leases meanwhile.
	Resumed func(silent time.Duration)
}

// Run beats every heartbeat interval until ctx is done, or until a later
// incarnation replaced this one (Hooks.Superseded).
func (i *Incarnation) Run(ctx context.Context, h Hooks) {
	t := time.NewTicker(i.hb)
	defer t.Stop()
	last := time.Now() // the start of the last beat that succeeded
	i.attempted(last)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		start := time.Now()
		i.attempted(start)
		// A slow beat is let land (its seen_at is when the server began it, so
		// it still counts from then), up to the dead_after less one interval:
		// a gap between attempts never grows to look like a freeze
		// (attempted).
		bctx, cancel := context.WithTimeout(ctx, i.deadAfter-i.hb)
		err := i.Beat(bctx)
		cancel()
		switch {
		case err == nil:
			if silent := start.Sub(last); silent > i.deadAfter {
				i.doubtHoldings()
				if h.Resumed != nil {
					h.Resumed(silent)
				}
			}
			last = start
		case ctx.Err() != nil:
			return
		case fault.Has(err, fault.Conflict):
			h.Superseded(err)
			return
		case h.Failed != nil:
			h.Failed(err)
		}
	}
}

// attempted records the start of a beat. A process that did not even attempt
// one for longer than its dead_after was frozen (SIGSTOP, a VM pause): it
// doubts its holdings from now on, before its beat lands.
func (i *Incarnation) attempted(start time.Time) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if !i.attempt.IsZero() && start.Sub(i.attempt) > i.deadAfter {
		i.doubtLocked()
	}
	i.attempt = start
}

// doubtHoldings records a silence longer than dead_after: another process may
// have taken this one's leases meanwhile.
func (i *Incarnation) doubtHoldings() {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.doubtLocked()
}

// doubtLocked starts a new generation of doubt; i.mu is held.
func (i *Incarnation) doubtLocked() {
	i.gen++
	i.doubt = i.gen
}

// Trusted says whether this process may trust the leases it holds: not while
// it has attempted no beat for longer than its dead_after (it was frozen: any
// standby may have taken them), nor after such a silence until a lease round
// that began after it confirmed them (Confirm). gen names the latest silence,
// for Confirm. An incarnation that Run does not beat is always trusted.
func (i *Incarnation) Trusted() (ok bool, gen uint64) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.attempt.IsZero() {
		return true, i.gen
	}
	return i.doubt == 0 && time.Since(i.attempt) <= i.deadAfter, i.gen
}

// Confirm ends the doubt of silence gen, or of none newer: a lease round that
// began after it renewed what this process still holds.
func (i *Incarnation) Confirm(gen uint64) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.doubt != 0 && i.doubt <= gen {
		i.doubt = 0
	}
}

// Retire records a graceful stop, so the next incarnation takes over without
// watching for a heartbeat.
func (i *Incarnation) Retire(ctx context.Context) error {
	_, err := i.db.Exec(ctx, `UPDATE compute_workers SET stopped_at = compute_now()
WHERE identity = $1 AND incarnation = $2`, i.Identity, i.Number)
	return pg.Translate(err)
}

// ReleaseEarlier releases at once the unexpired leases earlier incarnations of
// this identity still hold, except the names in keep (this incarnation takes
// those over itself), so other processes need not wait out their TTL. It returns
// how many it released.
func (i *Incarnation) ReleaseEarlier(ctx context.Context, keep []string) (int64, error) {
	tag, err := i.db.Exec(ctx, `UPDATE compute_leases SET expires_at = '-infinity'
WHERE starts_with(owner, $1 || '#') AND owner <> $2 AND expires_at > compute_now()
  AND NOT name = ANY($3::text[])
  AND NOT EXISTS (SELECT 1 FROM compute_workers w WHERE w.identity = $1 AND w.incarnation <> $4)`,
		i.Identity, i.Owner(), keep, i.Number)
	if err != nil {
		return 0, pg.Translate(fmt.Errorf("error releasing the leases of earlier incarnations of %s: %w", i.Identity, err))
	}
	return tag.RowsAffected(), nil
}
