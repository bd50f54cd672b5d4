package cli

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/platform/clock"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
)

// Check is one line of doctor's report.
type Check struct {
	Name   string
	OK     bool
	Detail string
}

func init() { commandSet = append(commandSet, doctorCommand) }

func doctorCommand() *command {
	return &command{
		name:    "doctor",
		summary: "check the database and this deployment: one line per check, OK or FAIL; exits non-zero on any FAIL",
		run: func(ctx context.Context, s *Session, args []string) error {
			checks := s.Doctor(ctx)
			failed := 0
			for _, c := range checks {
				status := "OK  "
				if !c.OK {
					status = "FAIL"
					failed++
				}
				fmt.Fprintf(s.Env.Stdout, "%s %-12s %s\n", status, c.Name, c.Detail)
			}
			if failed > 0 {
				return fault.New(fault.InvalidConfig, "doctor: %d of %d checks failed", failed, len(checks))
			}
			return nil
		},
	}
}

// Doctor runs every check and returns them in order. It never stops at the first
// failure unless the database cannot be reached at all.
func (s *Session) Doctor(ctx context.Context) []Check {
	var out []Check
	add := func(name string, ok bool, format string, args ...any) {
		out = append(out, Check{Name: name, OK: ok, Detail: fmt.Sprintf(format, args...)})
	}
	db, err := s.Pool(ctx)
	if err != nil {
		add("connect", false, "%v", err)
		return out
	}
	add("connect", true, "connected (%d connections at most)", db.Config().MaxConns)

	var version int
	var versionText string
	if err := db.QueryRow(ctx, "SELECT current_setting('server_version_num')::int, current_setting('server_version')").Scan(&version, &versionText); err != nil {
		add("postgres", false, "cannot read the server version: %v", err)
	} else {
		add("postgres", version >= 150000, "PostgreSQL %s (15 or newer required)", versionText)
	}

	// Features the store needs, each probed in a transaction that is rolled back.
	feature := func(sql string) error {
		return pg.InTx(ctx, db, nil, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, sql); err != nil {
				return err
			}
			return errRollback
		})
	}
	var missing []string
	for _, f := range []struct{ name, sql string }{
		{"xid8", "SELECT pg_current_xact_id(), pg_snapshot_xmin(pg_current_snapshot())"},
		{"range types", "SELECT tstzrange('2020-01-01', '2020-01-02') && tstzrange('2020-01-01', '2020-01-03')"},
		{"SKIP LOCKED", "SELECT 1 FROM pg_class LIMIT 1 FOR UPDATE SKIP LOCKED"},
	} {
		if err := feature(f.sql); err != nil && err != errRollback {
			missing = append(missing, fmt.Sprintf("%s (%v)", f.name, err))
		}
	}
	if len(missing) > 0 {
		add("features", false, "missing: %s", strings.Join(missing, "; "))
	} else {
		add("features", true, "xid8, range types, FOR UPDATE SKIP LOCKED")
	}

	var haveGist bool
	var gistAvailable bool
	_ = db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'btree_gist'),
		EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'btree_gist')`).Scan(&haveGist, &gistAvailable)
	switch {
	case haveGist:
		if err := feature(`CREATE TEMP TABLE doctor_exclude (d int, during tstzrange,
			EXCLUDE USING gist (d WITH =, during WITH &&)) ON COMMIT DROP`); err != nil && err != errRollback {
			add("btree_gist", false, "installed, but an exclusion constraint fails: %v", err)
		} else {
			add("btree_gist", true, "installed; EXCLUDE USING gist works")
		}
	case gistAvailable:
		add("btree_gist", false, "not installed in this database (migrate creates it, or a superuser runs CREATE EXTENSION btree_gist once)")
	default:
		add("btree_gist", false, "not available on this server: install PostgreSQL's contrib modules, then CREATE EXTENSION btree_gist")
	}

	set, err := s.MigrationSet()
	if err != nil {
		add("ledger", false, "%v", err)
	} else if st, err := set.Check(ctx, db); err != nil {
		add("ledger", false, "%v", err)
	} else {
		switch {
		case len(st.Refused) > 0:
			add("ledger", false, "refused: %s", strings.Join(st.Refused, "; "))
		case len(st.Pending) > 0:
			add("ledger", false, "%d applied, %d pending (run migrate): %s", len(st.Applied), len(st.Pending), abbreviate(st.Pending, 5))
		default:
			add("ledger", true, "%d migrations applied, none pending; schema version %d", len(st.Applied), st.SchemaVersion)
		}
	}

	mode, err := clock.ModeOf(ctx, db)
	switch {
	case err != nil:
		add("clock", false, "%v", err)
	case mode == clock.Missing:
		add("clock", false, "compute_now() is missing (run migrate)")
	default:
		var a clock.Anchor
		err := a.Sample(ctx, db)
		skew, _ := a.Skew()
		var dbSkew time.Duration
		_ = db.QueryRow(ctx, "SELECT extract(epoch FROM compute_clock_skew())").Scan(&dbSkewSeconds{&dbSkew})
		switch {
		case err != nil:
			add("clock", false, "mode %s: %v", mode, err)
		case mode == clock.System:
			add("clock", true, "mode system; this process is %s from the database clock", (-skew).Round(time.Millisecond))
		default:
			add("clock", mode == clock.Sim, "mode %s: compute_now() is %s from the database clock", mode, dbSkew.Round(time.Millisecond))
		}
	}
	return append(out, s.doctorWork(ctx, db)...)
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

func usageErr(format string, args ...any) error {
	return fault.New(fault.InvalidArgument, format, args...)
}
