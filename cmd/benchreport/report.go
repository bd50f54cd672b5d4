package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"regexp"
	"strconv"
	"strings"
)

// result is one benchmark's result line.
type result struct {
	pkg, name string // name as printed, without the -GOMAXPROCS suffix
	metrics   map[string]float64
}

// run is what one or more `go test -bench` outputs hold.
type run struct {
	results []*result
	byKey   map[string]*result
	status  map[string]string // "failed" or "skipped", by key, for benchmarks with no result
	cpu     string            // the "cpu:" line go test prints
}

func newRun() *run {
	return &run{byKey: map[string]*result{}, status: map[string]string{}}
}

func key(pkg, name string) string { return pkg + "\x00" + name }

// add records a result; a later result of the same benchmark replaces an
// earlier one (a rerun passed after the run it corrects), in its place.
func (r *run) add(pkg, name string, metrics map[string]float64) {
	k := key(pkg, name)
	delete(r.status, k)
	if old, ok := r.byKey[k]; ok {
		old.metrics = metrics
		return
	}
	res := &result{pkg: pkg, name: name, metrics: metrics}
	r.results = append(r.results, res)
	r.byKey[k] = res
}

var procsSuffix = regexp.MustCompile(`-\d+$`)

// parse adds the results in one `go test -bench` output to r. It knows the
// package from the "pkg:" lines, and takes a result line that output of the
// benchmark's own separated from its name ("BenchmarkX-2  <log line>", then
// "  1  42 ns/op ..." later).
func (r *run) parse(in io.Reader) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 0, 64*1024), 16*1024*1024)
	var pkg, pending string
	for sc.Scan() {
		line := sc.Text()
		f := strings.Fields(line)
		switch {
		case len(f) == 0:
			continue
		case strings.HasPrefix(line, "pkg: "):
			pkg, pending = strings.TrimSpace(line[len("pkg: "):]), ""
			continue
		case strings.HasPrefix(line, "cpu: "):
			r.cpu = strings.TrimSpace(line[len("cpu: "):])
			continue
		case len(f) >= 3 && f[0] == "---" && (f[1] == "FAIL:" || f[1] == "SKIP:") && strings.HasPrefix(f[2], "Benchmark"):
			name := procsSuffix.ReplaceAllString(f[2], "")
			if _, ok := r.byKey[key(pkg, name)]; !ok {
				r.status[key(pkg, name)] = map[string]string{"FAIL:": "failed", "SKIP:": "skipped"}[f[1]]
			}
			if name == pending {
				pending = ""
			}
			continue
		case strings.HasPrefix(f[0], "Benchmark"):
			pending = procsSuffix.ReplaceAllString(f[0], "")
			if m, _, ok := metricsTail(f[1:]); ok {
				r.add(pkg, pending, m)
				pending = ""
			}
			continue
		}
		// A line after the name that output separated from its result: the
		// result is the whole line, or ends it with the time per iteration.
		if pending == "" {
			continue
		}
		if m, at, ok := metricsTail(f); ok {
			if _, ns := m["ns/op"]; at == 0 || ns {
				r.add(pkg, pending, m)
				pending = ""
			}
		}
	}
	return sc.Err()
}

// metricsTail reads the longest tail of f that is a result (an iteration
// count, then value-unit pairs), and where it starts.
func metricsTail(f []string) (map[string]float64, int, bool) {
next:
	for i := range f {
		rest := f[i+1:]
		if _, err := strconv.ParseUint(f[i], 10, 64); err != nil || len(rest) < 2 || len(rest)%2 != 0 {
			continue
		}
		m := map[string]float64{}
		for j := 0; j < len(rest); j += 2 {
			v, err := strconv.ParseFloat(rest[j], 64)
			if err != nil {
				continue next
			}
			if _, err := strconv.ParseFloat(rest[j+1], 64); err == nil {
				continue next
			}
			m[rest[j+1]] = v
		}
		return m, i, true
	}
	return nil, 0, false
}

// target is a row's target: a comparison with a bound.
type target struct {
	op    string // ">=", "<=", ">" or "<"
	bound float64
}

func parseTarget(s string) (*target, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	for _, op := range []string{">=", "<=", ">", "<"} {
		if rest, ok := strings.CutPrefix(s, op); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err != nil {
				return nil, fmt.Errorf("target %q: %w", s, err)
			}
			return &target{op: op, bound: v}, nil
		}
	}
	return nil, fmt.Errorf("target %q: want >=, <=, > or < and a number", s)
}

func (t *target) met(v float64) bool {
	switch t.op {
	case ">=":
		return v >= t.bound
	case "<=":
		return v <= t.bound
	case ">":
		return v > t.bound
	default:
		return v < t.bound
	}
}

func (t *target) String() string {
	op := map[string]string{">=": "≥", "<=": "≤"}[t.op]
	if op == "" {
		op = t.op
	}
	return op + " " + strconv.FormatFloat(t.bound, 'f', -1, 64)
}

// compiled is a row with its regexp and target read.
type compiled struct {
	Row
	re     *regexp.Regexp
	top    bool // Bench has no "/": it matches sub-benchmarks too
	target *target
}

func compile(specs []Row) ([]compiled, error) {
	out := make([]compiled, 0, len(specs))
	for _, s := range specs {
		re, err := regexp.Compile(`^(?:` + s.Bench + `)$`)
		if err != nil {
			return nil, fmt.Errorf("row %q: %w", s.What, err)
		}
		t, err := parseTarget(s.Target)
		if err != nil {
			return nil, fmt.Errorf("row %q: %w", s.What, err)
		}
		out = append(out, compiled{Row: s, re: re, top: !strings.Contains(s.Bench, "/"), target: t})
	}
	return out, nil
}

func (c compiled) inPkg(pkg string) bool {
	// A result read without a "pkg:" line may be any package's.
	return c.Pkg == "" || pkg == "" || pkg == c.Pkg || strings.HasSuffix(pkg, "/"+c.Pkg)
}

func (c compiled) matches(pkg, name string) bool {
	n, ok := strings.CutPrefix(name, "Benchmark")
	if !ok || !c.inPkg(pkg) {
		return false
	}
	if c.re.MatchString(n) {
		return true
	}
	top, _, sub := strings.Cut(n, "/")
	return sub && c.top && c.re.MatchString(top)
}

// report writes the Markdown: the header line, a blank line and the table. A
// row whose benchmark did not run says so, or is left out with omitMissing; one
// whose benchmark failed or was skipped says so.
func report(w io.Writer, header string, specs []Row, r *run, omitMissing bool) error {
	cs, err := compile(specs)
	if err != nil {
		return err
	}
	var b strings.Builder
	if header != "" {
		b.WriteString(header + "\n\n")
	}
	b.WriteString("| what | ours | peer | ratio | target | met? |\n| --- | --- | --- | --- | --- | --- |\n")
	for _, c := range cs {
		found := false
		for _, res := range r.results {
			if c.matches(res.pkg, res.name) {
				found = true
				line(&b, c.cells(res, r))
			}
		}
		if found {
			continue
		}
		status := "not run"
		for k, s := range r.status {
			pkg, name, _ := strings.Cut(k, "\x00")
			if c.matches(pkg, name) && status != "failed" {
				status = s
			}
		}
		if status != "not run" || !omitMissing {
			line(&b, c.missing(status))
		}
	}
	_, err = io.WriteString(w, b.String())
	return err
}

const none = "—"

// cells are the table's cells for one result.
func (c compiled) cells(res *result, r *run) []string {
	ours, hasOurs := res.metrics[c.Ours]
	oursCell := none
	if hasOurs {
		oursCell = figure(ours, c.Ours)
	}

	peerCell := orNone(c.Peer)
	var peer float64
	hasPeer := false
	if c.PeerUnit != "" {
		from := res
		if c.PeerBench != "" {
			from = r.byKey[key(res.pkg, "Benchmark"+c.PeerBench)]
		}
		if from != nil {
			peer, hasPeer = from.metrics[c.PeerUnit]
		}
		v := none
		if hasPeer {
			v = figure(peer, c.PeerUnit)
		}
		if c.Peer != "" {
			v = c.Peer + ": " + v
		}
		peerCell = v
	}

	ratio, hasRatio := res.metrics[c.Ratio]
	if c.Ratio == "" || !hasRatio {
		hasRatio = hasOurs && hasPeer && peer != 0
		if hasRatio {
			ratio = ours / peer
		}
	}
	ratioCell := none
	if hasRatio {
		ratioCell = num(ratio)
	}

	// The target is on the ratio, or on our figure in a row with no peer figure.
	judged, hasJudged := ratio, hasRatio
	if c.PeerUnit == "" && c.Ratio == "" {
		judged, hasJudged = ours, hasOurs
	}
	targetCell, metCell := none, none
	if c.target != nil {
		targetCell = c.target.String()
		if hasJudged {
			metCell = "**no**"
			if c.target.met(judged) {
				metCell = "yes"
			}
		}
	}
	return []string{c.What + " (`" + res.name + "`)", oursCell, peerCell, ratioCell, targetCell, metCell}
}

// missing are the cells of a row whose benchmark gave no result.
func (c compiled) missing(status string) []string {
	targetCell := none
	if c.target != nil {
		targetCell = c.target.String()
	}
	return []string{c.What + " (`Benchmark" + c.Bench + "`)", status, orNone(c.Peer), none, targetCell, none}
}

func line(b *strings.Builder, cells []string) {
	b.WriteString("|")
	for _, c := range cells {
		b.WriteString(" " + strings.ReplaceAll(c, "|", `\|`) + " |")
	}
	b.WriteString("\n")
}

func orNone(s string) string {
	if s == "" {
		return none
	}
	return s
}

// figure is a value with its unit; a time per iteration (ns/op) reads as a
// duration.
func figure(v float64, unit string) string {
	if unit != "ns/op" {
		return num(v) + " " + unit
	}
	for _, u := range []struct {
		ns   float64
		name string
	}{{1e9, "s"}, {1e6, "ms"}, {1e3, "µs"}} {
		if math.Abs(v) >= u.ns {
			return num(v/u.ns) + " " + u.name + "/op"
		}
	}
	return num(v) + " ns/op"
}

// num formats a figure to about three significant digits, with thousands
// separated: 2,746; 780; 29.4; 1.08; 0.25; 0.0975.
func num(v float64) string {
	a := math.Abs(v)
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0):
		return strconv.FormatFloat(v, 'g', -1, 64)
	case a >= 1000:
		s := strconv.FormatFloat(math.Round(a), 'f', 0, 64)
		for i := len(s) - 3; i > 0; i -= 3 {
			s = s[:i] + "," + s[i:]
		}
		if v < 0 {
			s = "-" + s
		}
		return s
	case a >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case a >= 1:
		return strconv.FormatFloat(v, 'f', 2, 64)
	default:
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
}
