package cli_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/cmd/better-compute/cli"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

// TestStatementCacheSetting: BETTER_COMPUTE_DB_STATEMENT_CACHE, or its flag,
// reaches the command's pool: a statement the command runs twice on one
// connection is prepared once; without the setting nothing is prepared.
// (cli.Run, not clitest.Run, so that TEST_DB_STATEMENT_CACHE does not set it.)
func TestStatementCacheSetting(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, pgtest.Options{Empty: true})
	const stmt = "SELECT $1::int * 2"
	app := cli.App{Name: "prepared", Commands: []cli.Command{{
		Name:    "prepared",
		Summary: "run a statement twice and count the prepared ones",
		Run: func(ctx context.Context, c *cli.CommandContext, _ []string) error {
			conn, err := c.DB.Acquire(ctx)
			if err != nil {
				return err
			}
			defer conn.Release()
			for i := range 2 {
				var n int
				if err := conn.QueryRow(ctx, stmt, i).Scan(&n); err != nil {
					return err
				}
			}
			var n int
			if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_prepared_statements WHERE statement = $1", stmt).Scan(&n); err != nil {
				return err
			}
			fmt.Fprintf(c.Stdout, "%s prepared %d\n", c.DB.Config().ConnConfig.DefaultQueryExecMode, n)
			return nil
		},
	}}}
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"default", nil, nil, "exec prepared 0"},
		{"env", []string{"BETTER_COMPUTE_DB_STATEMENT_CACHE=true"}, nil, "cache statement prepared 1"},
		{"flag", nil, []string{"--db-statement-cache"}, "cache statement prepared 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			env := append([]string{"BETTER_COMPUTE_DATABASE_URL=" + db.URL, "BETTER_COMPUTE_LOG_LEVEL=warn"}, tc.env...)
			code := cli.Run(context.Background(), app, append([]string{"prepared"}, tc.args...),
				cli.Env{Stdout: &stdout, Stderr: &stderr, Environ: env})
			require.Equal(t, 0, code, stderr.String())
			require.Equal(t, tc.want, strings.TrimSpace(stdout.String()))
		})
	}
}
