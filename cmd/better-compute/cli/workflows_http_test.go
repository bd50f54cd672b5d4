package cli_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/cmd/better-compute/cli"
	"github.com/bettercompute/bettercompute/cmd/better-compute/cli/clitest"
	"github.com/bettercompute/bettercompute/domain/workflow"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

// serveApp runs `serve` of app in-process with environ until the test ends,
// and returns its base URL (http://127.0.0.1:PORT/) once serve prints it.
func serveApp(t *testing.T, app cli.App, environ []string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	code := make(chan int, 1)
	go func() {
		code <- cli.Run(ctx, app, []string{"serve"}, cli.Env{Stdout: pw, Stderr: zerolog.NewTestWriter(t), Environ: clitest.WithStatementCache(environ)})
		pw.Close()
	}()
	t.Cleanup(func() { cancel(); <-code })
	found := make(chan string, 1)
	go func() {
		defer close(found)
		sc := bufio.NewScanner(pr)
		for sent := false; sc.Scan(); {
			if _, rest, ok := strings.Cut(sc.Text(), "River UI: "); ok && !sent {
				found <- strings.Fields(rest)[0]
				sent = true
			}
		}
	}()
	select {
	case u, ok := <-found:
		require.True(t, ok, "serve exited before serving (see its log)")
		return u
	case <-time.After(60 * time.Second):
		t.Fatal("serve printed no URL")
	}
	return ""
}

type wfResponse struct {
	status int
	header http.Header
	body   string
}

// wfGet GETs base+path, with basic auth unless user is "".
func wfGet(t *testing.T, base, path, user, pass string) wfResponse {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, base+strings.TrimPrefix(path, "/"), nil)
	require.NoError(t, err)
	if user != "" {
		req.SetBasicAuth(user, pass)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return wfResponse{resp.StatusCode, resp.Header, string(b)}
}

// TestWorkflowsHTTP: serve's workflow API and pages, behind its credentials
// and in read-only mode, over a real connection: the list with its filters
// and pages, one workflow with its history, the HTML list and timeline (each
// step's River job linked to River UI's page of it, everything escaped), the
// errors, and the workflow gauges on /metrics.
func TestWorkflowsHTTP(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	const user, pass = "ops", "workflows-Pa55word"
	base := serveApp(t, wfApp(), []string{
		"BETTER_COMPUTE_DATABASE_URL=" + db.URL, "BETTER_COMPUTE_LISTEN=127.0.0.1:0",
		"BETTER_COMPUTE_AUTH_USER=" + user, "BETTER_COMPUTE_AUTH_PASSWORD=" + pass,
		"BETTER_COMPUTE_LOG_LEVEL=warn", "BETTER_COMPUTE_READ_ONLY=true",
	})
	get := func(path string) wfResponse { t.Helper(); return wfGet(t, base, path, user, pass) }

	// serve migrated with the application: its workflow kinds are recorded.
	wfWorker(t, db)
	db.MustExec(t, `INSERT INTO wfcli_declined VALUES ('<b>bad</b>')`)
	wfStart(t, db.Pool, "wfcli_order", `{"order": "done-1"}`, "done-1")
	wfStart(t, db.Pool, "wfcli_order", `{"order": "<b>bad</b>"}`, "bad-1")
	wfStart(t, db.Pool, "wfcli_order", `{"order": "<script>alert(1)</script>"}`, "xss-1")
	wfStart(t, db.Pool, "wfcli_ping", `{}`, "batch/1")
	wfStart(t, db.Pool, "wfcli_order", `{"order": "wait-1", "await_paid": true}`, "wait-1")
	wfWait(t, db, "done-1", workflow.Completed)
	wfWait(t, db, "bad-1", workflow.Failed)
	wfWait(t, db, "xss-1", workflow.Completed)
	wfWait(t, db, "batch/1", workflow.Completed)
	wfWait(t, db, "wait-1", workflow.Waiting)

	// Every route is behind the credentials.
	for _, p := range []string{"v1/workflows", "v1/workflows/done-1", "workflows", "workflows/done-1"} {
		r := wfGet(t, base, p, "", "")
		require.Equal(t, http.StatusUnauthorized, r.status, p)
		require.NotContains(t, r.body, "done-1", p)
		require.Equal(t, http.StatusUnauthorized, wfGet(t, base, p, user, "wrong").status, p)
	}

	// The JSON list: newest first, filtered, paged.
	list := func(query string) (ids []string, next string) {
		t.Helper()
		r := get("v1/workflows" + query)
		require.Equal(t, http.StatusOK, r.status, r.body)
		require.Equal(t, "application/json; charset=utf-8", r.header.Get("Content-Type"))
		var page struct {
			Workflows  []workflow.Info `json:"workflows"`
			NextBefore string          `json:"next_before"`
		}
		require.NoError(t, json.Unmarshal([]byte(r.body), &page))
		require.NotNil(t, page.Workflows, "an empty list is [], not null: %s", r.body)
		for _, w := range page.Workflows {
			ids = append(ids, w.ID)
		}
		return ids, page.NextBefore
	}
	ids, next := list("")
	require.Equal(t, []string{"wait-1", "batch/1", "xss-1", "bad-1", "done-1"}, ids)
	require.Empty(t, next)
	ids, _ = list("?status=completed")
	require.Equal(t, []string{"batch/1", "xss-1", "done-1"}, ids)
	ids, _ = list("?kind=wfcli_ping")
	require.Equal(t, []string{"batch/1"}, ids)
	ids, _ = list("?kind=wfcli_order&status=failed")
	require.Equal(t, []string{"bad-1"}, ids)
	ids, _ = list("?kind=nope")
	require.Empty(t, ids)
	require.Contains(t, get("v1/workflows?kind=nope").body, `"workflows":[]`)
	ids, next = list("?limit=2")
	require.Equal(t, []string{"wait-1", "batch/1"}, ids)
	require.Equal(t, "batch/1", next)
	ids, next = list("?limit=2&before=" + url.QueryEscape(next))
	require.Equal(t, []string{"xss-1", "bad-1"}, ids)
	ids, next = list("?limit=2&before=" + next)
	require.Equal(t, []string{"done-1"}, ids)
	require.Empty(t, next)

	for q, says := range map[string]string{
		"?status=bogus":      `unknown workflow status \"bogus\"`,
		"?limit=0":           `limit=\"0\": want 1 to 1000`,
		"?limit=lots":        `limit=\"lots\"`,
		"?before=bad%20id":   "bad workflow id",
		"/bad%20id":          "bad workflow id",
		"/no-such-workflow":  "no workflow no-such-workflow",
		"/batch/no-such-one": "no workflow batch/no-such-one",
	} {
		r := get("v1/workflows" + q)
		want, code := http.StatusBadRequest, "INVALID_ARGUMENT"
		if strings.Contains(says, "no workflow") {
			want, code = http.StatusNotFound, "NOT_FOUND"
		}
		require.Equal(t, want, r.status, "%s: %s", q, r.body)
		require.Equal(t, "application/json; charset=utf-8", r.header.Get("Content-Type"), q)
		require.Contains(t, r.body, `"code":"`+code+`"`, q)
		require.Contains(t, r.body, says, q)
	}

	// One workflow and its history.
	r := get("v1/workflows/done-1")
	require.Equal(t, http.StatusOK, r.status, r.body)
	var detail struct {
		Workflow map[string]any   `json:"workflow"`
		History  []map[string]any `json:"history"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.body), &detail))
	require.Equal(t, "done-1", detail.Workflow["id"])
	require.Equal(t, "completed", detail.Workflow["status"])
	require.Equal(t, map[string]any{"order": "done-1", "paid": false}, detail.Workflow["result"])
	require.Equal(t, map[string]any{"order": "done-1"}, detail.Workflow["input"])
	require.Len(t, detail.History, 2)
	hist := wfHistory(t, db, "done-1")
	for n, h := range detail.History {
		require.Equal(t, hist[n].Step, h["step"])
		require.Equal(t, hist[n].Outcome, h["outcome"])
		require.Equal(t, float64(*hist[n].JobID), h["job_id"])
		require.Contains(t, h, "started_at")
		require.Contains(t, h, "committed_at")
		require.Contains(t, h, "took_seconds")
	}
	r = get("v1/workflows/batch/1")
	require.Equal(t, http.StatusOK, r.status, "an id with a slash: %s", r.body)
	require.Contains(t, r.body, `"id":"batch/1"`)
	require.Contains(t, r.body, `"result":"pong"`)
	r = get("v1/workflows/wait-1")
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Contains(t, r.body, `"wait":{"signal":"paid","timeout_step":"expire"}`)

	// The HTML list, with its filter form.
	r = get("workflows")
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Equal(t, "text/html; charset=utf-8", r.header.Get("Content-Type"))
	require.Contains(t, r.header.Get("Content-Security-Policy"), "default-src 'none'")
	for _, id := range []string{"done-1", "bad-1", "xss-1", "batch/1", "wait-1"} {
		require.Contains(t, r.body, `<a href="/workflows/`+id+`">`+id+`</a>`)
	}
	require.Contains(t, r.body, `<option value="wfcli_order">`, "the form offers the binary's kinds")
	require.Contains(t, r.body, "card declined for &lt;b&gt;bad&lt;/b&gt;")
	require.NotContains(t, r.body, "<b>bad</b>")
	require.NotContains(t, r.body, "<script")
	r = get("workflows?status=failed")
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Contains(t, r.body, `href="/workflows/bad-1"`)
	require.NotContains(t, r.body, `href="/workflows/done-1"`)
	require.Contains(t, r.body, `<option value="failed" selected>`)
	r = get("workflows?limit=2")
	require.Contains(t, r.body, `href="/workflows?before=batch%2F1&amp;limit=2"`)
	r = get("workflows?kind=nope")
	require.Equal(t, http.StatusOK, r.status)
	require.Contains(t, r.body, "No workflows of kind nope.")
	r = get("workflows?status=bogus")
	require.Equal(t, http.StatusBadRequest, r.status)
	require.Contains(t, r.body, "unknown workflow status &#34;bogus&#34;")

	// One workflow's page: its fields and the timeline of its steps, each
	// River job linked to River UI's page of that job.
	r = get("workflows/done-1")
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Equal(t, "text/html; charset=utf-8", r.header.Get("Content-Type"))
	require.Contains(t, r.body, "<h1>done-1 ")
	for _, s := range []string{"<td>reserve</td>", "<td>charge</td>", "<td>goto</td>", "<td>completed</td>", "Timeline"} {
		require.Contains(t, r.body, s)
	}
	for _, h := range hist {
		jobID := strconv.FormatInt(*h.JobID, 10)
		require.Contains(t, r.body, `<a href="/jobs/`+jobID+`">`+jobID+`</a>`)
		// The link's target is River UI's page of that job, whose data River
		// UI's API serves.
		ui := get("jobs/" + jobID)
		require.Equal(t, http.StatusOK, ui.status)
		require.Contains(t, ui.body, "/assets/", "River UI's page")
		api := get("api/jobs/" + jobID)
		require.Equal(t, http.StatusOK, api.status, api.body)
		require.Contains(t, api.body, `"id":`+jobID)
		require.Contains(t, api.body, `"kind":"workflow_step"`)
	}
	r = get("workflows/xss-1")
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.NotContains(t, r.body, "<script")
	require.Contains(t, r.body, "&lt;script&gt;alert(1)&lt;/script&gt;")
	r = get("workflows/bad-1")
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Contains(t, r.body, "failed at step charge")
	require.NotContains(t, r.body, "<b>bad</b>")
	r = get("workflows/wait-1")
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Contains(t, r.body, "signal paid; at the deadline, step expire")
	r = get("workflows/batch/1")
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Contains(t, r.body, "<td>pong</td>")
	r = get("workflows/no-such-workflow")
	require.Equal(t, http.StatusNotFound, r.status)
	require.Contains(t, r.body, "no workflow no-such-workflow")

	// The workflow gauges on /metrics.
	r = get("metrics")
	require.Equal(t, http.StatusOK, r.status)
	require.Contains(t, r.body, `bettercompute_workflows{status="completed",workflow="wfcli_order"} 2`)
	require.Contains(t, r.body, `bettercompute_workflows{status="failed",workflow="wfcli_order"} 1`)
	require.Contains(t, r.body, `bettercompute_workflows{status="waiting",workflow="wfcli_order"} 1`)
	require.Contains(t, r.body, `bettercompute_workflows{status="completed",workflow="wfcli_ping"} 1`)
	require.Contains(t, r.body, "bettercompute_workflow_signals_waiting 0")
}
