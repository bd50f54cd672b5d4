package cli_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/cmd/better-compute/cli"
	"github.com/bettercompute/bettercompute/cmd/better-compute/cli/clitest"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

// errorLine is the contract of every failing command: its last line on stderr is
// CODE: message, one line.
var errorLine = regexp.MustCompile(`^(INVALID_CONFIG|INVALID_ARGUMENT|NOT_FOUND|CONFLICT|FENCED|CLOCK_SKEW|UNAVAILABLE|INTERNAL_ERROR): \S`)

// requireOneLineError checks r against the contract: exit status exit, the last
// stderr line CODE: message (with code, unless it is ""), and nothing else on
// stderr but log records (JSON lines): no continuation lines of a multi-line
// error. It returns the last line.
func requireOneLineError(t *testing.T, r clitest.Result, code string, exit int) string {
	t.Helper()
	require.Equal(t, exit, r.Code)
	lines := strings.Split(strings.TrimRight(r.Stderr, "\n"), "\n")
	last := lines[len(lines)-1]
	require.Regexp(t, errorLine, last)
	if code != "" {
		require.True(t, strings.HasPrefix(last, code+": "), "want %s, got %q", code, last)
	}
	for _, l := range lines[:len(lines)-1] {
		require.True(t, strings.HasPrefix(l, "{"), "stderr holds a line that is neither a log record nor the error: %q", l)
	}
	return last
}

// TestEveryErrorIsOneLine runs the error paths an operator meets (unreachable
// server, wrong password, missing database, bad URL, bad flags and settings,
// unknown names) through several commands, with debug logging on, and checks
// each ends with one line CODE: message.
func TestEveryErrorIsOneLine(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// localhost and the default sslmode make pgx try several times, and report each
	// attempt on a line of its own.
	refused := fmt.Sprintf("postgres://bob:pw@localhost:%d/db?connect_timeout=5", refusedPort(t))
	const secret = "One-line-s3cret"
	pwServer := pgtest.NewPasswordServer(t, "carol", secret)
	db := pgtest.New(t)
	missing := pgtest.WithDatabase(db.URL, "bct_no_such_database")

	env := func(url string, more ...string) []string {
		return append([]string{"BETTER_COMPUTE_DATABASE_URL=" + url, "BETTER_COMPUTE_LOG_LEVEL=debug", "BETTER_COMPUTE_LOG_FORMAT=json"}, more...)
	}
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		code string
		exit int
		says string
	}{
		{"refused: migrate", env(refused), []string{"migrate"}, "UNAVAILABLE", 1, "connection refused"},
		{"refused: doctor", env(refused), []string{"doctor"}, "UNAVAILABLE", 1, "connection refused"},
		{"refused: worker", env(refused), []string{"worker", "--no-migrate"}, "UNAVAILABLE", 1, "connection refused"},
		{"refused: sinks", env(refused), []string{"sinks", "list"}, "UNAVAILABLE", 1, "connection refused"},
		{"refused: backfill", env(refused), []string{"backfill", "list"}, "UNAVAILABLE", 1, "connection refused"},
		{"wrong password: migrate", env(pwServer.URL("wrong-" + secret)), []string{"migrate"}, "INVALID_CONFIG", 1, "authentication failed"},
		{"wrong password: doctor", env(pwServer.URL("wrong-" + secret)), []string{"doctor"}, "INVALID_CONFIG", 1, "authentication failed"},
		{"wrong password: worker", env(pwServer.URL("wrong-" + secret)), []string{"worker"}, "INVALID_CONFIG", 1, "authentication failed"},
		{"no such database", env(missing), []string{"migrate"}, "INVALID_CONFIG", 1, "does not exist"},
		{"bad URL", env("postgres://bob:" + secret + "@127.0.0.1:notaport/db"), []string{"migrate"}, "INVALID_CONFIG", 1, "BETTER_COMPUTE_DATABASE_URL"},
		{"no URL", []string{"BETTER_COMPUTE_LOG_FORMAT=json"}, []string{"migrate"}, "INVALID_CONFIG", 1, "DATABASE_URL"},
		{"bad setting", env(db.URL, "BETTER_COMPUTE_DB_MAX_CONNS=many"), []string{"migrate"}, "INVALID_CONFIG", 1, "BETTER_COMPUTE_DB_MAX_CONNS"},
		{"bad lease renewal", env(db.URL, "BETTER_COMPUTE_LEASE_RENEW=1m"), []string{"worker"}, "INVALID_CONFIG", 1, "LEASE_RENEW"},
		{"shard out of range", env(db.URL), []string{"worker", "--no-migrate", "--shards", "99"}, "INVALID_CONFIG", 1, "99"},
		{"embedded without --dev", env("embedded:memory"), []string{"migrate"}, "INVALID_CONFIG", 1, "--dev"},
		{"unknown command", env(db.URL), []string{"frobnicate"}, "INVALID_ARGUMENT", 2, "frobnicate"},
		{"unknown flag", env(db.URL), []string{"migrate", "--frobnicate"}, "INVALID_ARGUMENT", 2, "frobnicate"},
		{"unknown sink", env(db.URL), []string{"sinks", "pause", "no-such-sink"}, "NOT_FOUND", 1, "no-such-sink"},
		{"unknown backfill", env(db.URL), []string{"backfill", "status", "no_such_backfill"}, "NOT_FOUND", 1, "no_such_backfill"},
		{"unknown verb", env(db.URL), []string{"sinks", "frobnicate"}, "INVALID_ARGUMENT", 1, "frobnicate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := clitest.Run(t, ctx, cli.App{}, tc.env, tc.args...)
			last := requireOneLineError(t, r, tc.code, tc.exit)
			require.Contains(t, last, tc.says)
			require.NotContains(t, r.Stdout+r.Stderr, secret)
		})
	}
}

// TestUnexpectedFailuresAreInternalError: a failure no code names (an
// application command's plain error, a database error the CLI does not expect:
// here a column missing from a table `sinks list` reads) ends with one line
// INTERNAL_ERROR: message, exit 1.
func TestUnexpectedFailuresAreInternalError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	env := []string{"BETTER_COMPUTE_DATABASE_URL=" + db.URL, "BETTER_COMPUTE_LOG_FORMAT=json"}

	app := cli.App{Name: "shop", Commands: []cli.Command{{Name: "explode", Summary: "fail unexpectedly",
		Run: func(ctx context.Context, c *cli.CommandContext, args []string) error {
			return fmt.Errorf("reading the orders: %w", errors.New("the disk caught fire"))
		}}}}
	r := clitest.Run(t, ctx, app, env, "explode")
	last := requireOneLineError(t, r, "INTERNAL_ERROR", 1)
	require.Contains(t, last, "the disk caught fire")

	db.MustExec(t, `ALTER TABLE compute_sinks DROP COLUMN paused`)
	r = clitest.Run(t, ctx, cli.App{}, env, "sinks", "list")
	last = requireOneLineError(t, r, "INTERNAL_ERROR", 1)
	require.Contains(t, last, "paused")
}

// refusedPort is a local port nothing listens on (it was free a moment ago), so
// a connection to it is refused.
func refusedPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	return port
}
