// Package workertest starts worker Runtimes on test databases, with short lease
// intervals and fast polling so tests of failover and fencing stay quick.
//
//	db := pgtest.New(t)
//	reg := workers.NewRegistry()
//	… register reconcilers and workers …
//	rt := workertest.Start(t, db.Pool, reg, nil)
package workertest

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/internal/lease"
)

// Fast are the intervals tests use: a 4 s lease renewed every 0.4 s, and River
// polling every 20 ms, in place of the production defaults
// (config.DefaultLeaseTTL, DefaultLeaseRenew, DefaultStopGrace,
// DefaultPollInterval and DefaultWorkersPerShard in platform/config).
var Fast = workers.Options{
	LeaseTTL:        4 * time.Second,
	LeaseRenew:      400 * time.Millisecond,
	StopGrace:       2 * time.Second,
	PollInterval:    20 * time.Millisecond,
	WorkersPerShard: 4,
}

// Start starts a working Runtime on db serving every shard unless o.Shards says
// otherwise, with Fast's intervals where o leaves them zero, logging to t.Log. It
// is stopped at cleanup.
func Start(tb testing.TB, db *pg.Pool, reg *workers.Registry, o *workers.Options) *workers.Runtime {
	tb.Helper()
	var opts workers.Options
	if o != nil {
		opts = *o
	}
	opts.Pool, opts.Registry, opts.Work = db, reg, true
	if opts.LeaseTTL == 0 {
		opts.LeaseTTL = Fast.LeaseTTL
	}
	if opts.LeaseRenew == 0 {
		opts.LeaseRenew = Fast.LeaseRenew
	}
	if opts.StopGrace == 0 {
		opts.StopGrace = Fast.StopGrace
	}
	if opts.PollInterval == 0 {
		opts.PollInterval = Fast.PollInterval
	}
	if opts.WorkersPerShard == 0 {
		opts.WorkersPerShard = Fast.WorkersPerShard
	}
	opts.Log = Logger(tb)
	if opts.Shards == nil {
		var n int
		if err := db.QueryRow(context.Background(), `SELECT shard_count FROM compute_settings`).Scan(&n); err != nil {
			tb.Fatalf("workertest: %v", err)
		}
		for i := 0; i < n; i++ {
			opts.Shards = append(opts.Shards, i)
		}
	}
	rt, err := workers.Start(context.Background(), opts)
	if err != nil {
		tb.Fatalf("workertest: start: %v", err)
	}
	tb.Cleanup(func() { _ = rt.Stop(context.Background()) })
	return rt
}

// Logger is a zerolog logger writing to tb.Log at warn level and above, so a
// passing test is quiet and a failing one shows what went wrong.
func Logger(tb testing.TB) zerolog.Logger {
	return zerolog.New(zerolog.ConsoleWriter{Out: zerolog.NewTestWriter(tb), NoColor: true}).Level(zerolog.WarnLevel).With().Timestamp().Logger()
}

// WaitFor polls cond every 10 ms until it is true or timeout passes, and fails
// the test with msg on timeout.
func WaitFor(tb testing.TB, timeout time.Duration, msg string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %s waiting for: %s", timeout, msg)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Claim starts an incarnation of worker identity on host in db, as a Runtime's
// start does, and returns its lease owner ("<identity>#<n>"). Nothing beats for
// it afterwards: a test ages its heartbeat by updating compute_workers.seen_at.
func Claim(tb testing.TB, db pg.DBTX, identity, host string) string {
	tb.Helper()
	inc, err := lease.Claim(context.Background(), db, lease.ClaimOptions{Identity: identity, Host: host})
	if err != nil {
		tb.Fatalf("workertest: claim %s: %v", identity, err)
	}
	return inc.Owner()
}

// HoldLeases acquires (or renews) each of names for owner for ttl by the
// engine's rules, taking a name from its holder where those allow (it expired,
// or its holder's incarnation is gone, counted in compute_lease_takeovers), and
// fails the test unless owner holds every one afterwards.
func HoldLeases(tb testing.TB, db pg.DBTX, owner string, ttl time.Duration, names ...string) {
	tb.Helper()
	ls, err := lease.AcquireMany(context.Background(), db, names, owner, ttl)
	if err != nil {
		tb.Fatalf("workertest: hold leases %v: %v", names, err)
	}
	held := map[string]string{}
	for _, l := range ls {
		held[l.Name] = l.Owner
	}
	for _, n := range names {
		if held[n] != owner {
			tb.Fatalf("workertest: lease %s is held by %q, not %s", n, held[n], owner)
		}
	}
}
