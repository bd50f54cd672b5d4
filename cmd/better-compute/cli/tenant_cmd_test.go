package cli_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/cmd/better-compute/cli/clitest"
	"github.com/bettercompute/bettercompute/domain/tenancy"
)

// TestTenantCommand: list (text and --json), show, suspend, limit, resume and
// delete of a tenant that work named; bad input is one line with its code and
// changes nothing.
func TestTenantCommand(t *testing.T) {
	t.Parallel()
	db, env := wfEnv(t)
	db.MustExec(t, `SELECT compute_tenant_use('acme')`)
	db.MustExec(t, `SELECT compute_mark_dirty('counter', 'k1', 0, NULL, NULL, 'acme')`)
	run := func(args ...string) clitest.Result {
		return clitest.Run(t, context.Background(), wfApp(), env, append([]string{"tenant"}, args...)...)
	}

	r := run("list", "--json")
	require.Equal(t, 0, r.Code, r.Stderr)
	var ts []tenancy.Tenant
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &ts))
	require.Len(t, ts, 1)
	require.Equal(t, tenancy.Tenant{Name: "acme", State: tenancy.Active, MaxRunning: 10, Waiting: 1,
		CreatedAt: ts[0].CreatedAt, ChangedAt: ts[0].ChangedAt}, ts[0])

	r = run("suspend", "acme", "--reason", "unpaid invoice")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "suspended tenant acme")
	r = run("limit", "acme", "3")
	require.Equal(t, 0, r.Code, r.Stderr)
	r = run("show", "acme")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Regexp(t, `acme\s+suspended\s+0\s+3\s+1\s+0\s+unpaid invoice`, r.Stdout)
	r = run("resume", "acme")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM compute_tenants WHERE name = 'acme' AND state = 'active' AND max_running = 3`))

	for _, tc := range []struct {
		args []string
		code string
		exit int
	}{
		{[]string{"show", "nobody"}, "NOT_FOUND", 1},
		{[]string{"suspend", "bad name"}, "INVALID_ARGUMENT", 1},
		{[]string{"limit", "acme", "0"}, "INVALID_ARGUMENT", 1},
		{[]string{"limit", "acme", "-1"}, "INVALID_ARGUMENT", 2}, // (a flag, to the parser),
		{[]string{"frobnicate", "acme"}, "INVALID_ARGUMENT", 1},
		{[]string{"list", "--state", "asleep"}, "INVALID_ARGUMENT", 1},
	} {
		r := run(tc.args...)
		require.Equal(t, tc.exit, r.Code, "%v: %s", tc.args, r.Stderr)
		require.Contains(t, r.Stderr, tc.code, "%v", tc.args)
	}
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM compute_tenants WHERE name = 'acme' AND state = 'active' AND max_running = 3`),
		"bad input changed nothing")

	r = run("delete", "acme")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "dropped 1 dirty keys")
	require.Equal(t, 0, db.MustCount(t, `SELECT count(*) FROM compute_dirty WHERE tenant = 'acme'`))
	r = run("resume", "acme")
	require.Equal(t, 1, r.Code)
	require.Contains(t, r.Stderr, "CONFLICT: tenant acme is deleted")
}
