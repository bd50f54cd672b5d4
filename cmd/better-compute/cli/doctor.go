package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/domain/outbox"
	"github.com/bettercompute/bettercompute/platform/clock"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
)

// Check is one line of doctor's report.
type Check struct {
	Name   string
	OK     bool
	Detail string // one line
	// Code is the fault code of the error that failed the check, when an error
	// did (a refused connection is UNAVAILABLE); empty otherwise.
	Code fault.Code
}

// MaxXactAgeDefault is how long a write transaction may stay open before doctor
// says it holds the outbox back (doctor --max-xact-age).
const MaxXactAgeDefault = 5 * time.Second

// DoctorOptions configure Session.Doctor.
type DoctorOptions struct {
	// MaxXactAge: a write transaction open longer than this, anywhere on the
	// server, fails the snapshot check (default MaxXactAgeDefault).
	MaxXactAge time.Duration
}

// doctorOpts are doctor's flags.
type doctorOpts struct {
	DoctorOptions
	demo bool // deprecated, no effect
}

func (o *doctorOpts) bind(fs *flag.FlagSet) {
	fs.DurationVar(&o.MaxXactAge, "max-xact-age", MaxXactAgeDefault,
		"a write transaction open longer than this, in any database of the server, holds the outbox back: FAIL")
	fs.BoolVar(&o.demo, "demo", false, "deprecated, no effect: the better-compute binary always knows its demo application")
}

func (o *doctorOpts) Validate(args []string) error {
	if o.MaxXactAge <= 0 {
		return usageErr("doctor: --max-xact-age must be positive, got %s", o.MaxXactAge)
	}
	return noArgs("doctor", args)
}

func doctorCommand() *command {
	o := &doctorOpts{}
	return &command{
		name:    "doctor",
		summary: "check the database and this deployment: one line per check, OK or FAIL; exits non-zero on any FAIL",
		opts:    o,
		run: func(ctx context.Context, s *Session, _ []string) error {
			checks := s.Doctor(ctx, o.DoctorOptions)
			for _, c := range checks {
				status := "OK  "
				if !c.OK {
					status = "FAIL"
				}
				fmt.Fprintf(s.Env.Stdout, "%s %-12s %s\n", status, c.Name, c.Detail)
			}
			return doctorErr(checks)
		},
	}
}

// doctorErr is the command's error when checks failed, naming them, or nil. One
// failed check that carries a fault code (a refused connection) gives its code
// and detail; otherwise the error is INVALID_CONFIG with the failed checks' names.
func doctorErr(checks []Check) error {
	var failed []string
	var last Check
	for _, c := range checks {
		if !c.OK {
			failed = append(failed, c.Name)
			last = c
		}
	}
	switch {
	case len(failed) == 0:
		return nil
	case len(failed) == 1 && last.Code != "":
		return fault.New(last.Code, "doctor: %s failed: %s", last.Name, last.Detail)
	default:
		return fault.New(fault.InvalidConfig, "doctor: %d of %d checks failed: %s", len(failed), len(checks), strings.Join(failed, ", "))
	}
}

// report collects doctor's checks.
type report struct{ checks []Check }

// add appends a check whose detail is format, as one line (detailLine).
func (r *report) add(name string, ok bool, format string, args ...any) {
	r.checks = append(r.checks, Check{Name: name, OK: ok, Detail: detailLine(fmt.Sprintf(format, args...))})
}

// detailLine is s as one line of doctor's report: its lines joined with "; "
// (with a space after a line that ends in ':', which introduces the next), and
// every other run of white space one space. A driver's error lists each
// address it tried on a line of its own (localhost's ::1 and 127.0.0.1, each
// host of a multi-host URL); joined by a bare space they ran together.
func detailLine(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(s, "\n") {
		if l = oneLine(l, 0); l == "" {
			continue
		}
		if b.Len() > 0 {
			if strings.HasSuffix(b.String(), ":") {
				b.WriteString(" ")
			} else {
				b.WriteString("; ")
			}
		}
		b.WriteString(l)
	}
	return b.String()
}

// fail appends a failed check caused by err: its detail is the prefix (if any)
// and err's message, its code err's (INTERNAL_ERROR for a driver error without one).
func (r *report) fail(name string, err error, prefix string, args ...any) {
	code, msg := errParts(err)
	if prefix != "" {
		msg = fmt.Sprintf(prefix, args...) + ": " + msg
	}
	r.checks = append(r.checks, Check{Name: name, Detail: detailLine(msg), Code: code})
}

// errParts is err's fault code (after pg.Translate) and its message without the
// code in front. A refused login (SQLSTATE class 28) is INVALID_CONFIG: the URL's
// user or password is wrong.
func errParts(err error) (fault.Code, string) {
	err = pg.Translate(err)
	code := fault.CodeOf(err)
	msg := strings.TrimPrefix(err.Error(), string(code)+": ")
	if strings.HasPrefix(pg.SQLState(err), "28") {
		code = fault.InvalidConfig
	}
	return code, msg
}

// Doctor runs every check and returns them in order. It never stops at the first
// failure unless the database cannot be reached at all. It needs no superuser:
// the database's owner sees everything it checks, except other roles'
// transactions, which it reports as such.
func (s *Session) Doctor(ctx context.Context, opts ...DoctorOptions) []Check {
	o := doctorOptions(opts)
	r := &report{}
	db, ok := s.doctorConnect(ctx, r)
	if !ok {
		return r.checks
	}
	now := serverClock(ctx, db)
	s.doctorPostgres(ctx, db, r)
	s.doctorFeatures(ctx, db, r)
	s.doctorGist(ctx, db, r)
	s.doctorLedger(ctx, db, r)
	s.doctorClock(ctx, db, r)
	s.doctorSnapshot(ctx, db, r, now, o.MaxXactAge)
	s.doctorWork(ctx, db, r, now)
	for _, m := range s.App.modules() {
		if m.Checks != nil {
			r.checks = append(r.checks, m.Checks(ctx, s, db)...)
		}
	}
	return r.checks
}

// doctorOptions is the first of opts, or the zero options, with defaults set.
func doctorOptions(opts []DoctorOptions) DoctorOptions {
	var o DoctorOptions
	if len(opts) > 0 {
		o = opts[0]
	}
	if o.MaxXactAge <= 0 {
		o.MaxXactAge = MaxXactAgeDefault
	}
	return o
}

// doctorConnect checks that the database can be reached and returns its pool;
// false when it cannot (no other check can run).
func (s *Session) doctorConnect(ctx context.Context, r *report) (*pg.Pool, bool) {
	db, err := s.Pool(ctx)
	if err != nil {
		r.fail("connect", err, "")
		return nil, false
	}
	r.add("connect", true, "connected (%d connections at most)", db.Config().MaxConns)
	return db, true
}

// serverClock reads the server's clock once: doctor measures every age against
// it. (Should the read fail, the next checks say why; ages use this process's clock.)
func serverClock(ctx context.Context, db *pg.Pool) time.Time {
	now := time.Now()
	_ = db.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&now) // bare clock: pg_stat_activity's starts are on the server's clock, not compute_now()'s
	return now
}

// doctorPostgres checks the server's version: PostgreSQL 15 or newer.
func (s *Session) doctorPostgres(ctx context.Context, db *pg.Pool, r *report) {
	var version int
	var versionText string
	if err := db.QueryRow(ctx, "SELECT current_setting('server_version_num')::int, current_setting('server_version')").Scan(&version, &versionText); err != nil {
		r.fail("postgres", err, "cannot read the server version")
	} else {
		r.add("postgres", version >= 150000, "PostgreSQL %s (15 or newer required)", versionText)
	}
}

// doctorFeatures checks the features the store needs: xid8, range types and
// FOR UPDATE SKIP LOCKED.
func (s *Session) doctorFeatures(ctx context.Context, db *pg.Pool, r *report) {
	var missing []string
	for _, f := range []struct {
		name  string
		stmts []string
	}{
		{"xid8", []string{"SELECT pg_current_xact_id(), pg_snapshot_xmin(pg_current_snapshot())"}},
		{"range types", []string{"SELECT tstzrange('2020-01-01', '2020-01-02') && tstzrange('2020-01-01', '2020-01-03')"}},
		{"SKIP LOCKED", []string{
			"CREATE TEMP TABLE doctor_skip_locked (id int) ON COMMIT DROP",
			"INSERT INTO doctor_skip_locked VALUES (1)",
			"SELECT id FROM doctor_skip_locked FOR UPDATE SKIP LOCKED",
		}},
	} {
		if err := probeFeature(ctx, db, f.stmts...); err != nil {
			_, msg := errParts(err)
			missing = append(missing, fmt.Sprintf("%s (%s)", f.name, msg))
		}
	}
	if len(missing) > 0 {
		r.add("features", false, "missing: %s", strings.Join(missing, "; "))
	} else {
		r.add("features", true, "xid8, range types, FOR UPDATE SKIP LOCKED")
	}
}

// probeFeature runs stmts in a transaction that is rolled back, and returns the
// first one's error. The statements use objects any role may use (never a
// catalog: a non-superuser may not lock pg_class rows).
func probeFeature(ctx context.Context, db *pg.Pool, stmts ...string) error {
	err := pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		for _, sql := range stmts {
			if _, err := tx.Exec(ctx, sql); err != nil {
				return err
			}
		}
		return errRollback
	})
	if errors.Is(err, errRollback) {
		return nil
	}
	return err
}

// doctorGist checks that btree_gist is installed and an exclusion constraint
// works, or says how to get it.
func (s *Session) doctorGist(ctx context.Context, db *pg.Pool, r *report) {
	var haveGist bool
	var gistAvailable bool
	_ = db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'btree_gist'),
		EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'btree_gist')`).Scan(&haveGist, &gistAvailable)
	switch {
	case haveGist:
		if err := probeFeature(ctx, db, `CREATE TEMP TABLE doctor_exclude (d int, during tstzrange,
			EXCLUDE USING gist (d WITH =, during WITH &&)) ON COMMIT DROP`); err != nil {
			r.fail("btree_gist", err, "installed, but an exclusion constraint fails")
		} else {
			r.add("btree_gist", true, "installed; EXCLUDE USING gist works")
		}
	case gistAvailable:
		r.add("btree_gist", false, "not installed in this database (migrate creates it, or a superuser runs CREATE EXTENSION btree_gist once)")
	default:
		r.add("btree_gist", false, "not available on this server: install PostgreSQL's contrib modules, then CREATE EXTENSION btree_gist")
	}
}

// doctorLedger checks the migration ledger: nothing refused, nothing pending.
func (s *Session) doctorLedger(ctx context.Context, db *pg.Pool, r *report) {
	set, err := s.MigrationSet()
	if err != nil {
		r.fail("ledger", err, "")
		return
	}
	st, err := set.Check(ctx, db)
	switch {
	case err != nil:
		r.fail("ledger", err, "")
	case len(st.Refused) > 0:
		r.add("ledger", false, "refused: %s", strings.Join(st.Refused, "; "))
	case len(st.Pending) > 0:
		r.add("ledger", false, "%d applied, %d pending (run migrate): %s", len(st.Applied), len(st.Pending), abbreviate(st.Pending, 5))
	default:
		r.add("ledger", true, "%d migrations applied, none pending; schema version %d", len(st.Applied), st.SchemaVersion)
	}
}

// doctorClock checks compute_now()'s mode and how far this process's clock (mode
// system) or compute_now() (mode sim) is from the database clock.
func (s *Session) doctorClock(ctx context.Context, db *pg.Pool, r *report) {
	mode, err := clock.ModeOf(ctx, db)
	switch {
	case err != nil:
		r.fail("clock", err, "")
		return
	case mode == clock.Missing:
		r.add("clock", false, "compute_now() is missing (run migrate)")
		return
	}
	var a clock.Anchor
	err = a.Sample(ctx, db)
	skew, _ := a.Skew()
	var dbSkew time.Duration
	_ = db.QueryRow(ctx, "SELECT extract(epoch FROM compute_clock_skew())").Scan(&dbSkewSeconds{&dbSkew})
	switch {
	case err != nil:
		r.fail("clock", err, "mode %s", mode)
	case mode == clock.System:
		r.add("clock", true, "mode system; this process is %s from the database clock", (-skew).Round(time.Millisecond))
	default:
		r.add("clock", mode == clock.Sim, "mode %s: compute_now() is %s from the database clock", mode, dbSkew.Round(time.Millisecond))
	}
}

var errRollback = fault.New(fault.Internal, "rollback")

// dbSkewSeconds scans a float of seconds into a duration.
type dbSkewSeconds struct{ d *time.Duration }

func (d dbSkewSeconds) Scan(src any) error {
	switch v := src.(type) {
	case float64:
		*d.d = time.Duration(v * float64(time.Second))
	case nil:
	default:
		return fmt.Errorf("unexpected %T", src)
	}
	return nil
}

func abbreviate(names []string, n int) string {
	if len(names) <= n {
		return strings.Join(names, ", ")
	}
	return strings.Join(names[:n], ", ") + fmt.Sprintf(", … (%d more)", len(names)-n)
}

// xact is a write transaction open on the server (outbox.ListWriteXacts).
type xact struct{ outbox.WriteXact }

// describe names x in one line, with how long it has been open at now.
func (x xact) describe(now time.Time) string {
	var parts []string
	if x.Start != nil {
		parts = append(parts, fmt.Sprintf("open %s", now.Sub(*x.Start).Round(time.Millisecond)))
	}
	parts = append(parts, "database "+orDash(x.Database))
	if x.GID != "" {
		parts = append(parts, fmt.Sprintf("prepared transaction %q", x.GID))
	} else {
		parts = append(parts, fmt.Sprintf("pid %d", x.PID))
	}
	parts = append(parts, "user "+orDash(x.User))
	if x.App != "" {
		parts = append(parts, fmt.Sprintf("application %q", x.App))
	}
	if x.State != "" {
		parts = append(parts, "state "+x.State)
	}
	return strings.Join(parts, ", ")
}

// ending says how to end x.
func (x xact) ending() string {
	if x.GID != "" {
		return fmt.Sprintf("COMMIT PREPARED or ROLLBACK PREPARED %s", quoteLiteralSQL(x.GID))
	}
	return fmt.Sprintf("commit or roll it back, or SELECT pg_terminate_backend(%d)", x.PID)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func quoteLiteralSQL(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// doctorSnapshot checks what holds the outbox's snapshot back: a write
// transaction open longer than maxAge anywhere on the server. It names the
// oldest, and counts this database's committed events it holds back. When events
// are held back by a transaction whose start this role cannot see, it watches
// the snapshot for up to maxAge: a holder still there by then has been open that
// long.
func (s *Session) doctorSnapshot(ctx context.Context, db *pg.Pool, r *report, now time.Time, maxAge time.Duration) {
	st, ok := readSnapshotState(ctx, db, r)
	if !ok {
		return
	}
	if long := oldestLongXacts(st.open, now, maxAge); len(long) > 0 {
		x := long[0]
		r.add(snapshotCheck, false, "a write transaction open longer than %s holds back every outbox reader on this server: %s; %s (%s)%s",
			maxAge, x.describe(now), st.waiting(), x.ending(), moreLongXacts(long, maxAge))
		return
	}
	if st.heldBack <= 0 {
		r.add(snapshotCheck, true, "no write transaction open longer than %s holds back the outbox (%s open now)", maxAge, plural(len(st.open), "write transaction"))
		return
	}
	doctorSnapshotHolder(ctx, db, r, st, now, maxAge)
}

// snapshotCheck is the snapshot check's name.
const snapshotCheck = "snapshot"

// snapshotState is what the snapshot check decides from.
type snapshotState struct {
	open     []xact // the server's write transactions
	xmin     uint64 // a fresh snapshot's xmin
	heldBack int    // this database's committed events below xmin; -1 without an event log
}

// readSnapshotState lists the server's open write transactions and reads a
// snapshot's xmin and the events it holds back; false after reporting a failure.
func readSnapshotState(ctx context.Context, db *pg.Pool, r *report) (snapshotState, bool) {
	open, err := listOpenXacts(ctx, db)
	if err != nil {
		r.fail(snapshotCheck, err, "cannot list open transactions")
		return snapshotState{}, false
	}
	st := snapshotState{open: open, heldBack: -1}
	var haveEvents bool
	if err := db.QueryRow(ctx, `SELECT to_regclass('compute_events') IS NOT NULL`).Scan(&haveEvents); err != nil {
		r.fail(snapshotCheck, err, "cannot look for the event log")
		return snapshotState{}, false
	}
	if haveEvents {
		st.xmin, st.heldBack, err = outbox.HeldBack(ctx, db)
	} else {
		var xminText string
		err = db.QueryRow(ctx, outbox.SnapshotXminSQL).Scan(&xminText)
		st.xmin, _ = strconv.ParseUint(xminText, 10, 64)
	}
	if err != nil {
		r.fail(snapshotCheck, err, "cannot read the snapshot")
		return snapshotState{}, false
	}
	return st, true
}

// listOpenXacts lists the server's write transactions (outbox.ListWriteXacts).
func listOpenXacts(ctx context.Context, db *pg.Pool) ([]xact, error) {
	open, err := outbox.ListWriteXacts(ctx, db)
	out := make([]xact, len(open))
	for i, x := range open {
		out[i] = xact{x}
	}
	return out, err
}

// oldestLongXacts is the write transactions of open that have been open longer
// than maxAge at now, of those whose start this role may see, oldest first.
func oldestLongXacts(open []xact, now time.Time, maxAge time.Duration) []xact {
	var long []xact
	for _, x := range open {
		if x.Start != nil && now.Sub(*x.Start) > maxAge {
			long = append(long, x)
		}
	}
	sort.Slice(long, func(i, j int) bool { return long[i].Start.Before(*long[j].Start) })
	return long
}

// doctorSnapshotHolder decides when events wait for the transaction at xmin and
// none is seen open longer than maxAge: fine if the holder is young; if this role
// cannot see its start, watch whether it ends within maxAge.
func doctorSnapshotHolder(ctx context.Context, db *pg.Pool, r *report, st snapshotState, now time.Time, maxAge time.Duration) {
	holder := st.holder()
	if holder != nil && holder.Start != nil {
		r.add(snapshotCheck, true, "%s for a write transaction open %s (under %s): %s", st.waiting(), now.Sub(*holder.Start).Round(time.Millisecond), maxAge, holder.describe(now))
		return
	}
	ended, err := xminMoves(ctx, db, st.xmin, maxAge)
	if err != nil {
		r.fail(snapshotCheck, err, "cannot read the snapshot")
		return
	}
	if ended {
		r.add(snapshotCheck, true, "no write transaction open longer than %s holds back the outbox (the one holding %d events back ended)", maxAge, st.heldBack)
		return
	}
	who := ""
	if holder != nil {
		who = fmt.Sprintf(": %s, open at least %s", holder.describe(now), maxAge)
	}
	r.add(snapshotCheck, false, "%s, held back by a transaction this role cannot see (grant pg_read_all_stats to name it)%s", st.waiting(), who)
}

// holder is the open transaction at the snapshot's xmin, or nil if none is listed.
func (st snapshotState) holder() *xact {
	var holder *xact
	for i := range st.open {
		if uint64(st.open[i].XID) == st.xmin&0xFFFFFFFF {
			holder = &st.open[i]
		}
	}
	return holder
}

// waiting describes the committed events of this database held back.
func (st snapshotState) waiting() string {
	switch st.heldBack {
	case -1:
		return "this database has no event log"
	case 1:
		return "1 committed event of this database waits"
	default:
		return fmt.Sprintf("%d committed events of this database wait", st.heldBack)
	}
}

// moreLongXacts describes the long transactions after the oldest ("" if none).
func moreLongXacts(long []xact, maxAge time.Duration) string {
	if len(long) <= 1 {
		return ""
	}
	return fmt.Sprintf("; %d more write transactions open longer than %s", len(long)-1, maxAge)
}

// xminMoves watches the snapshot's xmin for up to wait and reports whether it
// moved past xmin: whether the transaction that held it ended.
func xminMoves(ctx context.Context, db *pg.Pool, xmin uint64, wait time.Duration) (bool, error) {
	deadline := time.Now().Add(wait)
	tick := time.NewTicker(min(wait/10+time.Millisecond, 100*time.Millisecond))
	defer tick.Stop()
	for {
		var text string
		if err := db.QueryRow(ctx, outbox.SnapshotXminSQL).Scan(&text); err != nil {
			return false, err
		}
		if now, _ := strconv.ParseUint(text, 10, 64); now != xmin {
			return true, nil
		}
		if !time.Now().Before(deadline) {
			return false, nil
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-tick.C:
		}
	}
}
