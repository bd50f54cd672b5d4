package cli_test

import (
	"context"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/cmd/better-compute/cli"
	"github.com/bettercompute/bettercompute/cmd/better-compute/cli/clitest"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

// TestDoctorReportsClockSkew: when this host's clock is more than 1 s off the
// database's, doctor FAILs its clock check, and its last line carries the
// stable code CLOCK_SKEW (the only failed check's code), exit 1. A schema ahead
// on the URL's search path stands in for a server whose clock is 5 s off: its
// compute_now() is the real one plus 5 s, and its mode reads as system. A clock
// within the limit is OK.
func TestDoctorReportsClockSkew(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{Empty: true})
	require.Equal(t, 0, clitest.Run(t, ctx, cli.App{}, dbEnv(db), "migrate").Code)
	db.MustExec(t, `CREATE SCHEMA skew;
		CREATE TABLE skew.offset_by (d interval NOT NULL);
		INSERT INTO skew.offset_by VALUES (interval '5 seconds');
		CREATE FUNCTION skew.compute_now() RETURNS timestamptz LANGUAGE sql STABLE
			AS $$ SELECT public.compute_now() + (SELECT d FROM skew.offset_by) $$;
		CREATE FUNCTION skew.compute_clock_mode() RETURNS text LANGUAGE sql STABLE AS $$ SELECT 'system' $$`)
	u, err := url.Parse(db.URL)
	require.NoError(t, err)
	q := u.Query()
	q.Set("search_path", "skew,public")
	u.RawQuery = q.Encode()
	env := []string{"BETTER_COMPUTE_DATABASE_URL=" + u.String(), "BETTER_COMPUTE_LOG_LEVEL=warn", "BETTER_COMPUTE_LOG_FORMAT=json"}
	// Other tests' transactions on the shared server must not fail the
	// snapshot check beside the clock.
	args := []string{"doctor", "--max-xact-age", "1h"}

	r := clitest.Run(t, ctx, cli.App{}, env, args...)
	last := requireOneLineError(t, r, "CLOCK_SKEW", 1)
	require.Contains(t, last, "clock")
	require.Regexp(t, `(?m)^FAIL\s+clock\s+.*off the database's`, r.Stdout)

	db.MustExec(t, `UPDATE skew.offset_by SET d = interval '0'`)
	r = clitest.Run(t, ctx, cli.App{}, env, args...)
	require.Equal(t, 0, r.Code, "the same clock within the limit")
	require.Regexp(t, `(?m)^OK\s+clock\s+mode system`, r.Stdout)
}
