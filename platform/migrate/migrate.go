package migrate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
)

// LockKey is the advisory lock every migration transaction takes:
// pg_advisory_xact_lock(1650683248, 1).
const (
	LockKey1 = 1650683248
	LockKey2 = 1
)

// coreOwner is the owner reserved for the base schema.
const coreOwner = "core"

// Migration is one migration: SQL, or (for River's schema) a function.
type Migration struct {
	Owner  string
	Number int
	Slug   string
	SQL    string
	// Apply, when set, runs instead of SQL, inside the migration's transaction.
	Apply func(ctx context.Context, tx pgx.Tx) error
	// Formerly are ledger names this migration landed under before it was
	// renumbered (Rename): a ledger holding one of them holds this migration.
	Formerly []string
}

// names are m's ledger names: Name, then Formerly.
func (m Migration) names() []string { return append([]string{m.Name()}, m.Formerly...) }

// Rename records that the migration now named to (owner/nnnn_slug) landed
// first as from, whose file, kept as it landed, is in ms too: from is dropped
// from ms and becomes one of to's Formerly names. It returns INVALID_CONFIG
// when either is missing from ms, or when their statements (the SQL without
// its comments) differ: a renamed migration must be the one that ran.
func Rename(ms []Migration, from, to string) ([]Migration, error) {
	fi := slices.IndexFunc(ms, func(m Migration) bool { return m.Name() == from })
	ti := slices.IndexFunc(ms, func(m Migration) bool { return m.Name() == to })
	if fi < 0 || ti < 0 {
		return nil, fault.New(fault.InvalidConfig, "migration %s renamed to %s: both files must be in the set", from, to)
	}
	if statements(ms[fi].SQL) != statements(ms[ti].SQL) {
		return nil, fault.New(fault.InvalidConfig, "migration %s renamed to %s: their statements differ", from, to)
	}
	out := slices.Clone(ms)
	out[ti].Formerly = append(slices.Clone(out[ti].Formerly), from)
	return slices.Delete(out, fi, fi+1), nil
}

// statements is sql without its comment lines and blank lines.
func statements(sql string) string {
	var b strings.Builder
	for _, line := range strings.Split(sql, "\n") {
		if t := strings.TrimSpace(line); t != "" && !strings.HasPrefix(t, "--") {
			b.WriteString(t)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// Name is the ledger name, owner/nnnn_slug.
func (m Migration) Name() string { return fmt.Sprintf("%s/%04d_%s", m.Owner, m.Number, m.Slug) }

var (
	ownerRe = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
	fileRe  = regexp.MustCompile(`^([0-9]{4})_([a-z0-9][a-z0-9_]*)\.sql$`)
)

// FromFS loads owner's migrations from the *.sql files at the root of fsys.
// It returns INVALID_CONFIG for a file whose name is not nnnn_slug.sql, and for
// anything else at the root.
func FromFS(owner string, fsys fs.FS) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, fault.Wrap(fault.InvalidConfig, err, "cannot read the migrations of %s", owner)
	}
	var out []Migration
	for _, e := range entries {
		if e.IsDir() {
			return nil, fault.New(fault.InvalidConfig, "migration %s/%s: a directory where a file nnnn_slug.sql belongs", owner, e.Name())
		}
		m := fileRe.FindStringSubmatch(e.Name())
		if m == nil {
			return nil, fault.New(fault.InvalidConfig, "migration %s/%s: bad name, want nnnn_slug.sql (four digits, a lowercase slug)", owner, e.Name())
		}
		n, _ := strconv.Atoi(m[1])
		body, err := fs.ReadFile(fsys, e.Name())
		if err != nil {
			return nil, fault.Wrap(fault.InvalidConfig, err, "cannot read migration %s/%s", owner, e.Name())
		}
		out = append(out, Migration{Owner: owner, Number: n, Slug: m[2], SQL: string(body)})
	}
	return out, nil
}

// Group is one owner's migrations.
type Group struct {
	Owner      string
	Migrations []Migration
}

// Set is a validated, ordered set of migrations.
type Set struct {
	groups []Group
}

// NewSet validates groups and returns them as a set, in the given order. core, if
// present, must come first. It returns INVALID_CONFIG for a bad owner, an owner
// given twice, a migration of the wrong owner, and duplicate or missing numbers.
func NewSet(groups ...Group) (*Set, error) {
	seen := map[string]bool{}
	for i, g := range groups {
		if !ownerRe.MatchString(g.Owner) {
			return nil, fault.New(fault.InvalidConfig, "migration owner %q: want a lowercase name ([a-z][a-z0-9_]*)", g.Owner)
		}
		if seen[g.Owner] {
			return nil, fault.New(fault.InvalidConfig, "migration owner %q is registered twice", g.Owner)
		}
		seen[g.Owner] = true
		if g.Owner == coreOwner && i != 0 {
			return nil, fault.New(fault.InvalidConfig, "migration owner core is reserved for the base schema and runs first")
		}
		ms := slices.Clone(g.Migrations)
		sort.SliceStable(ms, func(a, b int) bool { return ms[a].Number < ms[b].Number })
		for j, m := range ms {
			if m.Owner != g.Owner {
				return nil, fault.New(fault.InvalidConfig, "migration %s is listed under owner %s", m.Name(), g.Owner)
			}
			if j > 0 && ms[j-1].Number == m.Number {
				return nil, fault.New(fault.InvalidConfig, "migrations %s and %s have the same number", ms[j-1].Name(), m.Name())
			}
			if m.Number != j+1 {
				return nil, fault.New(fault.InvalidConfig, "migration %s: number %04d is missing from owner %s (numbers start at 0001 and have no gaps)", m.Name(), j+1, g.Owner)
			}
		}
		groups[i].Migrations = ms
	}
	return &Set{groups: slices.Clone(groups)}, nil
}

// Migrations returns every migration in the order they run.
func (s *Set) Migrations() []Migration {
	var out []Migration
	for _, g := range s.groups {
		out = append(out, g.Migrations...)
	}
	return out
}

// Owners returns the owners in order.
func (s *Set) Owners() []string {
	out := make([]string, len(s.groups))
	for i, g := range s.groups {
		out[i] = g.Owner
	}
	return out
}

// CoreVersion is the number of core migrations in this build.
func (s *Set) CoreVersion() int {
	for _, g := range s.groups {
		if g.Owner == coreOwner {
			return len(g.Migrations)
		}
	}
	return 0
}

// Hash identifies the set's content: names and SQL. Test templates are keyed by it.
func (s *Set) Hash() string {
	h := sha256.New()
	for _, m := range s.Migrations() {
		fmt.Fprintf(h, "%s\x00%s\x00%t\x00", m.Name(), m.SQL, m.Apply != nil)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// Status is what the ledger holds against this set.
type Status struct {
	Applied       []string // in this set and in the ledger
	Pending       []string // in this set, not yet in the ledger
	Refused       []string // why the ledger cannot be accounted for, one line per entry
	SchemaVersion int      // compute_schema_version.version (0 when absent)
	Initialized   bool     // the ledger tables exist
}

// Check reads the ledger and reports what is applied, pending and refused. It
// changes nothing.
func (s *Set) Check(ctx context.Context, db pg.DBTX) (*Status, error) {
	st := &Status{}
	var exists bool
	if err := db.QueryRow(ctx, `SELECT to_regclass('compute_migrations') IS NOT NULL`).Scan(&exists); err != nil {
		return nil, pg.Translate(fmt.Errorf("error reading the ledger: %w", err))
	}
	if !exists {
		for _, m := range s.Migrations() {
			st.Pending = append(st.Pending, m.Name())
		}
		return st, nil
	}
	st.Initialized = true
	rows, err := db.Query(ctx, `SELECT name FROM compute_migrations`)
	if err != nil {
		return nil, pg.Translate(fmt.Errorf("error reading the ledger: %w", err))
	}
	ledger, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, pg.Translate(fmt.Errorf("error reading the ledger: %w", err))
	}
	if err := db.QueryRow(ctx, `SELECT coalesce((SELECT version FROM compute_schema_version), 0)`).Scan(&st.SchemaVersion); err != nil {
		return nil, pg.Translate(fmt.Errorf("error reading the schema version: %w", err))
	}
	st.Refused = s.refusals(ledger, st.SchemaVersion)
	applied := map[string]bool{}
	for _, n := range ledger {
		applied[n] = true
	}
	for _, m := range s.Migrations() {
		if slices.ContainsFunc(m.names(), func(n string) bool { return applied[n] }) {
			st.Applied = append(st.Applied, m.Name())
		} else {
			st.Pending = append(st.Pending, m.Name())
		}
	}
	return st, nil
}

func (s *Set) refusals(ledger []string, schemaVersion int) []string {
	known := map[string]map[string]bool{}
	last := map[string]int{}
	for _, g := range s.groups {
		known[g.Owner] = map[string]bool{}
		for _, m := range g.Migrations {
			for _, n := range m.names() {
				known[g.Owner][n] = true
			}
		}
		last[g.Owner] = len(g.Migrations)
	}
	var out []string
	sorted := slices.Clone(ledger)
	slices.Sort(sorted)
	for _, name := range sorted {
		owner, rest, ok := strings.Cut(name, "/")
		names, mine := known[owner]
		if !mine || names[name] {
			continue // an owner this build does not know is ignored
		}
		num := -1
		if ok && len(rest) >= 4 {
			if n, err := strconv.Atoi(rest[:4]); err == nil {
				num = n
			}
		}
		if num > last[owner] {
			out = append(out, fmt.Sprintf("%s: a later number than this build's last %s migration (%04d): a newer release migrated this database", name, owner, last[owner]))
		} else {
			out = append(out, fmt.Sprintf("%s: unknown to this build at or below %s's last number (%04d): a migration was renamed or removed", name, owner, last[owner]))
		}
	}
	if v := s.CoreVersion(); schemaVersion > v {
		out = append(out, fmt.Sprintf("compute_schema_version %d is above this build's %d: a newer release migrated this database", schemaVersion, v))
	}
	return out
}

// Result is what Apply did.
type Result struct {
	Applied  []string      // applied by this call, in order
	Skipped  int           // already in the ledger
	Duration time.Duration // the whole call
}

// logger receives one line per applied migration.
type logger func(name string, took time.Duration)

// Apply applies the pending migrations of the set, each in its own transaction
// with its ledger row. It returns INVALID_CONFIG naming every refused entry
// before applying anything, and the failing migration's name with its cause if
// one fails (that migration leaves nothing behind). It is idempotent and safe to
// run from many processes at once.
func (s *Set) Apply(ctx context.Context, db *pg.Pool, log logger) (*Result, error) {
	start := time.Now()
	res := &Result{}
	if err := bootstrap(ctx, db); err != nil {
		return nil, err
	}
	st, err := s.Check(ctx, db)
	if err != nil {
		return nil, err
	}
	if len(st.Refused) > 0 {
		return nil, refusedError(st.Refused)
	}
	res.Skipped = len(st.Applied)
	pending := map[string]bool{}
	for _, n := range st.Pending {
		pending[n] = true
	}
	coreDone := 0
	for _, m := range s.Migrations() {
		if m.Owner == coreOwner && !pending[m.Name()] {
			coreDone++
		}
	}
	for _, m := range s.Migrations() {
		if !pending[m.Name()] {
			continue
		}
		t0 := time.Now()
		applied := false
		err := pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1, $2)", LockKey1, LockKey2); err != nil {
				return fmt.Errorf("error taking the migration lock: %w", err)
			}
			var done bool
			if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM compute_migrations WHERE name = ANY($1))", m.names()).Scan(&done); err != nil {
				return err
			}
			if done { // another migrator applied it while we waited for the lock
				return nil
			}
			if m.Apply != nil {
				if err := m.Apply(ctx, tx); err != nil {
					return err
				}
			} else if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "INSERT INTO compute_migrations (name, applied_at) VALUES ($1, compute_now())", m.Name()); err != nil {
				return err
			}
			if m.Owner == coreOwner {
				if _, err := tx.Exec(ctx, `UPDATE compute_schema_version SET version = (SELECT count(*) FROM compute_migrations WHERE name LIKE 'core/%')`); err != nil {
					return err
				}
			}
			applied = true
			return nil
		})
		if err != nil {
			code := fault.CodeOf(pg.Translate(err))
			if code == fault.Unavailable || ctx.Err() != nil {
				return res, fault.Wrap(fault.Unavailable, err, "migration %s did not complete and was rolled back", m.Name())
			}
			return res, fault.Wrap(fault.InvalidConfig, err, "migration %s failed and was rolled back", m.Name())
		}
		if applied {
			res.Applied = append(res.Applied, m.Name())
			if log != nil {
				log(m.Name(), time.Since(t0))
			}
		} else {
			res.Skipped++
		}
	}
	res.Duration = time.Since(start)
	return res, nil
}

// bootstrap creates the ledger tables (once, under the migration lock).
func bootstrap(ctx context.Context, db *pg.Pool) error {
	err := pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT to_regclass('compute_schema_version') IS NOT NULL`).Scan(&exists); err != nil || exists {
			return err
		}
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1, $2)", LockKey1, LockKey2); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `
CREATE TABLE IF NOT EXISTS compute_migrations (
    name       text PRIMARY KEY,
    applied_at timestamptz NOT NULL
);
CREATE TABLE IF NOT EXISTS compute_schema_version (
    id      boolean PRIMARY KEY DEFAULT true CHECK (id),
    version integer NOT NULL
);
INSERT INTO compute_schema_version (id, version) VALUES (true, 0) ON CONFLICT (id) DO NOTHING;`)
		return err
	})
	if err != nil {
		return pg.Translate(fmt.Errorf("error creating the migrations ledger: %w", err))
	}
	return nil
}

func refusedError(lines []string) error {
	return fault.New(fault.InvalidConfig, "the migrations ledger holds what this build cannot account for; nothing was applied:\n  %s", strings.Join(lines, "\n  "))
}
