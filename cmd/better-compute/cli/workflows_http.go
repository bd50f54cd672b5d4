package cli

import (
	"bytes"
	"encoding/json"
	"html/template"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/bettercompute/bettercompute/domain/workflow"
	"github.com/bettercompute/bettercompute/domain/workflow/confirmation"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/workers/workflowworker"
)

// The workflow routes of serve (see routes): read-only views of
// domain/workflow, behind serve's guards like River UI.
//
//	GET /v1/workflows?kind=&status=&tenant=&limit=&before=   {"workflows": [...], "next_before": "ID"}
//	GET /v1/workflows/{id}                           {"workflow": {...}, "history": [...]}
//	GET /workflows?kind=&status=&tenant=&limit=&before=      the HTML list, with a filter form
//	GET /workflows/{id}                              one workflow and the timeline of its steps
//
// An id may hold slashes (a child's default id is PARENT/SEQ.N), so {id} is the
// rest of the path. Errors of the JSON API are {"message": …, "code": …}, as
// serve's guards write them: 400 INVALID_ARGUMENT, 404 NOT_FOUND, 503 when the
// workflows cannot be read.

// riverUIJobPath is where River UI shows a job: serve mounts River UI at the
// root (platform/web: riverui.HandlerOpts{Prefix: "/"}), and River UI's page
// of a job is its route /jobs/$jobId.
const riverUIJobPath = "/jobs/"

// workflowsListLimit is the default page size of the list endpoints.
const workflowsListLimit = 100

// workflowsList is GET /v1/workflows's answer.
type workflowsList struct {
	Workflows []workflow.Info `json:"workflows"`
	// NextBefore, when the page is full, is the before= of the next page.
	NextBefore string `json:"next_before,omitempty"`
}

// parseWorkflowsQuery reads the list filters of r's query (INVALID_ARGUMENT
// for a bad one).
func parseWorkflowsQuery(r *http.Request) (workflow.ListOpts, error) {
	q := r.URL.Query()
	o := workflow.ListOpts{Kind: strings.TrimSpace(q.Get("kind")), Tenant: strings.TrimSpace(q.Get("tenant")),
		Limit: workflowsListLimit, Before: q.Get("before")}
	if s := q.Get("status"); s != "" {
		st, err := workflow.ParseStatus(s)
		if err != nil {
			return o, err
		}
		o.Status = st
	}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 1000 {
			return o, fault.New(fault.InvalidArgument, "limit=%q: want 1 to 1000", l)
		}
		o.Limit = n
	}
	if o.Before != "" {
		if err := workflow.ValidateID(o.Before); err != nil {
			return o, err
		}
	}
	return o, nil
}

// listWorkflows is one page of List, with the next page's cursor.
func listWorkflows(r *http.Request, db *pg.Pool, o workflow.ListOpts) (workflowsList, error) {
	ws, err := workflow.List(r.Context(), db, o)
	if err != nil {
		return workflowsList{}, err
	}
	out := workflowsList{Workflows: ws}
	if out.Workflows == nil {
		out.Workflows = []workflow.Info{}
	}
	if len(ws) == o.Limit && len(ws) > 0 {
		out.NextBefore = ws[len(ws)-1].ID
	}
	return out, nil
}

// workflowListAPI is GET /v1/workflows.
func workflowListAPI(db *pg.Pool, log zerolog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o, err := parseWorkflowsQuery(r)
		if err != nil {
			writeAPIError(w, r, log, err)
			return
		}
		page, err := listWorkflows(r, db, o)
		if err != nil {
			writeAPIError(w, r, log, err)
			return
		}
		writeAPIJSON(w, http.StatusOK, page)
	})
}

// workflowAPI is GET /v1/workflows/{id}: the workflow and its history.
func workflowAPI(db *pg.Pool, log zerolog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, err := getWorkflowDetail(r.Context(), db, r.PathValue("id"))
		if err != nil {
			writeAPIError(w, r, log, err)
			return
		}
		writeAPIJSON(w, http.StatusOK, d)
	})
}

func writeAPIJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// httpStatusOf is the HTTP status of err, and the message that may be shown:
// a client's mistake says what it was; anything else is logged and answered
// with a generic 503.
func httpStatusOf(r *http.Request, log zerolog.Logger, err error) (int, string, string) {
	code := fault.CodeOf(err)
	switch code {
	case fault.InvalidArgument:
		return http.StatusBadRequest, string(code), messageOf(err)
	case fault.NotFound:
		return http.StatusNotFound, string(code), messageOf(err)
	}
	if r.Context().Err() == nil {
		log.Error().Err(err).Str("path", r.URL.Path).Msg("cannot read the workflows")
	}
	if code == fault.Internal {
		code = fault.Unavailable
	}
	return http.StatusServiceUnavailable, string(code), "the workflows cannot be read now (see serve's log)"
}

func writeAPIError(w http.ResponseWriter, r *http.Request, log zerolog.Logger, err error) {
	status, code, msg := httpStatusOf(r, log, err)
	writeAPIJSON(w, status, map[string]string{"message": msg, "code": code})
}

// workflowsPage is GET /workflows: the list, with a filter form. kinds are
// the kinds this binary defines, offered in the form.
func workflowsPage(s *Session, db *pg.Pool, log zerolog.Logger) http.Handler {
	var kinds []string
	if reg, err := s.Registry(); err == nil {
		for k := range workflowworker.Definitions(reg) {
			kinds = append(kinds, k)
		}
	}
	sort.Strings(kinds)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o, err := parseWorkflowsQuery(r)
		if err != nil {
			writePageError(w, r, log, err)
			return
		}
		page, err := listWorkflows(r, db, o)
		if err != nil {
			writePageError(w, r, log, err)
			return
		}
		data := listPageData{Page: page, Kind: o.Kind, Status: string(o.Status), Tenant: o.Tenant, Limit: o.Limit, Kinds: kinds, Before: o.Before}
		for _, st := range workflow.Statuses {
			data.Statuses = append(data.Statuses, string(st))
		}
		if page.NextBefore != "" {
			q := url.Values{"before": {page.NextBefore}}
			if o.Kind != "" {
				q.Set("kind", o.Kind)
			}
			if o.Status != "" {
				q.Set("status", string(o.Status))
			}
			if o.Tenant != "" {
				q.Set("tenant", o.Tenant)
			}
			if o.Limit != workflowsListLimit {
				q.Set("limit", strconv.Itoa(o.Limit))
			}
			data.NextURL = "/workflows?" + q.Encode()
		}
		renderPage(w, r, log, http.StatusOK, "list", data)
	})
}

// workflowPage is GET /workflows/{id}: the workflow and the timeline of its
// steps, each step's River job linked to River UI.
func workflowPage(db *pg.Pool, log zerolog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		if id == "" {
			http.Redirect(w, r, "/workflows", http.StatusFound)
			return
		}
		d, err := getWorkflowDetail(r.Context(), db, id)
		if err != nil {
			writePageError(w, r, log, err)
			return
		}
		cs, err := confirmation.List(r.Context(), db, confirmation.ListOpts{WorkflowID: id, Limit: workflowPageConfirmations})
		if err != nil {
			writePageError(w, r, log, err)
			return
		}
		// The pending ones first (what can still happen), each group newest first.
		sort.SliceStable(cs, func(i, j int) bool {
			return cs[i].State == confirmation.Pending && cs[j].State != confirmation.Pending
		})
		renderPage(w, r, log, http.StatusOK, "detail", detailPageData{Workflow: d.Workflow, History: d.History,
			Confirmations: cs, MoreConfirmations: len(cs) == workflowPageConfirmations})
	})
}

// workflowPageConfirmations is how many of its confirmations a workflow's
// page shows, the newest.
const workflowPageConfirmations = 100

// detailPageData is a workflow's page: the workflow, its history and its
// confirmations (without tokens: there are none to show).
type detailPageData struct {
	Workflow          *workflow.Info
	History           []workflow.HistoryRow
	Confirmations     []confirmation.Binding
	MoreConfirmations bool
}

type listPageData struct {
	Page     workflowsList
	Kind     string
	Status   string
	Tenant   string
	Limit    int
	Before   string
	Kinds    []string
	Statuses []string
	NextURL  string
}

type errorPageData struct {
	Status  int
	Code    string
	Message string
}

func writePageError(w http.ResponseWriter, r *http.Request, log zerolog.Logger, err error) {
	status, code, msg := httpStatusOf(r, log, err)
	renderPage(w, r, log, status, "error", errorPageData{Status: status, Code: code, Message: msg})
}

// renderPage renders template name with data, the whole page or a 500.
func renderPage(w http.ResponseWriter, r *http.Request, log zerolog.Logger, status int, name string, data any) {
	var b bytes.Buffer
	if err := workflowTemplates.ExecuteTemplate(&b, name, data); err != nil {
		log.Error().Err(err).Str("path", r.URL.Path).Msg("cannot render a workflows page")
		http.Error(w, "cannot render the page", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin")
	// No script, no external asset: only the page's own style element.
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}

var workflowTemplates = template.Must(template.New("workflows").Funcs(template.FuncMap{
	"time": func(t time.Time) string { return fmtTime(t) },
	"ptime": func(t *time.Time) string {
		if t == nil {
			return ""
		}
		return fmtTime(*t)
	},
	"ago":      func(now, t time.Time) string { return ago(now.Sub(t)) },
	"took":     tookText,
	"int":      optInt,
	"deref":    func(p *int64) int64 { return deref(p) },
	"attempt":  attemptText,
	"jobURL":   func(id int64) string { return riverUIJobPath + strconv.FormatInt(id, 10) },
	"wfURL":    func(id string) string { return "/workflows/" + id },
	"apiURL":   func(id string) string { return "/v1/workflows/" + id },
	"json":     prettyJSON,
	"status":   func(i *workflow.Info) string { return workflowStatusLine(i) },
	"finished": func(s workflow.Status) bool { return s.Finished() },
}).Parse(workflowTemplateText))

// prettyJSON is a stored JSON value, indented.
func prettyJSON(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	var b bytes.Buffer
	if err := json.Indent(&b, raw, "", "  "); err != nil {
		return string(raw)
	}
	return b.String()
}

const workflowTemplateText = `
{{define "head"}}<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{.}} · Better Compute</title>
<style>
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; color: #1e293b; background: #f8fafc; }
header { background: #0f172a; color: #e2e8f0; padding: .6rem 1.5rem; display: flex; gap: 1.5rem; align-items: baseline; }
header a { color: #e2e8f0; text-decoration: none; }
header strong { font-size: 1.05rem; }
main { padding: 1rem 1.5rem 3rem; }
h1 { font-size: 1.3rem; margin: .3rem 0 1rem; }
h2 { font-size: 1.05rem; margin: 1.6rem 0 .6rem; }
a { color: #2563eb; }
table { border-collapse: collapse; background: #fff; border: 1px solid #e2e8f0; }
th, td { text-align: left; padding: .35rem .7rem; border-bottom: 1px solid #e2e8f0; vertical-align: top; }
th { background: #f1f5f9; font-weight: 600; white-space: nowrap; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.mono, code, pre { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12.5px; }
td.err { color: #b91c1c; max-width: 40rem; }
pre { background: #fff; border: 1px solid #e2e8f0; padding: .6rem .8rem; margin: 0; overflow-x: auto; max-height: 24rem; }
.fields th { width: 9rem; }
.st { display: inline-block; padding: 0 .45rem; border-radius: .6rem; font-size: 12px; font-weight: 600; background: #e2e8f0; }
.st-running { background: #dbeafe; color: #1e40af; }
.st-sleeping, .st-waiting { background: #fef9c3; color: #854d0e; }
.st-cancelling { background: #ffedd5; color: #9a3412; }
.st-completed { background: #dcfce7; color: #166534; }
.st-failed { background: #fee2e2; color: #991b1b; }
.st-cancelled { background: #e5e7eb; color: #374151; }
.st-pending { background: #fef9c3; color: #854d0e; }
.st-confirmed { background: #dcfce7; color: #166534; }
.st-revoked, .st-expired { background: #e5e7eb; color: #374151; }
form { display: flex; gap: .8rem; align-items: end; margin-bottom: 1rem; flex-wrap: wrap; }
label { display: flex; flex-direction: column; font-size: 12px; color: #475569; gap: .15rem; }
input, select, button { font: inherit; padding: .25rem .4rem; }
.muted { color: #64748b; }
</style>
</head>
<body>
<header><strong>Better Compute</strong><a href="/workflows">Workflows</a><a href="/">River UI</a></header>
<main>
{{end}}

{{define "foot"}}</main>
</body>
</html>
{{end}}

{{define "list"}}{{template "head" "Workflows"}}
<h1>Workflows</h1>
<form method="get" action="/workflows">
<label>Kind <input name="kind" value="{{.Kind}}" list="kinds" placeholder="any" size="18"></label>
<datalist id="kinds">{{range .Kinds}}<option value="{{.}}">{{end}}</datalist>
<label>Status <select name="status"><option value="">any</option>{{$st := .Status}}{{range .Statuses}}<option value="{{.}}"{{if eq . $st}} selected{{end}}>{{.}}</option>{{end}}</select></label>
<label>Tenant <input name="tenant" value="{{.Tenant}}" placeholder="any" size="14"></label>
<label>Limit <input name="limit" type="number" min="1" max="1000" value="{{.Limit}}" size="5"></label>
<button type="submit">Filter</button>
<a href="/workflows">clear</a>
</form>
{{if .Page.Workflows}}
<table>
<thead><tr><th>ID</th><th>Kind</th><th>Tenant</th><th>Status</th><th>Step</th><th>Seq</th><th>Updated</th><th>Error</th></tr></thead>
<tbody>
{{range .Page.Workflows}}<tr>
<td class="mono"><a href="{{wfURL .ID}}">{{.ID}}</a></td>
<td>{{.Kind}}</td>
<td>{{if .Tenant}}<a href="/workflows?tenant={{.Tenant}}">{{.Tenant}}</a>{{end}}</td>
<td><span class="st st-{{.Status}}">{{.Status}}</span></td>
<td>{{.Step}}</td>
<td class="num">{{.Seq}}</td>
<td title="{{time .UpdatedAt}}">{{ago .Now .UpdatedAt}} ago</td>
<td class="err">{{.Error}}</td>
</tr>
{{end}}</tbody>
</table>
{{if .NextURL}}<p><a href="{{.NextURL}}">Next page →</a></p>{{end}}
{{else}}
<p class="muted">No workflows{{if .Kind}} of kind {{.Kind}}{{end}}{{if .Status}} with status {{.Status}}{{end}}{{if .Tenant}} of tenant {{.Tenant}}{{end}}{{if .Before}} created before {{.Before}}{{end}}.</p>
{{end}}
{{template "foot"}}{{end}}

{{define "detail"}}{{template "head" .Workflow.ID}}{{$w := .Workflow}}
<p class="muted"><a href="/workflows">Workflows</a> / <a href="/workflows?kind={{$w.Kind}}">{{$w.Kind}}</a></p>
<h1>{{$w.ID}} <span class="st st-{{$w.Status}}">{{$w.Status}}</span></h1>
<table class="fields">
<tr><th>Kind</th><td>{{$w.Kind}}</td></tr>
{{if $w.Tenant}}<tr><th>Tenant</th><td><a href="/workflows?tenant={{$w.Tenant}}">{{$w.Tenant}}</a> <span class="muted">(<a href="/v1/tenants/{{$w.Tenant}}">its state and limit</a>)</span></td></tr>{{end}}
<tr><th>Status</th><td>{{status $w}}</td></tr>
<tr><th>Step</th><td>{{$w.Step}}</td></tr>
<tr><th>Seq</th><td>{{$w.Seq}}</td></tr>
{{if $w.JobID}}<tr><th>Job</th><td><a href="{{jobURL (deref $w.JobID)}}">{{deref $w.JobID}}</a> <span class="muted">(River UI)</span></td></tr>{{end}}
{{if $w.ParentID}}<tr><th>Parent</th><td><a href="{{wfURL $w.ParentID}}">{{$w.ParentID}}</a> <span class="muted">(at its seq {{$w.ParentSeq}})</span></td></tr>{{end}}
{{if $w.Wait}}<tr><th>Waits for</th><td>{{if $w.Wait.Signal}}signal {{$w.Wait.Signal}}{{else}}{{$w.Wait.Children}} of its children{{end}}{{if $w.Wait.TimeoutStep}}; at the deadline, step {{$w.Wait.TimeoutStep}}{{end}}</td></tr>{{end}}
{{if $w.WakeAt}}<tr><th>Wake at</th><td>{{ptime $w.WakeAt}}</td></tr>{{end}}
<tr><th>Created</th><td>{{time $w.CreatedAt}}</td></tr>
<tr><th>Updated</th><td>{{time $w.UpdatedAt}} <span class="muted">({{ago $w.Now $w.UpdatedAt}} ago)</span></td></tr>
{{if $w.FinishedAt}}<tr><th>Finished</th><td>{{ptime $w.FinishedAt}}</td></tr>{{end}}
{{if $w.Error}}<tr><th>Error</th><td class="err">{{$w.Error}}</td></tr>{{end}}
<tr><th>JSON</th><td><a href="{{apiURL $w.ID}}">{{apiURL $w.ID}}</a></td></tr>
</table>

<h2>Input</h2>
<pre>{{json $w.Input}}</pre>
{{if $w.State}}<h2>State</h2>
<pre>{{json $w.State}}</pre>{{end}}
{{if $w.Result}}<h2>Result</h2>
<pre>{{json $w.Result}}</pre>{{end}}

<h2>Timeline</h2>
{{if .History}}
<table>
<thead><tr><th>Seq</th><th>Step</th><th>Outcome</th><th>Next step</th><th>Attempt</th><th>River job</th><th>Lease epoch</th><th>Started</th><th>Committed</th><th>Took</th><th>Error</th></tr></thead>
<tbody>
{{range .History}}<tr>
<td class="num">{{.Seq}}</td>
<td>{{.Step}}</td>
<td>{{.Outcome}}</td>
<td>{{.NextStep}}</td>
<td class="num">{{attempt .Attempt}}</td>
<td class="num">{{if .JobID}}<a href="{{jobURL (deref .JobID)}}">{{deref .JobID}}</a>{{else}}-{{end}}</td>
<td class="num">{{int .LeaseEpoch}}</td>
<td class="mono">{{time .StartedAt}}</td>
<td class="mono">{{time .CommittedAt}}</td>
<td class="num">{{took .Took}}</td>
<td class="err">{{.Error}}</td>
</tr>
{{end}}</tbody>
</table>
{{else}}
<p class="muted">No step has committed yet.</p>
{{end}}
{{if .Confirmations}}
<h2>Confirmations</h2>
<p class="muted">Single-use links that signal this workflow (their links were shown once, at <code>confirmation create</code>; <code>confirmation revoke ID</code> stops one).</p>
<table>
<thead><tr><th>ID</th><th>Signal</th><th>State</th><th>Created</th><th>Expires</th></tr></thead>
<tbody>
{{range .Confirmations}}<tr>
<td class="num">{{.ID}}</td>
<td>{{.Signal}}</td>
<td><span class="st st-{{.State}}">{{.State}}</span>{{if .UsedAt}} <span class="muted">{{ptime .UsedAt}}</span>{{end}}{{if .RevokedAt}} <span class="muted">{{ptime .RevokedAt}}</span>{{end}}</td>
<td class="mono">{{time .CreatedAt}}</td>
<td class="mono">{{time .ExpiresAt}}</td>
</tr>
{{end}}</tbody>
</table>
{{if .MoreConfirmations}}<p class="muted">The newest {{len .Confirmations}} shown: <a href="/v1/confirmations?workflow={{.Workflow.ID}}&amp;limit=1000">/v1/confirmations</a> lists more.</p>{{end}}
{{end}}
{{template "foot"}}{{end}}

{{define "error"}}{{template "head" "Error"}}
<h1>{{.Status}} {{.Code}}</h1>
<p>{{.Message}}</p>
<p><a href="/workflows">All workflows</a></p>
{{template "foot"}}{{end}}
`
