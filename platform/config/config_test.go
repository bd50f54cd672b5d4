package config_test

import (
	"bytes"
	"flag"
	"io"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/platform/config"
	"github.com/bettercompute/bettercompute/platform/fault"
)

// valid is an environment that passes Validate.
var valid = []string{"BETTER_COMPUTE_DATABASE_URL=postgres://u@127.0.0.1:5432/db"}

func load(t *testing.T, env ...string) *config.Config {
	t.Helper()
	c, err := config.Load(append(append([]string{}, valid...), env...))
	require.NoError(t, err)
	return c
}

func TestDefaults(t *testing.T) {
	t.Parallel()
	c, err := config.Load([]string{"UNRELATED=1", "NOEQUALS"})
	require.NoError(t, err)
	require.Equal(t, "", c.DatabaseURL)
	require.Equal(t, 20, c.DBMaxConns)
	require.Equal(t, 15*time.Second, c.StatementTimeout)
	require.Equal(t, "info", c.LogLevel)
	require.Equal(t, "", c.LogFormat)
	require.Equal(t, 16, c.ShardCount)
	require.Equal(t, 15*time.Second, c.LeaseTTL)
	require.Equal(t, 5*time.Second, c.LeaseRenew)
	require.False(t, c.DBStatementCache, "unnamed statements by default: PgBouncer in transaction mode works")
	require.Equal(t, config.Defaults(), c, "an empty environment is the defaults")

	// A variable set to "" keeps its default, as an unset one does.
	c, err = config.Load([]string{"BETTER_COMPUTE_LEASE_TTL=", "BETTER_COMPUTE_LOG_LEVEL=", "BETTER_COMPUTE_SHARD_COUNT="})
	require.NoError(t, err)
	require.Equal(t, config.Defaults(), c)

	require.NoError(t, load(t).Validate(), "the defaults plus a URL are valid")

	err = c.Validate()
	require.Equal(t, fault.InvalidConfig, fault.CodeOf(err))
	require.Contains(t, err.Error(), "BETTER_COMPUTE_DATABASE_URL")
}

func TestLoadReadsThePrefixedVariables(t *testing.T) {
	t.Parallel()
	c := load(t,
		"BETTER_COMPUTE_DB_MAX_CONNS=7",
		"BETTER_COMPUTE_STATEMENT_TIMEOUT=2500ms",
		"BETTER_COMPUTE_LOG_LEVEL=debug",
		"BETTER_COMPUTE_LOG_FORMAT=console",
		"BETTER_COMPUTE_READ_ONLY=true",
		"BETTER_COMPUTE_DB_STATEMENT_CACHE=true",
		"DB_MAX_CONNS=99", // unprefixed: not ours
	)
	require.Equal(t, 7, c.DBMaxConns)
	require.Equal(t, 2500*time.Millisecond, c.StatementTimeout)
	require.Equal(t, "debug", c.LogLevel)
	require.Equal(t, "console", c.LogFormat)
	require.True(t, c.ReadOnly)
	require.True(t, c.DBStatementCache)
	require.False(t, c.DBCancelRequests, "unset: its default")
	require.NoError(t, c.Validate())
}

func TestLoadNamesAnUnparsableVariable(t *testing.T) {
	t.Parallel()
	for _, kv := range []string{
		"BETTER_COMPUTE_DB_MAX_CONNS=lots",
		"BETTER_COMPUTE_STATEMENT_TIMEOUT=15",
		"BETTER_COMPUTE_READ_ONLY=maybe",
		"BETTER_COMPUTE_DB_STATEMENT_CACHE=sometimes",
		"BETTER_COMPUTE_SHARD_COUNT=1.5",
	} {
		_, err := config.Load(append([]string{kv}, valid...))
		require.Equal(t, fault.InvalidConfig, fault.CodeOf(err), "%s: %v", kv, err)
		name, _, _ := strings.Cut(kv, "=")
		require.Contains(t, err.Error(), name)
	}
}

func TestValidateNamesTheField(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		env   string
		field string
	}{
		{"BETTER_COMPUTE_DB_MAX_CONNS=0", "BETTER_COMPUTE_DB_MAX_CONNS"},
		{"BETTER_COMPUTE_DB_MAX_CONNS=-3", "BETTER_COMPUTE_DB_MAX_CONNS"},
		{"BETTER_COMPUTE_DB_MAX_CONNS=10001", "BETTER_COMPUTE_DB_MAX_CONNS"},
		{"BETTER_COMPUTE_STATEMENT_TIMEOUT=-1s", "BETTER_COMPUTE_STATEMENT_TIMEOUT"},
		{"BETTER_COMPUTE_LOG_LEVEL=loud", "BETTER_COMPUTE_LOG_LEVEL"},
		{"BETTER_COMPUTE_LOG_FORMAT=xml", "BETTER_COMPUTE_LOG_FORMAT"},
		{"BETTER_COMPUTE_SHARD_COUNT=0", "BETTER_COMPUTE_SHARD_COUNT"},
		{"BETTER_COMPUTE_SHARD_COUNT=5000", "BETTER_COMPUTE_SHARD_COUNT"},
		{"BETTER_COMPUTE_LEASE_TTL=10ms", "BETTER_COMPUTE_LEASE_TTL"},
		{"BETTER_COMPUTE_LEASE_RENEW=6s", "BETTER_COMPUTE_LEASE_RENEW"},
		{"BETTER_COMPUTE_LEASE_RENEW=0s", "BETTER_COMPUTE_LEASE_RENEW"},
		{"BETTER_COMPUTE_STOP_GRACE=-1s", "BETTER_COMPUTE_STOP_GRACE"},
		{"BETTER_COMPUTE_RESYNC_INTERVAL=10ms", "BETTER_COMPUTE_RESYNC_INTERVAL"},
		{"BETTER_COMPUTE_WORKERS_PER_SHARD=0", "BETTER_COMPUTE_WORKERS_PER_SHARD"},
		{"BETTER_COMPUTE_WORKER_ID=web#1", "BETTER_COMPUTE_WORKER_ID"},
		{"BETTER_COMPUTE_WORKER_ID=has space", "BETTER_COMPUTE_WORKER_ID"},
		{"BETTER_COMPUTE_POLL_INTERVAL=0s", "BETTER_COMPUTE_POLL_INTERVAL"},
		{"BETTER_COMPUTE_LISTEN=8080", "BETTER_COMPUTE_LISTEN"},
		{"BETTER_COMPUTE_AUTH_USER=admin", "BETTER_COMPUTE_AUTH_USER"},
	} {
		err := load(t, c.env).Validate()
		require.Error(t, err, c.env)
		require.Equal(t, fault.InvalidConfig, fault.CodeOf(err), "%s: %v", c.env, err)
		require.Contains(t, err.Error(), c.field, c.env)
	}
	// The password of AUTH_PASSWORD is never echoed.
	err := load(t, "BETTER_COMPUTE_AUTH_PASSWORD=hunter2-secret").Validate()
	require.Equal(t, fault.InvalidConfig, fault.CodeOf(err))
	require.NotContains(t, err.Error(), "hunter2-secret")
	require.NoError(t, load(t, "BETTER_COMPUTE_AUTH_PASSWORD=hunter2-secret", "BETTER_COMPUTE_AUTH_USER=admin").Validate())
}

func TestFlagsOverrideTheEnvironment(t *testing.T) {
	t.Parallel()
	c := load(t,
		"BETTER_COMPUTE_DB_MAX_CONNS=5",
		"BETTER_COMPUTE_STATEMENT_TIMEOUT=1s",
		"BETTER_COMPUTE_LOG_LEVEL=warn",
	)
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c.RegisterFlags(fs)
	require.NoError(t, fs.Parse([]string{
		"--db-max-conns", "9",
		"--statement-timeout=3s",
		"--database-url", "postgres://other@127.0.0.1/x",
		"--read-only",
		"--db-statement-cache",
		"rest",
	}))
	require.Equal(t, 9, c.DBMaxConns)
	require.Equal(t, 3*time.Second, c.StatementTimeout)
	require.Equal(t, "postgres://other@127.0.0.1/x", c.DatabaseURL)
	require.True(t, c.ReadOnly)
	require.True(t, c.DBStatementCache)
	require.Equal(t, "warn", c.LogLevel, "a variable without a flag keeps the environment's value")
	require.Equal(t, 16, c.ShardCount, "and one in neither keeps its default")
	require.Equal(t, []string{"rest"}, fs.Args())

	// A bad flag value is an error naming the flag; Validate catches an out of range one.
	fs = flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c.RegisterFlags(fs)
	err := fs.Parse([]string{"--db-max-conns", "many"})
	require.ErrorContains(t, err, "db-max-conns")
	fs = flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c.RegisterFlags(fs)
	require.NoError(t, fs.Parse([]string{"--db-max-conns", "0"}))
	require.ErrorContains(t, c.Validate(), "BETTER_COMPUTE_DB_MAX_CONNS")
}

func TestPrintHelpListsEveryVariableWithItsDefault(t *testing.T) {
	t.Parallel()
	c, err := config.Load(nil)
	require.NoError(t, err)
	var buf bytes.Buffer
	c.PrintHelp(&buf)
	help := buf.String()

	// The variables the platform issue names, with their defaults.
	for name, def := range map[string]string{
		"BETTER_COMPUTE_DATABASE_URL":      "-",
		"BETTER_COMPUTE_DB_MAX_CONNS":      "20",
		"BETTER_COMPUTE_STATEMENT_TIMEOUT": "15s",
		"BETTER_COMPUTE_LOG_LEVEL":         "info",
		"BETTER_COMPUTE_LOG_FORMAT":        "-",
		"BETTER_COMPUTE_PG_BIN":            "-",
		"BETTER_COMPUTE_RESYNC_INTERVAL":   "10m",
		"BETTER_COMPUTE_POLL_INTERVAL":     "100ms",
		"BETTER_COMPUTE_READ_ONLY":         "false",
	} {
		line := regexp.MustCompile(`(?m)^\s+` + name + `\s+--\S+\s+` + regexp.QuoteMeta(def) + `\s+\S`)
		require.Regexp(t, line, help, "%s with default %s", name, def)
	}
	// And every field of the struct, so the list cannot go stale.
	fields := c.Fields()
	require.GreaterOrEqual(t, len(fields), 6)
	for _, f := range fields {
		require.True(t, strings.HasPrefix(f.Env, config.Prefix), f.Env)
		def := f.Default
		if def == "" {
			def = "-"
		}
		line := regexp.MustCompile(`(?m)^\s+` + f.Env + `\s+--` + regexp.QuoteMeta(f.Flag) + `\s+` + regexp.QuoteMeta(def) + `\s+` + regexp.QuoteMeta(f.Help) + `$`)
		require.Regexp(t, line, help, f.Env)
	}
	require.Equal(t, len(fields)+1, strings.Count(help, "\n"), "a header and one line per variable")
}
