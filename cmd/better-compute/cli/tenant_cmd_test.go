package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/cmd/better-compute/cli"
	"github.com/bettercompute/bettercompute/cmd/better-compute/cli/clitest"
	"github.com/bettercompute/bettercompute/domain/tenancy"
	"github.com/bettercompute/bettercompute/domain/workflow"
	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers/workflowworker"
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

// TestTenantHTTP: serve's /v1/tenants, the workflow list and page filtered by
// tenant, the per-tenant gauges on /metrics (bounded: the busiest
// MaxTenantSeries tenants, the rest as _other), and doctor's tenant checks.
func TestTenantHTTP(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	const user, pass = "ops", "tenants-Pa55word"
	env := []string{
		"BETTER_COMPUTE_DATABASE_URL=" + db.URL, "BETTER_COMPUTE_LISTEN=127.0.0.1:0",
		"BETTER_COMPUTE_AUTH_USER=" + user, "BETTER_COMPUTE_AUTH_PASSWORD=" + pass,
		"BETTER_COMPUTE_LOG_LEVEL=warn", "BETTER_COMPUTE_READ_ONLY=true",
	}
	base := serveApp(t, wfApp(), env)
	get := func(path string) wfResponse { t.Helper(); return wfGet(t, base, path, user, pass) }

	reg, err := wfApp().Registry()
	require.NoError(t, err)
	start := func(tenant, id string) {
		t.Helper()
		require.NoError(t, pg.InTx(context.Background(), db.Pool, func(ctx context.Context, tx pgx.Tx) error {
			def, err := workflowworker.Lookup(reg, "wfcli_ping")
			if err != nil {
				return err
			}
			_, err = def.StartJSONTx(jobs.WithTenant(ctx, tenant), tx, json.RawMessage(`{}`), &workflow.StartOpts{ID: id})
			return err
		}))
	}
	start("acme", "acme-1")
	start("acme", "acme-2")
	start("globex", "globex-1")
	start("", "plain-1")
	// Many small tenants, each with one dirty key: past MaxTenantSeries.
	for i := 0; i < cli.MaxTenantSeries+5; i++ {
		db.MustExec(t, `SELECT compute_mark_dirty('counter', $1, 0, NULL, NULL, $2)`, fmt.Sprint("k", i), fmt.Sprintf("small-%02d", i))
	}
	db.MustExec(t, `UPDATE compute_tenants SET state = 'suspended' WHERE name = 'globex'`)

	require.Equal(t, http.StatusUnauthorized, wfGet(t, base, "v1/tenants", "", "").status)

	var list struct{ Tenants []tenancy.Tenant }
	r := get("v1/tenants?state=suspended")
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.NoError(t, json.Unmarshal([]byte(r.body), &list))
	require.Len(t, list.Tenants, 1)
	require.Equal(t, "globex", list.Tenants[0].Name)
	require.EqualValues(t, 1, list.Tenants[0].Waiting, "its workflow's first step waits")
	var one tenancy.Tenant
	r = get("v1/tenants/acme")
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.NoError(t, json.Unmarshal([]byte(r.body), &one))
	require.Equal(t, tenancy.Active, one.State)
	require.EqualValues(t, 2, one.Workflows)
	for path, want := range map[string]int{"v1/tenants/nobody": 404, "v1/tenants/bad%20name": 400, "v1/tenants?state=asleep": 400} {
		r := get(path)
		require.Equal(t, want, r.status, "%s: %s", path, r.body)
		require.Contains(t, r.body, `"code":"`, path)
	}

	ids := func(query string) []string {
		t.Helper()
		r := get("v1/workflows" + query)
		require.Equal(t, http.StatusOK, r.status, r.body)
		var page struct{ Workflows []workflow.Info }
		require.NoError(t, json.Unmarshal([]byte(r.body), &page))
		var out []string
		for _, w := range page.Workflows {
			out = append(out, w.ID+"@"+w.Tenant)
		}
		return out
	}
	require.Equal(t, []string{"acme-2@acme", "acme-1@acme"}, ids("?tenant=acme"))
	require.Equal(t, []string{"plain-1@", "globex-1@globex", "acme-2@acme", "acme-1@acme"}, ids(""))
	require.Empty(t, ids("?tenant=nobody"))
	r = get("workflows?tenant=acme")
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Contains(t, r.body, "acme-1")
	require.NotContains(t, r.body, "globex-1")
	require.Contains(t, r.body, `name="tenant" value="acme"`)
	r = get("workflows/globex-1")
	require.Contains(t, r.body, `<a href="/workflows?tenant=globex">globex</a>`)

	r = get("metrics")
	require.Equal(t, http.StatusOK, r.status)
	require.Contains(t, r.body, `bettercompute_tenant_waiting{tenant="acme"} 2`)
	require.Contains(t, r.body, `bettercompute_tenant_limit{tenant="acme"} 10`)
	require.Contains(t, r.body, `bettercompute_tenants{state="suspended"} 1`)
	require.Contains(t, r.body, `bettercompute_tenant_waiting{tenant="_other"} `)
	require.Equal(t, cli.MaxTenantSeries+1, strings.Count(r.body, "\nbettercompute_tenant_waiting{"),
		"the busiest MaxTenantSeries tenants and _other, not one series a tenant")

	d := clitest.Run(t, context.Background(), wfApp(), dbEnv(db), "doctor")
	require.Contains(t, d.Stdout, "1 suspended tenants hold work until resumed: globex (1)")
}
