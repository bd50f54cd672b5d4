package cli_test

import (
	"bytes"
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/cmd/better-compute/cli"
)

// The documentation's checks: a page (README.md, ARCHITECTURE.md, docs/*.md)
// links only to files and headings that exist, names only Go symbols of ours
// that exist, and shows only command lines that our binaries and the Taskfile
// accept. One source for each fact needs the links between them to hold.

var (
	mdLink      = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	mdHeading   = regexp.MustCompile(`^(#{1,6})\s+(.*?)\s*#*\s*$`)
	mdCodeSpan  = regexp.MustCompile("`[^`\n]+`")
	goSymbol    = regexp.MustCompile(`\b([a-z][a-z0-9]*)\.([A-Z][A-Za-z0-9_]*)(?:\.([A-Z][A-Za-z0-9_]*))?`)
	fenceLine   = regexp.MustCompile("^```")
	taskName    = regexp.MustCompile(`(?m)^  ([a-z][a-z:]*):\s*$`)
	verbsUsage  = regexp.MustCompile(`(?m)^Usage: \S+ \S+ \[flags\] (.*\|.*)$`)
	commandName = regexp.MustCompile(`Name:\s+"([a-z][a-z0-9-]*)"`)
)

// prose splits a page into its prose lines (outside fenced blocks) and its
// fenced blocks (info string, body).
func prose(text string) (lines []string, blocks [][2]string) {
	var in bool
	var info string
	var body []string
	for _, l := range strings.Split(text, "\n") {
		switch {
		case fenceLine.MatchString(l) && !in:
			in, info, body = true, strings.TrimPrefix(l, "```"), nil
		case fenceLine.MatchString(l) && in:
			in = false
			blocks = append(blocks, [2]string{info, strings.Join(body, "\n")})
		case in:
			body = append(body, l)
		default:
			lines = append(lines, l)
		}
	}
	return lines, blocks
}

// anchors are a page's headings as GitHub links them: lower case, spaces as
// hyphens, punctuation dropped, a repeated heading suffixed -1, -2, ….
func anchors(text string) map[string]bool {
	lines, _ := prose(text)
	seen := map[string]int{}
	out := map[string]bool{}
	for _, l := range lines {
		m := mdHeading.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(m[2]) {
			switch {
			case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteRune('-')
			}
		}
		slug := b.String()
		if n := seen[slug]; n > 0 {
			out[slug+"-"+strconv.Itoa(n)] = true
		} else {
			out[slug] = true
		}
		seen[slug]++
	}
	return out
}

// TestDocsLinksResolve: every relative link of a page names a file that exists,
// and every #anchor a heading of its page.
func TestDocsLinksResolve(t *testing.T) {
	root := moduleRoot(t)
	pages := docPages(t)
	checked := 0
	for page, text := range pages {
		lines, _ := prose(text)
		for _, l := range lines {
			l = mdCodeSpan.ReplaceAllString(l, "")
			for _, m := range mdLink.FindAllStringSubmatch(l, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				checked++
				file, anchor, _ := strings.Cut(target, "#")
				rel := page
				if file != "" {
					rel = path.Join(path.Dir(page), file)
					if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(rel))); err != nil {
						t.Errorf("%s: link %s: %s does not exist", page, target, rel)
						continue
					}
				}
				if anchor == "" || !strings.HasSuffix(rel, ".md") {
					continue
				}
				body, ok := pages[rel]
				if !ok {
					b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(rel)))
					require.NoError(t, err)
					body = string(b)
				}
				if !anchors(body)[anchor] {
					t.Errorf("%s: link %s: %s has no heading #%s", page, target, rel, anchor)
				}
			}
		}
	}
	require.Greater(t, checked, 50, "the pages link to each other")
}

// goNames returns, by package name, the exported names of the module's
// packages (tests and extracted programs aside): top-level names, and
// Type.Method and Type.Field.
func goNames(t *testing.T) map[string]map[string]bool {
	t.Helper()
	names := map[string]map[string]bool{}
	fset := token.NewFileSet()
	for _, p := range sourceFiles(t, false) {
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		require.NoError(t, err)
		set := names[f.Name.Name]
		if set == nil {
			set = map[string]bool{}
			names[f.Name.Name] = set
		}
		for _, decl := range f.Decls {
			addNames(set, decl)
		}
	}
	delete(names, "main")
	return names
}

// addNames adds decl's names to set: a function, a type with its fields and
// interface methods, a method as Type.Method, a var or a const.
func addNames(set map[string]bool, decl ast.Decl) {
	switch d := decl.(type) {
	case *ast.FuncDecl:
		if d.Recv == nil {
			set[d.Name.Name] = true
			return
		}
		typ := d.Recv.List[0].Type
		for {
			switch x := typ.(type) {
			case *ast.StarExpr:
				typ = x.X
				continue
			case *ast.IndexExpr:
				typ = x.X
				continue
			case *ast.IndexListExpr:
				typ = x.X
				continue
			}
			break
		}
		if id, ok := typ.(*ast.Ident); ok {
			set[id.Name+"."+d.Name.Name] = true
		}
	case *ast.GenDecl:
		for _, s := range d.Specs {
			switch s := s.(type) {
			case *ast.TypeSpec:
				set[s.Name.Name] = true
				var members []*ast.Field
				switch x := s.Type.(type) {
				case *ast.StructType:
					members = x.Fields.List
				case *ast.InterfaceType:
					members = x.Methods.List
				}
				for _, m := range members {
					for _, n := range m.Names {
						set[s.Name.Name+"."+n.Name] = true
					}
				}
			case *ast.ValueSpec:
				for _, n := range s.Names {
					set[n.Name] = true
				}
			}
		}
	}
}

// TestDocsNameOnlyRealSymbols: a page that names pkg.Name (or pkg.Type.Member)
// of one of our packages names something that exists, in its prose, its code
// spans and its code blocks alike.
func TestDocsNameOnlyRealSymbols(t *testing.T) {
	names := goNames(t)
	checked := 0
	for page, text := range docPages(t) {
		for _, m := range goSymbol.FindAllStringSubmatch(text, -1) {
			set, ours := names[m[1]]
			if !ours {
				continue
			}
			checked++
			switch {
			case !set[m[2]]:
				t.Errorf("%s: %s.%s: package %s has no %s", page, m[1], m[2], m[1], m[2])
			case m[3] != "" && !set[m[2]+"."+m[3]] && typeLike(set, m[2]):
				t.Errorf("%s: %s.%s.%s: %s has no %s", page, m[1], m[2], m[3], m[2], m[3])
			}
		}
	}
	require.Greater(t, checked, 100, "the pages name our symbols")
}

// typeLike reports whether name has members in set (it is a type).
func typeLike(set map[string]bool, name string) bool {
	for k := range set {
		if strings.HasPrefix(k, name+".") {
			return true
		}
	}
	return false
}

// TestDocsCommandsAreReal: every command line a page shows for one of our
// binaries (better-compute, or a program the docs build) names a command the
// binary has, with flags that command takes; and every `go tool task NAME` a
// task of the Taskfile.
func TestDocsCommandsAreReal(t *testing.T) {
	root := moduleRoot(t)
	taskfile, err := os.ReadFile(filepath.Join(root, "Taskfile.yml"))
	require.NoError(t, err)
	tasks := map[string]bool{}
	for _, m := range taskName.FindAllStringSubmatch(string(taskfile), -1) {
		tasks[m[1]] = true
	}
	require.Contains(t, tasks, "test")

	// The docs' programs, and the verbs of their own.
	programs := map[string]map[string]bool{"better-compute": {}}
	for name, files := range docPrograms(t) {
		programs[name] = map[string]bool{}
		for _, m := range commandName.FindAllStringSubmatch(files["main.go"], -1) {
			programs[name][m[1]] = true
		}
	}
	helps := map[string]string{}
	help := func(verb string) (string, bool) {
		if h, ok := helps[verb]; ok {
			return h, h != ""
		}
		var out bytes.Buffer
		code := cli.Run(context.Background(), cli.App{Name: "better-compute"}, []string{verb, "--help"},
			cli.Env{Stdout: &out, Stderr: &out})
		if code != 0 {
			helps[verb] = ""
			return "", false
		}
		helps[verb] = out.String()
		return out.String(), true
	}

	checked := 0
	for page, text := range docPages(t) {
		var lines []string
		_, blocks := prose(text)
		for _, b := range blocks {
			for _, l := range strings.Split(b[1], "\n") {
				switch {
				case b[0] == "sh" || b[0] == "bash":
					lines = append(lines, l)
				case strings.HasPrefix(l, "$ "):
					lines = append(lines, strings.TrimPrefix(l, "$ "))
				}
			}
		}
		for _, l := range lines {
			if i := strings.Index(l, " #"); i >= 0 {
				l = l[:i]
			}
			for _, cmd := range splitShell(l) {
				if len(cmd) >= 4 && cmd[0] == "go" && cmd[1] == "tool" && cmd[2] == "task" {
					checked++
					if !tasks[cmd[3]] {
						t.Errorf("%s: `%s`: the Taskfile has no task %s", page, strings.Join(cmd, " "), cmd[3])
					}
					continue
				}
				prog := strings.TrimPrefix(cmd[0], "./")
				own, ok := programs[prog]
				if !ok || len(cmd) < 2 {
					continue
				}
				var words []string // the positional words
				for _, a := range cmd[1:] {
					if !strings.HasPrefix(a, "-") && !strings.HasPrefix(a, "[") {
						words = append(words, a)
					}
				}
				verb := ""
				if len(words) > 0 {
					verb = words[0]
				}
				if verb == "" || own[verb] {
					continue
				}
				checked++
				h, ok := help(verb)
				if !ok {
					t.Errorf("%s: `%s`: %s has no command %s", page, strings.Join(cmd, " "), prog, verb)
					continue
				}
				// A command of verbs (workflow list, db start): the next word is one.
				if usage := verbsUsage.FindStringSubmatch(h); usage != nil && len(words) > 1 {
					if !regexp.MustCompile(`(^|\| )` + regexp.QuoteMeta(words[1]) + `( |$)`).MatchString(usage[1]) {
						t.Errorf("%s: `%s`: %s %s has no verb %s (%s)", page, strings.Join(cmd, " "), prog, verb, words[1], usage[1])
					}
				}
				for _, a := range cmd[1:] {
					a = strings.Trim(a, "[]|")
					if !strings.HasPrefix(a, "--") || a == "--" {
						continue
					}
					flag, _, _ := strings.Cut(a, "=")
					if a == "--help" {
						continue
					}
					if !regexp.MustCompile(`(^|\s)` + regexp.QuoteMeta(flag) + `(\s|$)`).MatchString(h) {
						t.Errorf("%s: `%s`: %s %s takes no %s", page, strings.Join(cmd, " "), prog, verb, flag)
					}
				}
			}
		}
	}
	require.Greater(t, checked, 30, "the pages show our commands")
	names := make([]string, 0, len(programs))
	for n := range programs {
		names = append(names, n)
	}
	sort.Strings(names)
	t.Logf("checked %d command lines of %v and the Taskfile", checked, names)
}

// splitShell splits a shell line into its simple commands' words: at ;, &&,
// ||, |, &, $( and ), with quotes kept whole.
func splitShell(l string) [][]string {
	var cmds [][]string
	var cur []string
	var word strings.Builder
	var quote rune
	flushWord := func() {
		if word.Len() > 0 {
			cur = append(cur, word.String())
			word.Reset()
		}
	}
	flushCmd := func() {
		flushWord()
		// Drop leading assignments (VAR=value cmd).
		for len(cur) > 0 && strings.Contains(cur[0], "=") && !strings.HasPrefix(cur[0], "-") {
			cur = cur[1:]
		}
		if len(cur) > 0 && (cur[0] == "export" || cur[0] == "exec" || cur[0] == "time") {
			cur = cur[1:]
		}
		if len(cur) > 0 {
			cmds = append(cmds, cur)
		}
		cur = nil
	}
	rs := []rune(l)
	for i := 0; i < len(rs); i++ {
		r := rs[i]
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			}
			word.WriteRune(r)
		case r == '\'' || r == '"':
			quote = r
			word.WriteRune(r)
		case r == '$' && i+1 < len(rs) && rs[i+1] == '(':
			flushCmd()
			i++
		case r == ';' || r == '|' || r == '&' || r == ')' || r == '(':
			flushCmd()
		case r == ' ' || r == '\t':
			flushWord()
		default:
			word.WriteRune(r)
		}
	}
	flushCmd()
	return cmds
}
