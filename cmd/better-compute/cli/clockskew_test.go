package cli_test

import (
	"context"
	"testing"
	"time"

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
	skewed, setOffset := db.SkewedClock(t, 5*time.Second)
	env := []string{"BETTER_COMPUTE_DATABASE_URL=" + skewed, "BETTER_COMPUTE_LOG_LEVEL=warn", "BETTER_COMPUTE_LOG_FORMAT=json"}
	// Other tests' transactions on the shared server must not fail the
	// snapshot check beside the clock.
	args := []string{"doctor", "--max-xact-age", "1h"}

	r := clitest.Run(t, ctx, cli.App{}, env, args...)
	last := requireOneLineError(t, r, "CLOCK_SKEW", 1)
	require.Contains(t, last, "clock")
	require.Regexp(t, `(?m)^FAIL\s+clock\s+.*off the database's`, r.Stdout)

	setOffset(0)
	r = clitest.Run(t, ctx, cli.App{}, env, args...)
	require.Equal(t, 0, r.Code, "the same clock within the limit")
	require.Regexp(t, `(?m)^OK\s+clock\s+mode system`, r.Stdout)
}
