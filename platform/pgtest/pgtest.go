// Package pgtest gives each test a fresh, fully migrated PostgreSQL database,
// cloned from a template that is migrated once per test binary and keyed by a
// hash of the migration set.
//
// The server is an embedded cluster that the test binary starts itself (see
// platform/embedded), or the server at TEST_DATABASE_URL when that is set (its
// role needs CREATEDB). A passing test's database is dropped; a failing test's
// database is kept and its name logged, so it can be inspected (on the embedded
// cluster, until the test binary exits; keep it longer with TEST_DATABASE_URL).
//
// With TEST_DB_STATEMENT_CACHE=1 every pool New and NewOwned open keeps
// prepared statements (pg.Options.StatementCache, what
// BETTER_COMPUTE_DB_STATEMENT_CACHE turns on), so the tests run each statement
// as a direct connection with the statement cache does; by default they run it
// unnamed, as behind PgBouncer.
//
// Use it from TestMain, so the embedded cluster stops when the tests end:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
//	func TestSomething(t *testing.T) {
//		db := pgtest.New(t)
//		…
//	}
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/platform/embedded"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/migrate"
	"github.com/bettercompute/bettercompute/platform/pg"
)

var (
	clusterOnce sync.Once
	cluster     *embedded.Cluster
	clusterErr  error
	adminURL    string

	templatesMu sync.Mutex
	templates   = map[string]string{} // set hash -> template database name
)

// Main runs the tests and then stops the embedded cluster, if one was started.
func Main(m *testing.M) {
	code := m.Run()
	runExampleCleanups()
	if cluster != nil {
		_ = cluster.Stop()
	}
	os.Exit(code)
}

// AdminURL returns the URL of a database on the test server that can create
// databases (the embedded cluster's postgres database, or TEST_DATABASE_URL).
func AdminURL(tb testing.TB) string {
	tb.Helper()
	clusterOnce.Do(func() {
		if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
			adminURL = u
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cluster, clusterErr = embedded.Start(ctx, embedded.Options{Fast: true})
		if clusterErr == nil {
			adminURL = cluster.DatabaseURL("postgres")
		}
	})
	if clusterErr != nil {
		tb.Fatalf("pgtest: cannot start the embedded PostgreSQL: %v", clusterErr)
	}
	return adminURL
}

// Cluster returns the embedded cluster, or nil when the tests run against
// TEST_DATABASE_URL.
func Cluster(tb testing.TB) *embedded.Cluster {
	tb.Helper()
	AdminURL(tb)
	return cluster
}

// EnvStatementCache is the variable that, set to 1 (or true), opens the test
// pools with pg.Options.StatementCache.
const EnvStatementCache = "TEST_DB_STATEMENT_CACHE"

// StatementCache reports whether the test pools keep prepared statements
// (TEST_DB_STATEMENT_CACHE): a test that opens a pool of its own to a direct
// connection, or runs a command line, may follow it.
func StatementCache() bool {
	v, _ := strconv.ParseBool(os.Getenv(EnvStatementCache))
	return v
}

// DefaultShardCount is the shard count of every test database (the production
// default). A test that needs another count updates compute_settings.
const DefaultShardCount = 16

// Options configure New.
type Options struct {
	// Groups are application migration groups to apply after the built-in ones.
	Groups []migrate.Group
	// Empty skips migrations: the database is created empty.
	Empty bool
	// MaxConns is the pool size (default 20).
	MaxConns int32
	// StatementTimeout for the pool (default 15 s).
	StatementTimeout time.Duration
}

// DB is a test's database.
type DB struct {
	*pg.Pool
	Name string
	URL  string
}

// New returns a pool on a fresh database migrated with the built-in set (plus
// opts.Groups). The pool is closed at cleanup, and the database dropped if the
// test passed.
func New(tb testing.TB, opts ...Options) *DB {
	tb.Helper()
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	admin := AdminURL(tb)
	ctx := context.Background()

	var tmpl string
	if !o.Empty {
		set, err := migrate.Builtin(o.Groups...)
		if err != nil {
			tb.Fatalf("pgtest: %v", err)
		}
		tmpl = template(tb, admin, set)
	}

	name := "bct_" + sanitize(tb.Name()) + "_" + randHex(4)
	sql := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize()
	if tmpl != "" {
		sql += " TEMPLATE " + pgx.Identifier{tmpl}.Sanitize()
	}
	if err := adminExec(ctx, admin, sql); err != nil {
		tb.Fatalf("pgtest: cannot create database %s: %v", name, err)
	}
	u := WithDatabase(admin, name)
	pool, err := pg.Open(ctx, pg.Options{URL: u, MaxConns: o.MaxConns, StatementTimeout: o.StatementTimeout, StatementCache: StatementCache()})
	if err != nil {
		tb.Fatalf("pgtest: cannot open %s: %v", name, err)
	}
	tb.Cleanup(func() {
		pool.Close()
		if tb.Failed() {
			tb.Logf("pgtest: kept database %s for inspection (%s)", name, pg.RedactURL(u))
			return
		}
		_ = adminExec(context.Background(), admin, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	})
	return &DB{Pool: pool, Name: name, URL: u}
}

// template returns the name of a migrated template database for set, creating
// it once per test binary. Concurrent test binaries race safely: each migrates a
// database of its own and renames it into place; the loser drops its copy.
func template(tb testing.TB, admin string, set *migrate.Set) string {
	tb.Helper()
	templatesMu.Lock()
	defer templatesMu.Unlock()
	name := "bct_template_" + set.Hash()
	if t, ok := templates[name]; ok {
		return t
	}
	ctx := context.Background()
	var exists bool
	if err := adminQueryRow(ctx, admin, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", []any{name}, &exists); err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	if !exists {
		tmp := name + "_" + randHex(4)
		if err := adminExec(ctx, admin, "CREATE DATABASE "+tmp); err != nil {
			tb.Fatalf("pgtest: cannot create template %s: %v", tmp, err)
		}
		pool, err := pg.Open(ctx, pg.Options{URL: WithDatabase(admin, tmp), MaxConns: 2, StatementCache: StatementCache()})
		if err != nil {
			tb.Fatalf("pgtest: %v", err)
		}
		err = migrate.EnsureExtensions(ctx, pool) // as migrate does: btree_gist before the migrations
		if err == nil {
			_, err = set.Apply(ctx, pool, nil)
		}
		if err == nil {
			_, err = migrate.InitSettings(ctx, pool, DefaultShardCount)
		}
		pool.Close()
		if err != nil {
			_ = adminExec(ctx, admin, "DROP DATABASE IF EXISTS "+tmp)
			tb.Fatalf("pgtest: migrating the template: %v", err)
		}
		if err := adminExec(ctx, admin, "ALTER DATABASE "+tmp+" RENAME TO "+name); err != nil {
			_ = adminExec(ctx, admin, "DROP DATABASE IF EXISTS "+tmp)
			if !strings.Contains(err.Error(), "already exists") {
				tb.Fatalf("pgtest: %v", err)
			}
		}
	}
	templates[name] = name
	return name
}

// WithDatabase returns u pointing at database name.
func WithDatabase(u, name string) string {
	parsed, err := url.Parse(u)
	if err != nil || parsed.Scheme == "" {
		return u + " dbname=" + name
	}
	parsed.Path = "/" + name
	return parsed.String()
}

func adminExec(ctx context.Context, admin, sql string) error {
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

func adminQueryRow(ctx context.Context, admin, sql string, args []any, dest ...any) error {
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.QueryRow(ctx, sql, args...).Scan(dest...)
}

func sanitize(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
		} else {
			b.WriteRune('_')
		}
		if b.Len() >= 36 {
			break
		}
	}
	return b.String()
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// MustExec runs sql on the test database and fails the test on error.
func (d *DB) MustExec(tb testing.TB, sql string, args ...any) {
	tb.Helper()
	if _, err := d.Pool.Exec(context.Background(), sql, args...); err != nil {
		tb.Fatalf("pgtest: %s: %v", sql, err)
	}
}

// MustCount runs a query that returns one integer and fails the test on error.
func (d *DB) MustCount(tb testing.TB, sql string, args ...any) int {
	tb.Helper()
	var n int
	if err := d.Pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		tb.Fatalf("pgtest: %s: %v", sql, err)
	}
	return n
}

// RequireRefusal runs fn in a transaction of its own and fails the test unless
// fn returns an error of code and leaves the transaction usable: a SELECT 1 in
// it succeeds and it commits. A statement that failed inside fn would have
// aborted the transaction, so a refusal that passes was made before any such
// statement was sent. It returns fn's error.
func (d *DB) RequireRefusal(tb testing.TB, code fault.Code, fn func(ctx context.Context, tx pgx.Tx) error) error {
	tb.Helper()
	ctx := context.Background()
	tx, err := d.Pool.Begin(ctx)
	if err != nil {
		tb.Fatalf("pgtest: begin: %v", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	ferr := fn(ctx, tx)
	if got := fault.CodeOf(ferr); got != code {
		tb.Fatalf("pgtest: want %s, got %q: %v", code, got, ferr)
	}
	var one int
	if err := tx.QueryRow(ctx, `SELECT 1`).Scan(&one); err != nil {
		tb.Fatalf("pgtest: the transaction is not usable after the refusal (%v): %v", ferr, err)
	}
	if err := tx.Commit(ctx); err != nil {
		tb.Fatalf("pgtest: the transaction does not commit after the refusal (%v): %v", ferr, err)
	}
	return ferr
}
