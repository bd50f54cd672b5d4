package clitest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/bettercompute/bettercompute/cmd/better-compute/cli"
	"github.com/bettercompute/bettercompute/domain/workflow"
	"github.com/bettercompute/bettercompute/platform/clock"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

// Main is an application's TestMain: it runs the tests and then stops the
// embedded PostgreSQL cluster that Start started (pgtest.Main).
//
//	func TestMain(m *testing.M) { clitest.Main(m) }
func Main(m *testing.M) { pgtest.Main(m) }

// DefaultNow is where the sim clock of a Kit starts unless Options.Now says
// otherwise: 2030-01-01T00:00:00Z.
var DefaultNow = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// DefaultTimeout is how long a Wait helper waits unless Options.Timeout says
// otherwise.
const DefaultTimeout = 30 * time.Second

// pollEvery is how often a Wait helper looks again, and lookGrace how long
// past its deadline it lets a look that started before it finish.
const (
	pollEvery = 10 * time.Millisecond
	lookGrace = time.Second
)

// Options configure Start. The zero value (or nil) is a kit with workers, its
// sim clock at DefaultNow and Wait helpers bounded by DefaultTimeout.
type Options struct {
	// Now is where compute_now() stands when the test begins (default
	// DefaultNow). It moves only with Kit.Advance.
	Now time.Time
	// NoWorkers starts no worker runtime: jobs, reconciles, deliveries and
	// workflow steps wait in the database for the test to look at them.
	NoWorkers bool
	// Timeout bounds each Wait helper (default DefaultTimeout).
	Timeout time.Duration
}

// Kit is an application under test: its own database, migrated by the
// application's migrate command, compute_now() on a sim clock, and (unless
// Options.NoWorkers) a worker runtime of the application's registry in the
// test's process. Start makes one; everything is stopped and dropped at the
// test's cleanup (a failing test's database is kept and its name logged).
//
// Its methods fail the test on error, and must be called from the test's
// goroutine (as t.Fatal).
type Kit struct {
	// DB is a pool on the kit's database, for the test's own queries and for
	// the application's functions that take a pool.
	DB *pg.Pool
	// URL is the kit's database URL, for a pool or a command line of the
	// test's own (Run with it as BETTER_COMPUTE_DATABASE_URL).
	URL string

	tb        testing.TB
	ctx       context.Context
	app       cli.App
	timeout   time.Duration
	noWorkers bool
	river     *river.Client[pgx.Tx] // an insert-only client: River's reads of its own tables
}

// Start makes a Kit for app, o (nil for the defaults) saying how:
//
//   - a fresh database, on which app's own migrate command runs through
//     cli.Run, as `app migrate` would: it finds the built-in migrations
//     current (the database is a copy of pgtest's migrated template), applies
//     app's modules' in order, and records what the registry records (fenced
//     job kinds, workflow definitions);
//   - compute_now() on a sim clock standing at o.Now, from before the
//     migrations run;
//   - unless o.NoWorkers, a worker runtime built from app.Registry(), serving
//     every shard with short lease and poll intervals (workertest.Start).
func Start(tb testing.TB, app cli.App, o *Options) *Kit {
	tb.Helper()
	var opts Options
	if o != nil {
		opts = *o
	}
	if opts.Now.IsZero() {
		opts.Now = DefaultNow
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	db := pgtest.New(tb) // the built-in migrations come from pgtest's template
	k := &Kit{DB: db.Pool, URL: db.URL, tb: tb, ctx: tb.Context(), app: app, timeout: opts.Timeout, noWorkers: opts.NoWorkers}

	// The sim clock first, so that what the migrations write is stamped with
	// the test's time.
	if err := clock.UseSim(k.ctx, k.DB, opts.Now); err != nil {
		tb.Fatalf("clitest: the sim clock: %v", err)
	}
	if r := k.Run("migrate"); r.Code != 0 {
		tb.Fatalf("clitest: %s migrate: exit %d: %s", appName(app), r.Code, strings.TrimSpace(r.Stderr))
	}
	var err error
	k.river, err = river.NewClient(riverpgxv5.New(k.DB.Pool), &river.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		tb.Fatalf("clitest: a River client: %v", err)
	}
	if !opts.NoWorkers {
		reg, err := app.Registry()
		if err != nil {
			tb.Fatalf("clitest: %s's registry: %v", appName(app), err)
		}
		workertest.Start(tb, k.DB, reg, nil)
	}
	return k
}

func appName(app cli.App) string {
	if app.Name == "" {
		return "better-compute"
	}
	return app.Name
}

// InTx runs fn, the application's state change, in one transaction on the
// kit's database, and fails the test if it returns an error (the transaction
// is then rolled back). A workflow started or signalled in it wakes the kit's
// workers as soon as it commits.
func (k *Kit) InTx(fn func(ctx context.Context, tx pgx.Tx) error) {
	k.tb.Helper()
	if err := pg.InTx(k.ctx, k.DB, fn); err != nil {
		k.tb.Fatalf("clitest: InTx: %v", err)
	}
}

// Run runs one command line of the application in-process against the kit's
// database (its only variable is BETTER_COMPUTE_DATABASE_URL), as Run does,
// and returns its exit code and output. It does not fail the test: check
// Result.Code. Use the package's Run for a command that runs until cancelled
// (worker, serve) or one that needs more of the environment.
func (k *Kit) Run(args ...string) Result {
	k.tb.Helper()
	return Run(k.tb, k.ctx, k.app, []string{"BETTER_COMPUTE_DATABASE_URL=" + k.URL}, args...)
}

// Now returns compute_now(), the business time of the kit's database, in UTC.
func (k *Kit) Now() time.Time {
	k.tb.Helper()
	t, err := clock.Now(k.ctx, k.DB)
	if err != nil {
		k.tb.Fatalf("clitest: Now: %v", err)
	}
	return t.UTC()
}

// Advance moves compute_now() forward by d and returns the new time (UTC).
// What waits on compute_now() is then due: sleeping and waiting workflows whose
// deadline came are woken at once, delayed reconciles are taken at the next
// poll. River's own schedule (a job's ScheduledAt, retry backoff) follows the
// wall clock, not this one.
//
// Leases expire on compute_now() too, so the jump leaves every shard lease
// expired until its holder's next renewal (within workertest.Fast's
// LeaseRenew): Advance waits for that before it wakes the workflows, so that
// their steps are not fenced. Work already in flight when the clock jumped may
// be fenced and is retried, as after a pause in production.
func (k *Kit) Advance(d time.Duration) time.Time {
	k.tb.Helper()
	// The shard leases live before the jump (none without workers).
	rows, err := k.DB.Query(k.ctx, `SELECT name FROM compute_leases WHERE starts_with(name, 'shard/') AND expires_at > compute_now()`)
	var held []string
	if err == nil {
		held, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil {
		k.tb.Fatalf("clitest: Advance(%s): reading the leases: %v", d, pg.Translate(err))
	}
	t, err := clock.Advance(k.ctx, k.DB, d)
	if err != nil {
		k.tb.Fatalf("clitest: Advance(%s): %v", d, err)
	}
	if len(held) > 0 {
		k.wait(fmt.Sprintf("the %d shard leases held before Advance(%s) to be renewed", len(held), d), func(ctx context.Context) (bool, string, error) {
			var live int
			err := k.DB.QueryRow(ctx, `SELECT count(*) FROM compute_leases WHERE name = ANY($1) AND expires_at > compute_now()`, held).Scan(&live)
			if err != nil {
				return false, "", pg.Translate(err)
			}
			return live == len(held), fmt.Sprintf("%d of them renewed", live), nil
		})
	}
	// The workers wake due workflows once a second; do it now.
	if _, err := workflow.WakeDue(k.ctx, k.DB); err != nil {
		k.tb.Fatalf("clitest: Advance(%s): waking due workflows: %v", d, err)
	}
	return t.UTC()
}

// WaitReconciled waits until key of reconciler kind has no reconcile due: no
// row in compute_dirty, or one due only later on compute_now() (a DirtyOpts
// Delay, a Result.RequeueAfter: Advance, then wait again). A key whose
// reconcile failed waits for its own River job's retries; the test fails at
// once if that job was discarded or cancelled (the key then waits for its next
// dirty), with its errors.
func (k *Kit) WaitReconciled(kind, key string) {
	k.tb.Helper()
	k.wait(fmt.Sprintf("the reconcile of %s %q", kind, key), func(ctx context.Context) (bool, string, error) {
		var (
			jobID          *int64
			notBefore, now time.Time
			gen            int64
		)
		err := k.DB.QueryRow(ctx, `SELECT job_id, not_before, compute_now(), gen FROM compute_dirty WHERE kind = $1 AND key = $2`, kind, key).
			Scan(&jobID, &notBefore, &now, &gen)
		if errors.Is(err, pgx.ErrNoRows) {
			return true, "", nil
		}
		if err != nil {
			return false, "", pg.Translate(err)
		}
		if jobID == nil {
			if notBefore.After(now) {
				return true, "", nil // due later: the test moves the clock
			}
			return false, fmt.Sprintf("dirty (generation %d) and due since %s, compute_now() %s: not yet taken by its shard's worker",
				gen, stamp(notBefore), stamp(now)), nil
		}
		j, err := k.river.JobGet(ctx, *jobID)
		if errors.Is(err, river.ErrNotFound) {
			return false, "", fmt.Errorf("its reconcile job %d is gone: the key waits for its next dirty", *jobID)
		}
		if err != nil {
			return false, "", err
		}
		if j.State == rivertype.JobStateDiscarded || j.State == rivertype.JobStateCancelled {
			return false, "", fmt.Errorf("its reconcile failed for good, %s%s: the key waits for its next dirty", describeJob(j), lastErrors(j))
		}
		if j.Kind == "reconcile" { // a key whose reconcile failed in a batch
			return false, "its reconcile failed and is retried by its own " + describeJob(j) + lastErrors(j), nil
		}
		return false, "taken by " + describeJob(j), nil
	})
}

// WaitJobs waits until no job of River kind kind is available, scheduled,
// retryable, pending or running, and returns the jobs of that kind (completed,
// cancelled), oldest first, for the test to look at. It fails the test at once
// when one was discarded, with its errors. A job scheduled for later waits for
// the wall clock (River's schedule), not for Advance.
func (k *Kit) WaitJobs(kind string) []*rivertype.JobRow {
	k.tb.Helper()
	var out []*rivertype.JobRow
	k.wait("the jobs of kind "+kind, func(ctx context.Context) (bool, string, error) {
		res, err := k.river.JobList(ctx, river.NewJobListParams().Kinds(kind).First(10_000))
		if err != nil {
			return false, "", err
		}
		var open []string
		for _, j := range res.Jobs {
			switch j.State {
			case rivertype.JobStateDiscarded:
				return false, "", fmt.Errorf("%s%s", describeJob(j), lastErrors(j))
			case rivertype.JobStateCompleted, rivertype.JobStateCancelled:
			default:
				open = append(open, describeJob(j)+lastErrors(j))
			}
		}
		if len(open) > 0 {
			if len(open) > 5 {
				open = append(open[:5], fmt.Sprintf("and %d more", len(open)-5))
			}
			return false, strings.Join(open, "; "), nil
		}
		out = res.Jobs
		return true, "", nil
	})
	return out
}

// WaitDelivered waits until outbox sink sink's cursor has passed every event
// committed before the call (its handler has had them all, and its cursor
// moved past them: the writes of a HandleTx committed with it).
func (k *Kit) WaitDelivered(sink string) {
	k.tb.Helper()
	var (
		txid string
		seq  int64
	)
	// By the xid8 column itself (e.txid), not by the output column's text,
	// where "999" sorts after "1000".
	err := k.DB.QueryRow(k.ctx, `SELECT e.txid::text AS txid_text, e.seq FROM compute_events e
		ORDER BY e.txid DESC, e.seq DESC LIMIT 1`).Scan(&txid, &seq)
	if errors.Is(err, pgx.ErrNoRows) {
		return // nothing to deliver
	}
	if err != nil {
		k.tb.Fatalf("clitest: WaitDelivered(%q): reading the event log's end: %v", sink, pg.Translate(err))
	}
	k.wait(fmt.Sprintf("sink %s to deliver every event through %s:%d", sink, txid, seq), func(ctx context.Context) (bool, string, error) {
		var (
			passed, paused bool
			cursor         string
			failures       int
			lastErr        string
		)
		err := k.DB.QueryRow(ctx, `SELECT (cursor_txid, cursor_seq) >= ($2::text::xid8, $3::bigint),
				cursor_txid::text || ':' || cursor_seq, paused, failures, coalesce(last_error, '')
			FROM compute_sinks WHERE name = $1`, sink, txid, seq).Scan(&passed, &cursor, &paused, &failures, &lastErr)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, "no sink of that name in compute_sinks (a worker creates a registered sink's state when it starts)", nil
		}
		if err != nil {
			return false, "", pg.Translate(err)
		}
		if passed {
			return true, "", nil
		}
		seen := "its cursor at " + cursor
		if paused {
			seen += ", paused"
		}
		if failures > 0 {
			seen += fmt.Sprintf(", %d failed deliveries, the last: %s", failures, lastErr)
		}
		return false, seen, nil
	})
}

// WaitWorkflow waits until workflow id has finished (completed, failed or
// cancelled) and returns it; check its Status. A workflow that sleeps or
// awaits a deadline on compute_now() finishes only when the test moves the
// clock (Advance).
func (k *Kit) WaitWorkflow(id string) workflow.Info {
	k.tb.Helper()
	var out workflow.Info
	k.wait("workflow "+id+" to finish", func(ctx context.Context) (bool, string, error) {
		i, err := workflow.Get(ctx, k.DB, id)
		if fault.Has(err, fault.NotFound) {
			return false, "no such workflow", nil
		}
		if err != nil {
			return false, "", err
		}
		if i.Status.Finished() {
			out = *i
			return true, "", nil
		}
		seen := fmt.Sprintf("%s at step %s", i.Status, i.Step)
		if i.Wait != nil && i.Wait.Signal != "" {
			seen += " awaiting signal " + i.Wait.Signal
		}
		if i.Wait != nil && i.Wait.Children != "" {
			seen += " awaiting " + i.Wait.Children + " of its children"
		}
		if i.WakeAt != nil {
			seen += fmt.Sprintf(" until %s, compute_now() %s", stamp(*i.WakeAt), stamp(i.Now))
			if i.WakeAt.After(i.Now) {
				seen += " (Advance the sim clock)"
			}
		}
		if i.Error != "" {
			seen += ": " + i.Error
		}
		return false, seen, nil
	})
	return out
}

// wait polls check every pollEvery until it reports done, and fails the test
// when the kit's timeout has passed (saying what it waited for and what check
// saw last) or when check returns an error (a state that cannot end well). A
// look may run past the deadline by up to lookGrace, so that even a slow
// first look reports what it saw.
func (k *Kit) wait(what string, check func(ctx context.Context) (done bool, seen string, err error)) {
	k.tb.Helper()
	deadline := time.Now().Add(k.timeout)
	seen := "nothing (no look finished)"
	for {
		ctx, cancel := context.WithDeadline(k.ctx, later(deadline, time.Now().Add(lookGrace)))
		done, s, err := check(ctx)
		cut := ctx.Err() != nil // the look ran out of time, or the test is over
		cancel()
		switch {
		case err != nil && !cut:
			k.tb.Fatalf("clitest: waiting for %s: %v", what, err)
		case err == nil && done:
			return
		case err == nil:
			seen = s
		}
		if cut || !time.Now().Before(deadline) {
			hint := ""
			if k.noWorkers {
				hint = " (this kit runs no workers: Options.NoWorkers)"
			}
			k.tb.Fatalf("clitest: timed out after %s waiting for %s%s; last saw: %s", k.timeout, what, hint, seen)
		}
		select {
		case <-k.ctx.Done():
		case <-time.After(pollEvery):
		}
	}
}

// later is the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// describeJob is a job as a Wait helper reports it: id, state and attempts.
func describeJob(j *rivertype.JobRow) string {
	return fmt.Sprintf("job %d (%s) %s, attempt %d of %d", j.ID, j.Kind, j.State, j.Attempt, j.MaxAttempts)
}

// lastErrors is a job's last error (and how many it had), or "".
func lastErrors(j *rivertype.JobRow) string {
	if len(j.Errors) == 0 {
		return ""
	}
	last := j.Errors[len(j.Errors)-1]
	if len(j.Errors) == 1 {
		return ", error: " + last.Error
	}
	return fmt.Sprintf(", %d errors, the last: %s", len(j.Errors), last.Error)
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }
