package cli_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/workflow/confirmation"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

// TestConfirmationHTTP: serve's GET /v1/confirmations and
// POST /v1/confirmations/{id}/revoke, behind its credentials, and the
// workflow page's confirmations; no answer holds a token.
func TestConfirmationHTTP(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	const user, pass = "ops", "confirm-Pa55word"
	base := serveApp(t, wfApp(), []string{
		"BETTER_COMPUTE_DATABASE_URL=" + db.URL, "BETTER_COMPUTE_LISTEN=127.0.0.1:0",
		"BETTER_COMPUTE_AUTH_USER=" + user, "BETTER_COMPUTE_AUTH_PASSWORD=" + pass,
		"BETTER_COMPUTE_LOG_LEVEL=warn",
	})
	get := func(path string) wfResponse { t.Helper(); return wfGet(t, base, path, user, pass) }
	post := func(path string, auth bool) wfResponse {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, base+path, nil)
		require.NoError(t, err)
		if auth {
			req.SetBasicAuth(user, pass)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return wfResponse{resp.StatusCode, resp.Header, string(b)}
	}

	wfStart(t, db.Pool, "wfcli_order", `{"order": "h1", "await_paid": true}`, "order-h")
	wfStart(t, db.Pool, "wfcli_order", `{"order": "h2", "await_paid": true}`, "order-none")
	tokA, a, err := confirmation.Create(ctx, db.Pool, "order-h", "paid", &confirmation.CreateOpts{Payload: map[string]int{"amount": 5}})
	require.NoError(t, err)
	tokB, bb, err := confirmation.Create(ctx, db.Pool, "order-h", "paid", nil)
	require.NoError(t, err)
	_, err = confirmation.Confirm(ctx, db.Pool, string(tokA))
	require.NoError(t, err)
	noToken := func(body string) {
		t.Helper()
		require.NotContains(t, body, string(tokA))
		require.NotContains(t, body, string(tokB))
		require.NotContains(t, body, confirmation.TokenPrefix)
	}

	require.Equal(t, http.StatusUnauthorized, wfGet(t, base, "v1/confirmations", "", "").status)
	require.Equal(t, http.StatusUnauthorized, post("v1/confirmations/"+strconv.FormatInt(bb.ID, 10)+"/revoke", false).status)

	list := func(query string) []confirmation.Binding {
		t.Helper()
		r := get("v1/confirmations" + query)
		require.Equal(t, http.StatusOK, r.status, r.body)
		noToken(r.body)
		var page struct{ Confirmations []confirmation.Binding }
		require.NoError(t, json.Unmarshal([]byte(r.body), &page))
		require.NotNil(t, page.Confirmations, "[], not null: %s", r.body)
		return page.Confirmations
	}
	cs := list("?workflow=order-h")
	require.Len(t, cs, 2)
	require.Equal(t, []int64{bb.ID, a.ID}, []int64{cs[0].ID, cs[1].ID}, "newest first")
	require.Equal(t, []confirmation.State{confirmation.Pending, confirmation.Confirmed}, []confirmation.State{cs[0].State, cs[1].State})
	require.Len(t, list("?state=pending"), 1)
	require.Len(t, list("?limit=1"), 1)
	require.Empty(t, list("?workflow=order-none"))
	for path, want := range map[string]int{"v1/confirmations?state=asleep": 400, "v1/confirmations?limit=0": 400, "v1/confirmations?workflow=bad%20id": 400} {
		r := get(path)
		require.Equal(t, want, r.status, "%s: %s", path, r.body)
		require.Contains(t, r.body, `"code":"INVALID_ARGUMENT"`, path)
	}

	// The workflow page: its confirmations, pending first, no token.
	r := get("workflows/order-h")
	require.Equal(t, http.StatusOK, r.status, r.body)
	noToken(r.body)
	require.Contains(t, r.body, "<h2>Confirmations</h2>")
	pending := strings.Index(r.body, `<span class="st st-pending">pending</span>`)
	confirmed := strings.Index(r.body, `<span class="st st-confirmed">confirmed</span>`)
	require.True(t, pending > 0 && confirmed > pending, "pending first: %d, %d", pending, confirmed)
	r = get("workflows/order-none")
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.NotContains(t, r.body, "Confirmations", "no section without confirmations")

	// revoke: the pending one; the confirmed one is CONFLICT.
	r = post("v1/confirmations/"+strconv.FormatInt(bb.ID, 10)+"/revoke", true)
	require.Equal(t, http.StatusOK, r.status, r.body)
	noToken(r.body)
	var rb confirmation.Binding
	require.NoError(t, json.Unmarshal([]byte(r.body), &rb))
	require.Equal(t, confirmation.Revoked, rb.State)
	_, err = confirmation.Confirm(ctx, db.Pool, string(tokB))
	require.ErrorIs(t, err, confirmation.ErrNotValid)
	r = post("v1/confirmations/"+strconv.FormatInt(a.ID, 10)+"/revoke", true)
	require.Equal(t, http.StatusConflict, r.status, r.body)
	require.Contains(t, r.body, `"code":"CONFLICT"`)
	require.Contains(t, r.body, "already confirmed: its signal was delivered")
	for path, want := range map[string]int{"v1/confirmations/999999/revoke": 404, "v1/confirmations/abc/revoke": 400} {
		r := post(path, true)
		require.Equal(t, want, r.status, "%s: %s", path, r.body)
	}
	require.Equal(t, []confirmation.State{confirmation.Revoked, confirmation.Confirmed},
		[]confirmation.State{list("")[0].State, list("")[1].State})
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM compute_workflow_signals`), "the confirmed one's signal, once")
}
