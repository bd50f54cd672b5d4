package pgtest_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/platform/migrate"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

// TestNewOwnedIsAPlainOwner: NewOwned's database is empty and owned by the role
// its pool connects as, a role with no privilege beyond that; and that role can
// migrate it (btree_gist is a trusted extension, so the owner may create it).
func TestNewOwnedIsAPlainOwner(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewOwned(t)

	var user, owner, database string
	var super, createRole, createDB, readsStats bool
	require.NoError(t, db.QueryRow(ctx, `
		SELECT current_user, pg_get_userbyid(d.datdba), current_database(),
		       r.rolsuper, r.rolcreaterole, r.rolcreatedb, pg_has_role(current_user, 'pg_read_all_stats', 'MEMBER')
		FROM pg_database d, pg_roles r
		WHERE d.datname = current_database() AND r.rolname = current_user`).
		Scan(&user, &owner, &database, &super, &createRole, &createDB, &readsStats))
	require.Equal(t, db.Name, database)
	require.Equal(t, user, owner, "the pool's role owns the database")
	require.NotEqual(t, "postgres", user)
	require.False(t, super, "not a superuser")
	require.False(t, createRole)
	require.False(t, createDB)
	require.False(t, readsStats, "cannot see other roles' sessions")
	require.Equal(t, 0, db.MustCount(t, "SELECT count(*) FROM pg_class WHERE relname = 'compute_migrations'"), "empty")

	// What better-compute migrate does, as this role.
	set, err := migrate.Builtin()
	require.NoError(t, err)
	require.NoError(t, migrate.EnsureExtensions(ctx, db.Pool))
	_, err = set.Apply(ctx, db.Pool, nil)
	require.NoError(t, err)
	_, err = migrate.InitSettings(ctx, db.Pool, pgtest.DefaultShardCount)
	require.NoError(t, err)
	st, err := set.Check(ctx, db)
	require.NoError(t, err)
	require.Empty(t, st.Pending)
	require.Equal(t, 1, db.MustCount(t, "SELECT count(*) FROM pg_extension WHERE extname = 'btree_gist'"))
}

// TestNewOwnedDropsItsDatabaseAndRole: after a passing subtest, neither its
// database nor its role is left on the server.
func TestNewOwnedDropsItsDatabaseAndRole(t *testing.T) {
	t.Parallel()
	var name string
	t.Run("inner", func(t *testing.T) {
		db := pgtest.NewOwned(t)
		db.MustExec(t, "CREATE TABLE mine (id int)") // an object the role owns
		name = db.Name
	})
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgtest.AdminURL(t))
	require.NoError(t, err)
	defer conn.Close(ctx)
	var dbs, roles int
	require.NoError(t, conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_database WHERE datname = $1),
		(SELECT count(*) FROM pg_roles WHERE rolname = $1)`, name).Scan(&dbs, &roles))
	require.Equal(t, 0, dbs)
	require.Equal(t, 0, roles)
}
