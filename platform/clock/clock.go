// Package clock is the Go side of Better Compute's one clock, compute_now()
// (migration core/0001_clock).
//
// # Modes
//
// compute_now() is database-wide and in one of four modes:
//
//	system   the server's clock (production)
//	sim      a sim clock that tests and the simulator move, forward only
//	custom   someone replaced compute_now() by hand
//	missing  the function is not there (the database is not migrated)
//
//	         UseSim(at)            Set(later)
//	system ─────────────▶ sim ───────────────▶ sim
//	   ▲                   │    Set(earlier): INVALID_ARGUMENT
//	   └──── UseSystem ────┘
//
// # Anchor
//
// A process anchors its business time to the database with an Anchor: it samples
// compute_now() against its own monotonic clock, and Now() extrapolates from the
// last sample. Each re-sample (the lease keeper does one at every renewal)
// compares the database's progress with the process's own: a drift of more than
// MaxSkew (1 s) is CLOCK_SKEW. In system mode the sample also compares the
// process's wall clock with the server's.
package clock

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
)

// Mode is compute_now()'s mode.
type Mode string

// The modes.
const (
	System  Mode = "system"
	Sim     Mode = "sim"
	Custom  Mode = "custom"
	Missing Mode = "missing"
)

// MaxSkew is the drift beyond which Anchor.Sample returns CLOCK_SKEW.
const MaxSkew = time.Second

// Now returns compute_now().
func Now(ctx context.Context, db pg.DBTX) (time.Time, error) {
	var t time.Time
	err := db.QueryRow(ctx, "SELECT compute_now()").Scan(&t)
	return t, pg.Translate(err)
}

// ModeOf returns compute_now()'s mode. A database without the clock migration
// reads as Missing.
func ModeOf(ctx context.Context, db pg.DBTX) (Mode, error) {
	// Two statements: PostgreSQL resolves a function call when it parses the
	// statement, so one that names compute_clock_mode() fails on a database
	// without it, whatever a CASE around the call says.
	var have bool
	if err := db.QueryRow(ctx, `SELECT to_regprocedure('compute_clock_mode()') IS NOT NULL`).Scan(&have); err != nil {
		return "", pg.Translate(fmt.Errorf("error reading the clock mode: %w", err))
	}
	if !have {
		return Missing, nil
	}
	var m string
	if err := db.QueryRow(ctx, `SELECT compute_clock_mode()`).Scan(&m); err != nil {
		return "", pg.Translate(fmt.Errorf("error reading the clock mode: %w", err))
	}
	return Mode(m), nil
}

// UseSim switches compute_now(), database-wide, to a sim clock standing at at.
func UseSim(ctx context.Context, db pg.DBTX, at time.Time) error {
	_, err := db.Exec(ctx, "SELECT compute_use_sim_clock($1)", at)
	return pg.Translate(err)
}

// Set moves the sim clock to at. It returns INVALID_ARGUMENT when at is before
// the sim clock's time, and INVALID_ARGUMENT when the sim clock is not on.
func Set(ctx context.Context, db pg.DBTX, at time.Time) error {
	_, err := db.Exec(ctx, "SELECT compute_set_sim_clock($1)", at)
	switch pg.SQLState(err) {
	case "22023":
		return fault.Wrap(fault.InvalidArgument, err, "the sim clock cannot move back")
	case "55000":
		return fault.Wrap(fault.InvalidArgument, err, "the sim clock is not on")
	}
	return pg.Translate(err)
}

// Advance moves the sim clock forward by d and returns the new time. Concurrent
// advances add up. It returns INVALID_ARGUMENT for a negative d or when the sim
// clock is not on.
func Advance(ctx context.Context, db pg.DBTX, d time.Duration) (time.Time, error) {
	if d < 0 {
		return time.Time{}, fault.New(fault.InvalidArgument, "the sim clock cannot move back (advance by %s)", d)
	}
	var t time.Time
	// One statement under the clock row's lock (core/0005), so concurrent
	// advances add up.
	err := db.QueryRow(ctx, "SELECT compute_advance_sim_clock(make_interval(secs => $1))", d.Seconds()).Scan(&t)
	if pg.SQLState(err) == "55000" {
		return t, fault.Wrap(fault.InvalidArgument, err, "the sim clock is not on")
	}
	return t, pg.Translate(err)
}

// UseSystem switches compute_now() back to the server's clock.
func UseSystem(ctx context.Context, db pg.DBTX) error {
	_, err := db.Exec(ctx, "SELECT compute_use_system_clock()")
	return pg.Translate(err)
}

// Anchor ties a process's business time to compute_now(). The zero value is not
// usable; call Sample first. It is safe for concurrent use.
type Anchor struct {
	mu       sync.Mutex
	dbAt     time.Time // compute_now() at the sample
	localAt  time.Time // the process's clock (monotonic) at the sample
	mode     Mode
	wallSkew time.Duration // compute_now() - process wall clock, in system mode
	drift    time.Duration // at the last re-sample
	sampled  bool
}

// Sample reads compute_now() and re-anchors. It returns CLOCK_SKEW when, since
// the previous sample, the database's clock and this process's advanced by more
// than MaxSkew apart, or (system mode) when the process's wall clock is more than
// MaxSkew from the server's. The anchor is updated either way.
func (a *Anchor) Sample(ctx context.Context, db pg.DBTX) error {
	var (
		dbAt time.Time
		mode string
	)
	// From a pool, take the connection first: only the round trip is timed. A
	// wait for a busy pool's connection, timed too, would move the midpoint
	// below away from the server's reading by half the wait, and a wait over
	// 2 s would read as CLOCK_SKEW.
	if p, ok := db.(acquirer); ok {
		conn, err := p.Acquire(ctx)
		if err != nil {
			return pg.Translate(fmt.Errorf("error sampling the database clock: %w", err))
		}
		defer conn.Release()
		db = conn
	}
	before := time.Now()
	err := db.QueryRow(ctx, "SELECT compute_now(), compute_clock_mode()").Scan(&dbAt, &mode)
	after := time.Now()
	if err != nil {
		return pg.Translate(fmt.Errorf("error sampling the database clock: %w", err))
	}
	// The server read its clock somewhere within the round trip: take the middle.
	local := before.Add(after.Sub(before) / 2)

	a.mu.Lock()
	defer a.mu.Unlock()
	var drift time.Duration
	if a.sampled && a.mode == Mode(mode) && mode == string(System) {
		predicted := a.dbAt.Add(local.Sub(a.localAt))
		drift = dbAt.Sub(predicted)
	}
	a.dbAt, a.localAt, a.mode, a.sampled, a.drift = dbAt, local, Mode(mode), true, drift
	a.wallSkew = 0
	if a.mode == System {
		a.wallSkew = dbAt.Sub(local.Round(0))
	}
	switch {
	case drift > MaxSkew || drift < -MaxSkew:
		return fault.New(fault.ClockSkew, "this process's clock drifted %s from the database's since the last sample (limit %s)", drift, MaxSkew)
	case a.wallSkew > MaxSkew || a.wallSkew < -MaxSkew:
		return fault.New(fault.ClockSkew, "this process's clock is %s off the database's (limit %s)", -a.wallSkew, MaxSkew)
	}
	return nil
}

// acquirer is a connection pool (*pgxpool.Pool, and pg.Pool through it).
type acquirer interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// Now returns the business time: compute_now() at the last sample plus the time
// this process measured since.
func (a *Anchor) Now() time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.dbAt.Add(time.Since(a.localAt))
}

// Skew returns the database clock minus this process's wall clock at the last
// sample (zero unless the mode is system), and the mode then.
func (a *Anchor) Skew() (time.Duration, Mode) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.wallSkew, a.mode
}
