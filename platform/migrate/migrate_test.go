package migrate_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/migrate"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// sqlMig is a migration of owner with number n whose table is <owner>_<n>.
func sqlMig(owner string, n int) migrate.Migration {
	return migrate.Migration{Owner: owner, Number: n, Slug: fmt.Sprintf("t%d", n),
		SQL: fmt.Sprintf("CREATE TABLE %s_%d (id int)", owner, n)}
}

func group(owner string, n int) migrate.Group {
	g := migrate.Group{Owner: owner}
	for i := 1; i <= n; i++ {
		g.Migrations = append(g.Migrations, sqlMig(owner, i))
	}
	return g
}

// emptyDB is a database with nothing but compute_now(), which the ledger uses
// for applied_at (the built-in set defines it in core/0001_clock).
func emptyDB(t testing.TB) *pgtest.DB {
	t.Helper()
	db := pgtest.New(t, pgtest.Options{Empty: true})
	db.MustExec(t, "CREATE FUNCTION compute_now() RETURNS timestamptz LANGUAGE sql STABLE AS 'SELECT clock_timestamp()'")
	return db
}

func mustSet(t testing.TB, groups ...migrate.Group) *migrate.Set {
	t.Helper()
	s, err := migrate.NewSet(groups...)
	require.NoError(t, err)
	return s
}

func ledger(t testing.TB, db *pgtest.DB) []string {
	t.Helper()
	rows, err := db.Query(context.Background(), "SELECT name FROM compute_migrations ORDER BY name")
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return names
}

func tableExists(t testing.TB, db *pgtest.DB, name string) bool {
	t.Helper()
	var ok bool
	require.NoError(t, db.QueryRow(context.Background(), "SELECT to_regclass($1) IS NOT NULL", name).Scan(&ok))
	return ok
}

func names(ms []migrate.Migration) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Name())
	}
	return out
}

func TestApplyAndIdempotency(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := emptyDB(t)
	set := mustSet(t, group("core", 2), group("alpha", 3), group("beta", 1))

	var logged []string
	res, err := set.Apply(ctx, db.Pool, func(name string, _ time.Duration) { logged = append(logged, name) })
	require.NoError(t, err)
	want := []string{"core/0001_t1", "core/0002_t2", "alpha/0001_t1", "alpha/0002_t2", "alpha/0003_t3", "beta/0001_t1"}
	require.Equal(t, want, res.Applied, "in set order")
	require.Equal(t, want, names(set.Migrations()))
	require.Equal(t, want, logged)
	require.Zero(t, res.Skipped)
	require.ElementsMatch(t, want, ledger(t, db))
	require.Equal(t, 2, db.MustCount(t, "SELECT version FROM compute_schema_version"))
	for _, tbl := range []string{"core_1", "core_2", "alpha_1", "alpha_2", "alpha_3", "beta_1"} {
		require.True(t, tableExists(t, db, tbl), tbl)
	}

	// The second run applies nothing and logs nothing.
	logged = nil
	res, err = set.Apply(ctx, db.Pool, func(name string, _ time.Duration) { logged = append(logged, name) })
	require.NoError(t, err)
	require.Empty(t, res.Applied)
	require.Empty(t, logged)
	require.Equal(t, len(want), res.Skipped)
	require.Equal(t, len(want), db.MustCount(t, "SELECT count(*) FROM compute_migrations"))

	// A later build with one more migration applies just that one.
	set2 := mustSet(t, group("core", 2), group("alpha", 4), group("beta", 1))
	res, err = set2.Apply(ctx, db.Pool, nil)
	require.NoError(t, err)
	require.Equal(t, []string{"alpha/0004_t4"}, res.Applied)
	require.Equal(t, len(want), res.Skipped)

	st, err := set2.Check(ctx, db)
	require.NoError(t, err)
	require.True(t, st.Initialized)
	require.Empty(t, st.Pending)
	require.Empty(t, st.Refused)
	require.Len(t, st.Applied, len(want)+1)
	require.Equal(t, 2, st.SchemaVersion)
}

func TestCheckOnAnEmptyDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := emptyDB(t)
	set := mustSet(t, group("core", 1), group("alpha", 2))
	st, err := set.Check(ctx, db)
	require.NoError(t, err)
	require.False(t, st.Initialized)
	require.Equal(t, []string{"core/0001_t1", "alpha/0001_t1", "alpha/0002_t2"}, st.Pending)
	require.False(t, tableExists(t, db, "compute_migrations"), "Check changes nothing")
}

// TestRefusals plants each kind of entry this build cannot account for, and
// checks that Apply names it, returns INVALID_CONFIG and applies nothing.
func TestRefusals(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		plant string   // SQL run after the first Apply
		want  []string // in the error
	}{
		{
			name:  "later number from a known owner",
			plant: "INSERT INTO compute_migrations VALUES ('alpha/0003_from_the_future', compute_now())",
			want:  []string{"alpha/0003_from_the_future", "later number", "newer release"},
		},
		{
			name:  "unknown name at or below the last number",
			plant: "INSERT INTO compute_migrations VALUES ('alpha/0001_renamed', compute_now())",
			want:  []string{"alpha/0001_renamed", "renamed or removed"},
		},
		{
			name:  "unknown name at the last number",
			plant: "INSERT INTO compute_migrations VALUES ('alpha/0002_other', compute_now())",
			want:  []string{"alpha/0002_other", "renamed or removed"},
		},
		{
			name:  "a name that does not parse, from a known owner",
			plant: "INSERT INTO compute_migrations VALUES ('alpha/garbage', compute_now())",
			want:  []string{"alpha/garbage"},
		},
		{
			name:  "base schema version above this build's",
			plant: "UPDATE compute_schema_version SET version = 7",
			want:  []string{"compute_schema_version 7", "above this build's 1"},
		},
		{
			name: "several at once",
			plant: `INSERT INTO compute_migrations VALUES ('core/0009_later', compute_now()), ('alpha/0001_renamed', compute_now());
				UPDATE compute_schema_version SET version = 9`,
			want: []string{"core/0009_later", "alpha/0001_renamed", "compute_schema_version 9"},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := emptyDB(t)
			_, err := mustSet(t, group("core", 1), group("alpha", 1)).Apply(ctx, db.Pool, nil)
			require.NoError(t, err)
			db.MustExec(t, c.plant)
			before := ledger(t, db)

			// This build has alpha 0001-0002 and beta 0001: two pending migrations.
			set := mustSet(t, group("core", 1), group("alpha", 2), group("beta", 1))
			st, err := set.Check(ctx, db)
			require.NoError(t, err)
			require.NotEmpty(t, st.Refused)

			res, err := set.Apply(ctx, db.Pool, nil)
			require.Nil(t, res)
			require.Equal(t, fault.InvalidConfig, fault.CodeOf(err), "%v", err)
			for _, w := range c.want {
				require.Contains(t, err.Error(), w)
			}
			require.Contains(t, err.Error(), "nothing was applied")
			require.Equal(t, before, ledger(t, db), "the ledger is unchanged")
			require.False(t, tableExists(t, db, "alpha_2"))
			require.False(t, tableExists(t, db, "beta_1"))
		})
	}
}

func TestUnknownOwnersAreIgnored(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := emptyDB(t)
	_, err := mustSet(t, group("alpha", 1)).Apply(ctx, db.Pool, nil)
	require.NoError(t, err)
	// Another application's modules share the ledger; this build does not know them.
	db.MustExec(t, `INSERT INTO compute_migrations VALUES
		('gamma/0001_x', compute_now()), ('gamma/0042_y', compute_now()), ('delta/junk', compute_now())`)

	set := mustSet(t, group("alpha", 2))
	st, err := set.Check(ctx, db)
	require.NoError(t, err)
	require.Empty(t, st.Refused)
	res, err := set.Apply(ctx, db.Pool, nil)
	require.NoError(t, err)
	require.Equal(t, []string{"alpha/0002_t2"}, res.Applied)
	require.Equal(t, 1, res.Skipped)
	require.Equal(t, []string{"alpha/0001_t1", "alpha/0002_t2", "delta/junk", "gamma/0001_x", "gamma/0042_y"}, ledger(t, db))
}

func TestSetIsValidatedWhenLoaded(t *testing.T) {
	t.Parallel()
	requireInvalid := func(t *testing.T, err error, mention ...string) {
		t.Helper()
		require.Equal(t, fault.InvalidConfig, fault.CodeOf(err), "%v", err)
		for _, m := range mention {
			require.Contains(t, err.Error(), m)
		}
	}
	file := func(sql string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(sql)} }

	t.Run("FromFS bad names", func(t *testing.T) {
		for _, bad := range []string{"bad.sql", "001_short.sql", "00001_long.sql", "0002_Upper.sql", "0002-dash.sql", "0002_x.txt", "0002_.sql", "0002_sp ace.sql"} {
			_, err := migrate.FromFS("app", fstest.MapFS{"0001_ok.sql": file("SELECT 1"), bad: file("SELECT 1")})
			requireInvalid(t, err, "app/"+bad)
		}
		_, err := migrate.FromFS("app", fstest.MapFS{"0001_ok.sql": file("SELECT 1"), "sub/0002_x.sql": file("SELECT 1")})
		requireInvalid(t, err, "app/sub", "directory")
	})
	t.Run("FromFS good", func(t *testing.T) {
		ms, err := migrate.FromFS("app", fstest.MapFS{
			"0002_second.sql": file("CREATE TABLE b ()"),
			"0001_first.sql":  file("CREATE TABLE a ()"),
		})
		require.NoError(t, err)
		require.Len(t, ms, 2)
		s := mustSet(t, migrate.Group{Owner: "app", Migrations: ms})
		require.Equal(t, []string{"app/0001_first", "app/0002_second"}, names(s.Migrations()))
		require.Equal(t, "CREATE TABLE b ()", s.Migrations()[1].SQL)
	})
	t.Run("duplicate number", func(t *testing.T) {
		ms, err := migrate.FromFS("app", fstest.MapFS{
			"0001_first.sql": file("SELECT 1"), "0002_b.sql": file("SELECT 1"), "0002_c.sql": file("SELECT 1"),
		})
		require.NoError(t, err)
		_, err = migrate.NewSet(migrate.Group{Owner: "app", Migrations: ms})
		requireInvalid(t, err, "app/0002_b", "app/0002_c", "same number")
	})
	t.Run("missing number", func(t *testing.T) {
		_, err := migrate.NewSet(migrate.Group{Owner: "app", Migrations: []migrate.Migration{sqlMig("app", 1), sqlMig("app", 3)}})
		requireInvalid(t, err, "app/0003_t3", "0002 is missing")
		_, err = migrate.NewSet(migrate.Group{Owner: "app", Migrations: []migrate.Migration{sqlMig("app", 2)}})
		requireInvalid(t, err, "0001 is missing")
		_, err = migrate.NewSet(migrate.Group{Owner: "app", Migrations: []migrate.Migration{sqlMig("app", 0)}})
		requireInvalid(t, err, "app/0000_t0")
	})
	t.Run("owners", func(t *testing.T) {
		_, err := migrate.NewSet(group("alpha", 1), group("alpha", 1))
		requireInvalid(t, err, `"alpha"`, "twice")
		_, err = migrate.NewSet(group("alpha", 1), group("core", 1))
		requireInvalid(t, err, "core", "first")
		_, err = migrate.NewSet(migrate.Group{Owner: "Bad-Owner"})
		requireInvalid(t, err, "Bad-Owner")
		_, err = migrate.NewSet(migrate.Group{Owner: "alpha", Migrations: []migrate.Migration{sqlMig("beta", 1)}})
		requireInvalid(t, err, "beta/0001_t1", "alpha")
	})
	t.Run("reserved owners", func(t *testing.T) {
		for _, owner := range []string{"core", "river"} {
			_, err := migrate.Builtin(group(owner, 1))
			requireInvalid(t, err, owner, "reserved")
		}
	})
	t.Run("NewSet keeps the caller's slice", func(t *testing.T) {
		g := migrate.Group{Owner: "app", Migrations: []migrate.Migration{sqlMig("app", 2), sqlMig("app", 1)}}
		s := mustSet(t, g)
		require.Equal(t, []string{"app/0001_t1", "app/0002_t2"}, names(s.Migrations()))
	})
}

func TestBuiltinSet(t *testing.T) {
	t.Parallel()
	set, err := migrate.Builtin(group("app", 2))
	require.NoError(t, err)
	owners := set.Owners()
	require.GreaterOrEqual(t, len(owners), 3)
	require.Equal(t, "core", owners[0])
	require.Equal(t, "river", owners[1])
	require.Equal(t, "app", owners[len(owners)-1])
	require.GreaterOrEqual(t, set.CoreVersion(), 1)
	require.Equal(t, "core/0001_clock", set.Migrations()[0].Name())

	set2, err := migrate.Builtin(group("app", 3))
	require.NoError(t, err)
	require.NotEqual(t, set.Hash(), set2.Hash())
	set3, err := migrate.Builtin(group("app", 2))
	require.NoError(t, err)
	require.Equal(t, set.Hash(), set3.Hash())
}

// TestConcurrentApply runs two migrators at once, each on a pool of its own
// (as two processes would): both succeed and each migration is applied once.
func TestConcurrentApply(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := emptyDB(t)
	slow := func(owner string, n int) migrate.Migration {
		m := sqlMig(owner, n)
		m.SQL += "; SELECT pg_sleep(0.02)"
		return m
	}
	set := mustSet(t,
		migrate.Group{Owner: "core", Migrations: []migrate.Migration{slow("core", 1), slow("core", 2)}},
		migrate.Group{Owner: "alpha", Migrations: []migrate.Migration{slow("alpha", 1), slow("alpha", 2), slow("alpha", 3)}},
	)
	const migrators = 4
	results := make([]*migrate.Result, migrators)
	errs := make([]error, migrators)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range migrators {
		pool, err := pg.Open(ctx, pg.Options{URL: db.URL, MaxConns: 2})
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		wg.Go(func() {
			<-start
			results[i], errs[i] = set.Apply(ctx, pool, nil)
		})
	}
	close(start)
	wg.Wait()

	var applied []string
	for i := range migrators {
		require.NoError(t, errs[i], "migrator %d", i)
		applied = append(applied, results[i].Applied...)
		require.Equal(t, len(set.Migrations()), len(results[i].Applied)+results[i].Skipped, "migrator %d accounts for every migration", i)
	}
	slices.Sort(applied)
	want := names(set.Migrations())
	slices.Sort(want)
	require.Equal(t, want, applied, "each migration applied by exactly one migrator")
	require.Equal(t, want, ledger(t, db))
	require.Equal(t, 2, db.MustCount(t, "SELECT version FROM compute_schema_version"))
}

// TestFailedMigrationLeavesNothing: a migration that creates a table and then
// fails leaves neither the table nor its ledger row; the migrations before it
// stay applied, those after it do not run, and the next good run applies it.
func TestFailedMigrationLeavesNothing(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		bad  migrate.Migration
	}{
		{"sql", migrate.Migration{Owner: "alpha", Number: 2, Slug: "t2",
			SQL: "CREATE TABLE alpha_2 (id int); INSERT INTO alpha_2 VALUES (1); SELECT 1/0"}},
		{"go", migrate.Migration{Owner: "alpha", Number: 2, Slug: "t2",
			Apply: func(ctx context.Context, tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, "CREATE TABLE alpha_2 (id int)"); err != nil {
					return err
				}
				return errors.New("half-way failure")
			}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := emptyDB(t)
			bad := mustSet(t, migrate.Group{Owner: "alpha", Migrations: []migrate.Migration{sqlMig("alpha", 1), c.bad, sqlMig("alpha", 3)}})

			res, err := bad.Apply(ctx, db.Pool, nil)
			require.Error(t, err)
			require.Equal(t, fault.InvalidConfig, fault.CodeOf(err), "%v", err)
			require.Contains(t, err.Error(), "alpha/0002_t2")
			require.Contains(t, err.Error(), "rolled back")
			require.Equal(t, []string{"alpha/0001_t1"}, res.Applied)
			require.Equal(t, []string{"alpha/0001_t1"}, ledger(t, db))
			require.True(t, tableExists(t, db, "alpha_1"))
			require.False(t, tableExists(t, db, "alpha_2"), "the failed migration's table is gone")
			require.False(t, tableExists(t, db, "alpha_3"), "nothing after the failure ran")

			good := mustSet(t, group("alpha", 3))
			res, err = good.Apply(ctx, db.Pool, nil)
			require.NoError(t, err)
			require.Equal(t, []string{"alpha/0002_t2", "alpha/0003_t3"}, res.Applied)
			require.Equal(t, []string{"alpha/0001_t1", "alpha/0002_t2", "alpha/0003_t3"}, ledger(t, db))
		})
	}
}

// TestCancelledMigrationRollsBack cancels the context (what SIGINT does to the
// CLI) while a slow migration runs: it rolls back, and the next run finishes.
func TestCancelledMigrationRollsBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := emptyDB(t)
	// alpha/0002 sleeps while the table go_slow exists: the same set is slow
	// in the first run and fast in the second.
	db.MustExec(t, "CREATE TABLE go_slow ()")
	slow := migrate.Migration{Owner: "alpha", Number: 2, Slug: "slow",
		SQL: "CREATE TABLE alpha_2 (id int); SELECT pg_sleep(CASE WHEN to_regclass('go_slow') IS NULL THEN 0 ELSE 60 END)"}
	set := mustSet(t, migrate.Group{Owner: "alpha", Migrations: []migrate.Migration{sqlMig("alpha", 1), slow, sqlMig("alpha", 3)}})

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	var res *migrate.Result
	go func() {
		var err error
		res, err = set.Apply(runCtx, db.Pool, nil)
		done <- err
	}()
	// Wait until the slow migration sleeps, then cancel.
	require.Eventually(t, func() bool {
		var n int
		err := db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event = 'PgSleep'`).Scan(&n)
		return err == nil && n > 0
	}, 30*time.Second, 10*time.Millisecond)
	cancel()
	var err error
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Apply did not return after its context was cancelled")
	}
	require.Error(t, err)
	require.Equal(t, fault.Unavailable, fault.CodeOf(err), "%v", err)
	require.Contains(t, err.Error(), "alpha/0002_slow")
	require.Equal(t, []string{"alpha/0001_t1"}, res.Applied)

	require.Equal(t, []string{"alpha/0001_t1"}, ledger(t, db))
	require.False(t, tableExists(t, db, "alpha_2"), "the interrupted migration rolled back")
	// The cancelled context closed its connection (no cancel request: see
	// platform/pg); the server ends the statement, and releases the migration
	// lock, when it notices, within about a second.
	require.Eventually(t, func() bool {
		var n int
		err := db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND (wait_event = 'PgSleep' OR state LIKE 'idle in transaction%')`).Scan(&n)
		return err == nil && n == 0
	}, 10*time.Second, 20*time.Millisecond, "the interrupted migration still runs on the server")

	db.MustExec(t, "DROP TABLE go_slow")
	res, err = set.Apply(ctx, db.Pool, nil)
	require.NoError(t, err)
	require.Equal(t, []string{"alpha/0002_slow", "alpha/0003_t3"}, res.Applied)
	require.True(t, tableExists(t, db, "alpha_2"))
}

// TestEnsureExtensions creates btree_gist as a superuser, and explains what to do
// when the role cannot.
func TestEnsureExtensions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("superuser", func(t *testing.T) {
		t.Parallel()
		db := emptyDB(t)
		require.NoError(t, migrate.EnsureExtensions(ctx, db.Pool))
		require.Equal(t, 1, db.MustCount(t, "SELECT count(*) FROM pg_extension WHERE extname = 'btree_gist'"))
		require.NoError(t, migrate.EnsureExtensions(ctx, db.Pool), "a second time is a no-op")
		// What the extension is for: an exclusion constraint on a scalar and a range.
		db.MustExec(t, "CREATE TABLE b (d int, during tstzrange, EXCLUDE USING gist (d WITH =, during WITH &&))")
	})

	t.Run("unprivileged role", func(t *testing.T) {
		t.Parallel()
		db := emptyDB(t)
		role := strings.ToLower("bct_noext_" + db.Name[len(db.Name)-8:])
		db.MustExec(t, "CREATE ROLE "+role+" LOGIN")
		t.Cleanup(func() {
			conn, err := pgx.Connect(context.Background(), pgtest.AdminURL(t))
			if err == nil {
				_, _ = conn.Exec(context.Background(), "DROP ROLE IF EXISTS "+role)
				_ = conn.Close(context.Background())
			}
		})
		u := strings.Replace(db.URL, "postgres://postgres@", "postgres://"+role+"@", 1)
		require.NotEqual(t, db.URL, u)
		pool, err := pg.Open(ctx, pg.Options{URL: u, MaxConns: 2})
		require.NoError(t, err)
		defer pool.Close()
		var who string
		require.NoError(t, pool.QueryRow(ctx, "SELECT current_user").Scan(&who))
		require.Equal(t, role, who)

		err = migrate.EnsureExtensions(ctx, pool)
		require.Equal(t, fault.InvalidConfig, fault.CodeOf(err), "%v", err)
		require.Contains(t, err.Error(), "a superuser must run CREATE EXTENSION btree_gist")
		require.Equal(t, 0, db.MustCount(t, "SELECT count(*) FROM pg_extension WHERE extname = 'btree_gist'"))

		// Once a superuser has created it, the role gets on.
		db.MustExec(t, "CREATE EXTENSION btree_gist")
		require.NoError(t, migrate.EnsureExtensions(ctx, pool))
	})
}
