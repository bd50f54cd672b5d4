package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/bettercompute/bettercompute/domain/backfill"
	"github.com/bettercompute/bettercompute/domain/outbox/outboxtest"
	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

// The operator files: the Grafana dashboard and the Prometheus alert rules.
var (
	dashboardFile = filepath.Join("..", "..", "..", "ops", "grafana", "better-compute.json")
	alertsFile    = filepath.Join("..", "..", "..", "ops", "prometheus", "alerts.yml")
)

// PromQL's words that are not metric names: the keywords and the modifiers
// whose parenthesised list holds label names.
var (
	promqlKeywords  = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true, "atan2": true, "inf": true, "nan": true}
	promqlLabelList = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}
)

// promqlMetricNames returns the metric names expr selects, in order of first
// appearance. It is a tokenizer, not a parser (Prometheus's parser module
// would raise this module's OpenTelemetry to v1.47): it skips string
// literals, label matchers ({…}), ranges and subqueries ([…]), numbers and
// durations, Grafana variables ($name), function and aggregation names (an
// identifier before "("), keywords, and the label lists of by, without, on,
// ignoring, group_left and group_right; every other identifier is a metric
// name. It fails on unbalanced brackets, an unterminated string or a
// character PromQL does not have.
func promqlMetricNames(expr string) ([]string, error) {
	var names []string
	seen := map[string]bool{}
	var stack []rune
	closing := map[rune]rune{')': '(', '}': '{', ']': '['}
	r := []rune(expr)
	isIdentStart := func(c rune) bool { return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
	isIdent := func(c rune) bool { return isIdentStart(c) || c >= '0' && c <= '9' }
	nextNonSpace := func(i int) (rune, int) {
		for ; i < len(r); i++ {
			if r[i] != ' ' && r[i] != '\t' && r[i] != '\n' && r[i] != '\r' {
				return r[i], i
			}
		}
		return 0, i
	}
	// skipTo skips past the bracket closing the one at i, over strings.
	skipTo := func(i int, open, close rune) (int, error) {
		depth := 0
		for ; i < len(r); i++ {
			switch c := r[i]; {
			case c == '"' || c == '\'' || c == '`':
				j := i + 1
				for ; j < len(r) && r[j] != c; j++ {
					if r[j] == '\\' && c != '`' {
						j++
					}
				}
				if j >= len(r) {
					return 0, fmt.Errorf("unterminated string in %q", expr)
				}
				i = j
			case c == open:
				depth++
			case c == close:
				depth--
				if depth == 0 {
					return i + 1, nil
				}
			}
		}
		return 0, fmt.Errorf("unclosed %c in %q", open, expr)
	}
	for i := 0; i < len(r); {
		c := r[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '"' || c == '\'' || c == '`':
			return nil, fmt.Errorf("a string outside a label matcher at %d in %q", i, expr)
		case c == '{' || c == '[':
			close := map[rune]rune{'{': '}', '[': ']'}[c]
			j, err := skipTo(i, c, close)
			if err != nil {
				return nil, err
			}
			i = j
		case c == '(':
			stack = append(stack, c)
			i++
		case c == ')' || c == '}' || c == ']':
			if len(stack) == 0 || stack[len(stack)-1] != closing[c] {
				return nil, fmt.Errorf("unbalanced %c at %d in %q", c, i, expr)
			}
			stack = stack[:len(stack)-1]
			i++
		case c >= '0' && c <= '9' || c == '.':
			for i < len(r) && (isIdent(r[i]) || r[i] == '.') {
				i++
			}
		case c == '$':
			for i++; i < len(r) && isIdent(r[i]); i++ {
			}
		case isIdentStart(c):
			j := i
			for j < len(r) && isIdent(r[j]) {
				j++
			}
			word := string(r[i:j])
			next, at := nextNonSpace(j)
			switch {
			case promqlLabelList[strings.ToLower(word)]:
				if next == '(' {
					k, err := skipTo(at, '(', ')')
					if err != nil {
						return nil, err
					}
					j = k
				}
			case promqlKeywords[strings.ToLower(word)]:
			case next == '(':
				// a function or an aggregation
			case isIdentStart(next) && promqlAggregation(r, at):
				// an aggregation whose by or without comes first: sum by (x) (…)
			default:
				if !seen[word] {
					seen[word] = true
					names = append(names, word)
				}
			}
			i = j
		case strings.ContainsRune("+-*/%^=!<>,", c):
			i++
		default:
			return nil, fmt.Errorf("unexpected %q at %d in %q", c, i, expr)
		}
	}
	if len(stack) > 0 {
		return nil, fmt.Errorf("unclosed ( in %q", expr)
	}
	return names, nil
}

// promqlAggregation reports whether the word at i is by or without followed
// by "(": the modifier of the aggregation before it.
func promqlAggregation(r []rune, i int) bool {
	j := i
	for j < len(r) && (r[j] == '_' || r[j] >= 'a' && r[j] <= 'z' || r[j] >= 'A' && r[j] <= 'Z') {
		j++
	}
	word := strings.ToLower(string(r[i:j]))
	return (word == "by" || word == "without") && strings.HasPrefix(strings.TrimLeft(string(r[j:]), " \t\n"), "(")
}

// TestPromQLMetricNames: the tokenizer finds the metric names of the shapes
// the files use (aggregations with by before or after, binary operators with
// on and group_left, offsets, numbers, subqueries, Grafana variables, a brace
// inside a matcher's string) and refuses unbalanced or foreign syntax.
func TestPromQLMetricNames(t *testing.T) {
	t.Parallel()
	for expr, want := range map[string][]string{
		`sum by (kind, outcome) (rate(bettercompute_jobs_total{queue=~"$queue", kind!="a}b"}[$__rate_interval]))`: {"bettercompute_jobs_total"},
		`histogram_quantile(0.95, sum by (le) (rate(x_seconds_bucket[5m])))`:                                      {"x_seconds_bucket"},
		`(a > 300) and on (sink) (b == 0)`:                                                                        {"a", "b"},
		`sum(a) / sum without (state) (b offset 5m) * 1e3 + c[1h:5m]`:                                             {"a", "b", "c"},
		`a / on (x) group_left (y) b unless ignoring(z) c`:                                                        {"a", "b", "c"},
	} {
		got, err := promqlMetricNames(expr)
		require.NoError(t, err, expr)
		require.Equal(t, want, got, expr)
	}
	for _, bad := range []string{`sum(a`, `a{x="y"`, `a)`, `rate(a[5m)`, `a{x="y}`, `a # b`} {
		_, err := promqlMetricNames(bad)
		require.Error(t, err, bad)
	}
}

// The shapes of the two files, as far as the check reads them.
type (
	grafanaTarget struct {
		Expr         string `json:"expr"`
		RefID        string `json:"refId"`
		LegendFormat string `json:"legendFormat"`
	}
	grafanaPanel struct {
		ID      int    `json:"id"`
		Type    string `json:"type"`
		Title   string `json:"title"`
		GridPos *struct {
			H, W, X, Y int
		} `json:"gridPos"`
		Datasource *struct {
			Type string `json:"type"`
			UID  string `json:"uid"`
		} `json:"datasource"`
		Targets []grafanaTarget `json:"targets"`
		Panels  []grafanaPanel  `json:"panels"`
	}
	grafanaDashboard struct {
		Title         string         `json:"title"`
		UID           string         `json:"uid"`
		SchemaVersion int            `json:"schemaVersion"`
		Panels        []grafanaPanel `json:"panels"`
		Templating    struct {
			List []struct {
				Name       string `json:"name"`
				Type       string `json:"type"`
				Query      any    `json:"query"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	alertRules struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Expr        string            `yaml:"expr"`
				For         string            `yaml:"for"`
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
)

var labelValuesRe = regexp.MustCompile(`^label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*[a-zA-Z_][a-zA-Z0-9_]*\s*\)$`)

// opsExpressions reads the dashboard and the alert rules and returns every
// PromQL expression in them (by where it stands), and the problems of their
// shape: a panel without a target, gridPos or datasource, a target without
// expr or refId, a duplicate panel id, no datasource variable; an alert
// without a name, expr, for, severity, summary, description or runbook_url.
func opsExpressions(dashJSON, alertsYAML []byte) (map[string]string, []string) {
	exprs := map[string]string{}
	var problems []string
	var d grafanaDashboard
	if err := json.Unmarshal(dashJSON, &d); err != nil {
		return nil, []string{"dashboard: " + err.Error()}
	}
	if d.SchemaVersion < 36 || d.Title == "" || d.UID == "" {
		problems = append(problems, fmt.Sprintf("dashboard: title %q, uid %q, schemaVersion %d (want a title, a uid and 36 or later)", d.Title, d.UID, d.SchemaVersion))
	}
	ids := map[int]bool{}
	var walk func(ps []grafanaPanel)
	walk = func(ps []grafanaPanel) {
		for _, p := range ps {
			where := fmt.Sprintf("dashboard panel %d %q", p.ID, p.Title)
			if ids[p.ID] {
				problems = append(problems, where+": duplicate id")
			}
			ids[p.ID] = true
			if p.GridPos == nil || p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X+p.GridPos.W > 24 {
				problems = append(problems, where+": no gridPos within the 24 columns")
			}
			if p.Type == "row" {
				walk(p.Panels)
				continue
			}
			if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
				problems = append(problems, where+": its datasource is not the ${datasource} variable")
			}
			if len(p.Targets) == 0 {
				problems = append(problems, where+": no target")
			}
			for _, tg := range p.Targets {
				if strings.TrimSpace(tg.Expr) == "" || tg.RefID == "" {
					problems = append(problems, where+": a target without expr or refId")
					continue
				}
				exprs[where+" target "+tg.RefID] = tg.Expr
			}
		}
	}
	walk(d.Panels)
	hasDatasource := false
	for _, v := range d.Templating.List {
		if v.Type == "datasource" {
			hasDatasource = true
			continue
		}
		if v.Type != "query" {
			continue
		}
		m := labelValuesRe.FindStringSubmatch(v.Definition)
		if m == nil {
			problems = append(problems, fmt.Sprintf("dashboard variable %s: %q is not label_values(metric, label)", v.Name, v.Definition))
			continue
		}
		exprs["dashboard variable "+v.Name] = m[1]
	}
	if !hasDatasource {
		problems = append(problems, "dashboard: no datasource variable")
	}

	var a alertRules
	if err := yaml.Unmarshal(alertsYAML, &a); err != nil {
		return nil, append(problems, "alerts: "+err.Error())
	}
	n := 0
	for _, g := range a.Groups {
		for _, r := range g.Rules {
			n++
			where := fmt.Sprintf("alert %q", r.Alert)
			switch {
			case r.Alert == "" || r.Expr == "":
				problems = append(problems, where+": no name or expr")
			case r.For == "":
				problems = append(problems, where+": no for")
			case r.Labels["severity"] == "":
				problems = append(problems, where+": no labels.severity")
			case r.Annotations["summary"] == "" || r.Annotations["description"] == "":
				problems = append(problems, where+": no summary or description")
			case !strings.Contains(r.Annotations["runbook_url"], "docs/operating.md#doctor"):
				problems = append(problems, where+": its runbook_url is not the operating guide's doctor section")
			}
			if r.Expr != "" {
				exprs[where] = r.Expr
			}
		}
	}
	if n == 0 {
		problems = append(problems, "alerts: no rule")
	}
	return exprs, problems
}

// opsProblems checks the two files against the metric families exported:
// their shape (opsExpressions), every expression's syntax, and that every
// metric an expression names is exported (a histogram's _bucket, _sum and
// _count by its family).
func opsProblems(dashJSON, alertsYAML []byte, exported map[string]dto.MetricType) []string {
	exprs, problems := opsExpressions(dashJSON, alertsYAML)
	for where, expr := range exprs {
		names, err := promqlMetricNames(expr)
		if err != nil {
			problems = append(problems, where+": "+err.Error())
			continue
		}
		if len(names) == 0 {
			problems = append(problems, where+": names no metric")
		}
		for _, name := range names {
			if _, ok := exported[name]; ok {
				continue
			}
			base := name
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				base = strings.TrimSuffix(base, suffix)
			}
			if typ, ok := exported[base]; ok && base != name && (typ == dto.MetricType_HISTOGRAM || typ == dto.MetricType_SUMMARY) {
				continue
			}
			problems = append(problems, fmt.Sprintf("%s: %s is not exported", where, name))
		}
	}
	sort.Strings(problems)
	return problems
}

// TestOpsFilesNameExportedMetrics: the Grafana dashboard and the alert rules
// are well formed (every panel has a target, every alert for, severity,
// summary, description and runbook), their PromQL tokenizes, and every metric
// they name is exported: by serve's registry (the database-reading
// collectors) or a worker's (the counters), gathered after real work ran on a
// migrated database (a takeover, a FENCED refusal, a reconcile, a workflow, a
// sink delivery, a backfill) so that every vector has a child. A copy with a
// misspelled metric fails the same check.
func TestOpsFilesNameExportedMetrics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dash, err := os.ReadFile(dashboardFile)
	require.NoError(t, err)
	alerts, err := os.ReadFile(alertsFile)
	require.NoError(t, err)
	_, problems := opsExpressions(dash, alerts)
	require.Empty(t, problems, "the files' shape")

	task := &mxTaskWorker{}
	s, db := mxSession(t, mxApp(task))
	task.db = db.Pool

	// What the serve gauges need a child for and workers leave alone: a job
	// due and one running in a queue no worker works, and a workflow whose
	// step job is gone (due on its step).
	db.MustExec(t, `INSERT INTO river_job (args, kind, max_attempts, queue, state) VALUES ('{}', 'mx_idle', 25, 'mx_idle', 'available')`)
	db.MustExec(t, `INSERT INTO river_job (args, kind, max_attempts, queue, state, attempt, attempted_at, attempted_by)
		VALUES ('{}', 'mx_idle', 25, 'mx_idle', 'running', 1, clock_timestamp(), ARRAY['gone#1'])`)
	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		_, err := startKind(ctx, tx, "mx_flow", struct{}{}, nil)
		return err
	}))
	db.MustExec(t, `DELETE FROM river_job WHERE kind = $1`, jobs.WorkflowStepKind)

	// A first worker holds every shard and stops; the second takes them over.
	start := func() (*workers.Runtime, *prometheus.Registry) {
		reg, err := s.Registry()
		require.NoError(t, err)
		prom := prometheus.NewRegistry()
		rt := workertest.Start(t, db.Pool, reg, &workers.Options{Metrics: workers.NewMetrics(prom)})
		pollUntil(t, 30*time.Second, "a worker holding every shard", func() bool {
			return db.MustCount(t, `SELECT count(*) FROM compute_leases WHERE starts_with(name, 'shard/')
				AND owner = $1 AND expires_at > compute_now()`, rt.Owner()) == pgtest.DefaultShardCount
		})
		return rt, prom
	}
	first, _ := start()
	require.NoError(t, first.Stop(ctx))
	_, workerProm := start()

	// Work: a reconcile, a fenced task, a workflow, a sink event, a backfill.
	require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		if err := workers.DirtyTx(ctx, tx, "mx_item", "a", nil); err != nil {
			return err
		}
		if _, err := workers.InsertForKeyTx(ctx, tx, "t", mxTask{}, &river.InsertOpts{}); err != nil {
			return err
		}
		_, err := startKind(ctx, tx, "mx_flow", struct{}{}, nil)
		return err
	}))
	outboxtest.Append(t, db.Pool, "mx", "k", 1)
	_, err = backfill.Start(ctx, db.Pool, mxFill().Name, mxFill().Estimate)
	require.NoError(t, err)

	serveProm, err := s.serveRegistry(db.Pool)
	require.NoError(t, err)
	gatherers := prometheus.Gatherers{serveProm, workerProm}
	var exported map[string]dto.MetricType
	var last []string
	pollUntil(t, 60*time.Second, "every metric the files name, exported by serve or the worker", func() bool {
		mfs, err := gatherers.Gather()
		require.NoError(t, err)
		exported = map[string]dto.MetricType{}
		for _, mf := range mfs {
			if len(mf.GetMetric()) > 0 {
				exported[mf.GetName()] = mf.GetType()
			}
		}
		last = opsProblems(dash, alerts, exported)
		return len(last) == 0
	}, func() string { return strings.Join(last, "\n") })

	// The check bites: a misspelled metric in a copy of either file.
	badAlerts := strings.Replace(string(alerts), "bettercompute_shards_unheld_waiting > 0", "bettercompute_shard_unheld_waiting > 0", 1)
	require.NotEqual(t, string(alerts), badAlerts)
	require.Equal(t, []string{`alert "BetterComputeShardWithoutHolder": bettercompute_shard_unheld_waiting is not exported`},
		opsProblems(dash, []byte(badAlerts), exported))
	badDash := strings.Replace(string(dash), "bettercompute_outbox_sink_lag_seconds{", "bettercompute_outbox_sink_lag_second{", 1)
	require.NotEqual(t, string(dash), badDash)
	require.Len(t, opsProblems([]byte(badDash), alerts, exported), 1)
	require.Contains(t, opsProblems([]byte(badDash), alerts, exported)[0], "bettercompute_outbox_sink_lag_second is not exported")
	require.Contains(t, opsProblems(dash, []byte(strings.Replace(string(alerts), "        for: 2m\n", "", 1)), exported),
		`alert "BetterComputeShardWithoutHolder": no for`)
	var d map[string]any
	require.NoError(t, json.Unmarshal(dash, &d))
	d["panels"].([]any)[1].(map[string]any)["targets"] = []any{}
	noTarget, err := json.Marshal(d)
	require.NoError(t, err)
	require.Equal(t, []string{`dashboard panel 2 "Jobs by kind and outcome": no target`}, opsProblems(noTarget, alerts, exported))
}
