package cli_test

import (
	"fmt"
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/cmd/better-compute/cli"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/platform/web"
)

// TestAModuleBringsItsOwnRoutes: serve mounts an application module's Routes
// beside the built-in modules' (the event stream, the workflows' pages),
// behind the same credentials, and in read-only mode refuses the routes that
// are not marked ReadOnly.
func TestAModuleBringsItsOwnRoutes(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	app := cli.App{Name: "shop", Modules: []cli.Module{{Name: "shop",
		Routes: func(s *cli.Session, db *pg.Pool) []web.Route {
			return []web.Route{
				{Pattern: "GET /shop/orders", ReadOnly: true, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					var n int
					if err := db.QueryRow(r.Context(), `SELECT count(*) FROM compute_leases`).Scan(&n); err != nil {
						http.Error(w, err.Error(), http.StatusInternalServerError)
						return
					}
					fmt.Fprintf(w, "leases %d", n)
				})},
				{Pattern: "POST /shop/orders", Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
					w.WriteHeader(http.StatusCreated)
				})},
			}
		}}}}
	const user, pass = "ops", "routes-Pa55word"
	base := serveApp(t, app, []string{
		"BETTER_COMPUTE_DATABASE_URL=" + db.URL, "BETTER_COMPUTE_LISTEN=127.0.0.1:0",
		"BETTER_COMPUTE_AUTH_USER=" + user, "BETTER_COMPUTE_AUTH_PASSWORD=" + pass,
		"BETTER_COMPUTE_LOG_LEVEL=warn", "BETTER_COMPUTE_READ_ONLY=true",
	})
	do := func(method, path string, auth bool) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, base+path, nil)
		require.NoError(t, err)
		if auth {
			req.SetBasicAuth(user, pass)
		}
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		return res.StatusCode, string(b)
	}
	code, body := do("GET", "shop/orders", true)
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, "leases 0", body)
	code, _ = do("GET", "shop/orders", false)
	require.Equal(t, http.StatusUnauthorized, code, "behind serve's credentials")
	code, _ = do("POST", "shop/orders", true)
	require.NotEqual(t, http.StatusCreated, code, "read-only mode refuses a route not marked ReadOnly")
	code, _ = do("GET", "v1/workflows", true)
	require.Equal(t, http.StatusOK, code, "the built-in modules' routes too")
}
