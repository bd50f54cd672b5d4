package pgtest_test

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/platform/migrate"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestNewIsMigratedAndPrivate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	set, err := migrate.Builtin()
	require.NoError(t, err)

	a := pgtest.New(t)
	b := pgtest.New(t)
	require.NotEqual(t, a.Name, b.Name)
	st, err := set.Check(ctx, a)
	require.NoError(t, err)
	require.Empty(t, st.Pending, "fully migrated")
	require.Empty(t, st.Refused)
	require.Len(t, st.Applied, len(set.Migrations()))

	// Each test's database is its own.
	a.MustExec(t, "CREATE TABLE only_in_a (id int)")
	require.Equal(t, 0, b.MustCount(t, "SELECT count(*) FROM pg_class WHERE relname = 'only_in_a'"))
	var name string
	require.NoError(t, a.QueryRow(ctx, "SELECT current_database()").Scan(&name))
	require.Equal(t, a.Name, name)

	empty := pgtest.New(t, pgtest.Options{Empty: true})
	require.Equal(t, 0, empty.MustCount(t, "SELECT count(*) FROM pg_class WHERE relname = 'compute_migrations'"))
}

func TestNewWithApplicationGroups(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, pgtest.Options{Groups: []migrate.Group{{Owner: "app", Migrations: []migrate.Migration{
		{Owner: "app", Number: 1, Slug: "items", SQL: "CREATE TABLE app_items (id int)"},
	}}}})
	require.Equal(t, 1, db.MustCount(t, "SELECT count(*) FROM compute_migrations WHERE name = 'app/0001_items'"))
	require.Equal(t, 1, db.MustCount(t, "SELECT count(*) FROM pg_class WHERE relname = 'app_items'"))
}

// TestStatementCacheFollowsTheEnvironment: New's and NewOwned's pools keep
// prepared statements exactly when TEST_DB_STATEMENT_CACHE says so, and
// statements run on them (the run in both modes covers every statement).
func TestStatementCacheFollowsTheEnvironment(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	want := pgx.QueryExecModeExec
	if pgtest.StatementCache() {
		want = pgx.QueryExecModeCacheStatement
	}
	for _, db := range []*pgtest.DB{pgtest.New(t, pgtest.Options{Empty: true}), pgtest.NewOwned(t)} {
		require.Equal(t, want, db.Config().ConnConfig.DefaultQueryExecMode, "%s (%s=%q)",
			db.Name, pgtest.EnvStatementCache, os.Getenv(pgtest.EnvStatementCache))
		var n int
		require.NoError(t, db.QueryRow(ctx, "SELECT $1::int", 7).Scan(&n))
		require.Equal(t, 7, n)
	}
}

// TestPassingTestsDropTheirDatabase: a passing subtest's database is gone after it.
func TestPassingTestsDropTheirDatabase(t *testing.T) {
	t.Parallel()
	var name string
	t.Run("inner", func(t *testing.T) {
		name = pgtest.New(t, pgtest.Options{Empty: true}).Name
	})
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgtest.AdminURL(t))
	require.NoError(t, err)
	defer conn.Close(ctx)
	var n int
	require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM pg_database WHERE datname = $1", name).Scan(&n))
	require.Equal(t, 0, n)
}
