package migrate_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/migrate"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

// TestADatabaseMigratedUnderARenamedMigrationsOldNameUpgrades: a database
// migrated by the release whose capacity/0007 was the overlap index (its
// ledger holds capacity/0007_overlap_index_out_of_reach, and 0007_book_groups
// never ran there) migrates with this build: no refusal, 0007_book_groups is
// applied, and the overlap index migration, now 0008, is not applied again
// (it would fail: its index exists).
func TestADatabaseMigratedUnderARenamedMigrationsOldNameUpgrades(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t) // migrated by this build
	set, err := migrate.Builtin()
	require.NoError(t, err)
	// That release's ledger and schema: no book-group functions, the overlap
	// index applied under its first name.
	db.MustExec(t, `DROP FUNCTION capacity_reserve_begin, capacity_book_group`)
	db.MustExec(t, `DELETE FROM compute_migrations WHERE name IN ('capacity/0007_book_groups', 'capacity/0008_overlap_index_out_of_reach')`)
	db.MustExec(t, `INSERT INTO compute_migrations (name, applied_at) VALUES ('capacity/0007_overlap_index_out_of_reach', compute_now())`)

	st, err := set.Check(ctx, db.Pool)
	require.NoError(t, err)
	require.Empty(t, st.Refused)
	require.Equal(t, []string{"capacity/0007_book_groups"}, st.Pending)
	res, err := set.Apply(ctx, db.Pool, nil)
	require.NoError(t, err)
	require.Equal(t, []string{"capacity/0007_book_groups"}, res.Applied)
	require.Equal(t, 2, db.MustCount(t, `SELECT count(*) FROM pg_proc WHERE proname IN ('capacity_reserve_begin', 'capacity_book_group')`))
	st, err = set.Check(ctx, db.Pool)
	require.NoError(t, err)
	require.Empty(t, st.Pending)
	require.Contains(t, st.Applied, "capacity/0008_overlap_index_out_of_reach")
}

// TestRenameKeepsTheStatementsThatRan: Rename drops the old file and records
// its name on the new one, and refuses a pair whose statements differ (the
// comments may) or a name that is not in the set.
func TestRenameKeepsTheStatementsThatRan(t *testing.T) {
	t.Parallel()
	old := migrate.Migration{Owner: "app", Number: 2, Slug: "idx", SQL: "-- app/0002_idx: first\nCREATE INDEX i ON t (a);\n"}
	cur := migrate.Migration{Owner: "app", Number: 3, Slug: "idx", SQL: "-- app/0003_idx: renumbered\n\nCREATE INDEX i ON t (a);\n"}
	one := sqlMig("app", 1)
	two := migrate.Migration{Owner: "app", Number: 2, Slug: "other", SQL: "CREATE TABLE o (id int)"}

	ms, err := migrate.Rename([]migrate.Migration{one, old, two, cur}, "app/0002_idx", "app/0003_idx")
	require.NoError(t, err)
	require.Equal(t, []string{"app/0001_t1", "app/0002_other", "app/0003_idx"}, names(ms))
	require.Equal(t, []string{"app/0002_idx"}, ms[2].Formerly)
	_, err = migrate.NewSet(migrate.Group{Owner: "app", Migrations: ms})
	require.NoError(t, err)

	changed := cur
	changed.SQL = "CREATE INDEX i ON t (b);"
	_, err = migrate.Rename([]migrate.Migration{one, old, two, changed}, "app/0002_idx", "app/0003_idx")
	require.True(t, fault.Has(err, fault.InvalidConfig), "%v", err)
	_, err = migrate.Rename([]migrate.Migration{one, two, cur}, "app/0002_idx", "app/0003_idx")
	require.True(t, fault.Has(err, fault.InvalidConfig), "%v", err)
}
