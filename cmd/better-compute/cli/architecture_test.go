package cli_test

import (
	"bytes"
	"encoding/json"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/migrations"
)

const module = "github.com/bettercompute/bettercompute/"

// listed is what go list -json says of a package.
type listed struct {
	ImportPath                string
	Imports                   []string
	Deps                      []string
	GoFiles                   []string
	TestGoFiles, XTestGoFiles []string
	Dir                       string
}

// goList is `go list -json` of args, run from the module's root.
func goList(t *testing.T, args ...string) []listed {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list", "-json"}, args...)...)
	cmd.Dir = moduleRoot(t)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "go list: %s", stderr.String())
	var pkgs []listed
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listed
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else {
			require.NoError(t, err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// sourceFiles are the paths of the module's Go files (and the example
// application's), without the tests, or with them.
func sourceFiles(t *testing.T, tests bool) []string {
	t.Helper()
	var files []string
	for _, p := range goList(t, "./...", "./testdata/exampleapp") {
		names := p.GoFiles
		if tests {
			names = append(append(names, p.TestGoFiles...), p.XTestGoFiles...)
		}
		for _, f := range names {
			files = append(files, filepath.Join(p.Dir, f))
		}
	}
	return files
}

// layer is a package's layer in ARCHITECTURE.md: a package may import its own
// layer's lower rows and lower layers only.
func layer(path string) int {
	p := strings.TrimPrefix(path, module)
	switch {
	case p == "migrations", strings.HasPrefix(p, "platform/"):
		return 0
	case p == "jobs":
		return 1
	case strings.HasPrefix(p, "domain/"):
		return 2
	case p == "workers", strings.HasPrefix(p, "workers/"): // workers/internal/... too
		return 3
	case p == "cmd/better-compute/cli":
		return 4
	case p == "cmd/better-compute/demo":
		return 5
	default: // mains: cmd/better-compute, testdata apps
		return 6
	}
}

// TestImportsFollowTheLayers checks the import rules of ARCHITECTURE.md: no
// package imports a higher layer (so platform imports no jobs, domain no
// workers, nothing below cli imports cli), domain packages do not import each
// other (a package's own test helpers, such as domain/outbox/outboxtest, may
// import it), and only the better-compute binary imports the demo application.
func TestImportsFollowTheLayers(t *testing.T) {
	t.Parallel()
	for _, p := range goList(t, "./...", "./testdata/exampleapp") {
		for _, imp := range p.Imports {
			if !strings.HasPrefix(imp, module) {
				continue
			}
			if layer(imp) > layer(p.ImportPath) {
				t.Errorf("%s imports %s, a higher layer (see ARCHITECTURE.md)", p.ImportPath, imp)
			}
			// A domain package's own helpers (domain/outbox/outboxtest) build on it.
			if layer(imp) == 2 && layer(p.ImportPath) == 2 && !strings.HasPrefix(p.ImportPath, imp+"/") {
				t.Errorf("%s imports %s: domain packages are independent of each other", p.ImportPath, imp)
			}
			if imp == module+"cmd/better-compute/demo" && p.ImportPath != module+"cmd/better-compute" {
				t.Errorf("%s imports the demo application: only cmd/better-compute's main may", p.ImportPath)
			}
		}
	}
}

// TestApplicationsLinkNoDemo: an application's binary (testdata/exampleapp)
// carries none of the demo application, while the better-compute binary does.
func TestApplicationsLinkNoDemo(t *testing.T) {
	t.Parallel()
	pkgs := goList(t, "./testdata/exampleapp", "./cmd/better-compute")
	require.Len(t, pkgs, 2)
	for _, p := range pkgs {
		deps := strings.Join(p.Deps, "\n")
		links := strings.Contains(deps, module+"cmd/better-compute/demo")
		if strings.HasSuffix(p.ImportPath, "exampleapp") {
			require.False(t, links, "exampleapp links the demo application")
		} else {
			require.True(t, links, "the better-compute binary carries its demo application")
		}
	}

	// The demo migrations stay in the migrations package (landed migrations
	// never move), in migrations.Demo, which only the demo package refers to:
	// the linker leaves their text out of an application's binary.
	sql, err := fs.ReadFile(migrations.Demo, "demo/0001_counters.sql")
	require.NoError(t, err)
	marker, _, _ := bytes.Cut(sql, []byte("\n"))
	dir := t.TempDir()
	for pkg, want := range map[string]bool{
		module + "testdata/exampleapp": false,
		module + "cmd/better-compute":  true,
	} {
		bin, err := os.ReadFile(buildPkg(t, dir, pkg))
		require.NoError(t, err)
		require.Equal(t, want, bytes.Contains(bin, marker), "%s carries the demo migrations: %q", pkg, marker)
	}
}

// TestNothingRegistersFromInit: no non-test Go file of the module declares an
// init function that adds to a package-level set; the only init allowed is
// logging's (zerolog's global settings).
func TestNothingRegistersFromInit(t *testing.T) {
	t.Parallel()
	for _, p := range goList(t, "./...") {
		for _, f := range p.GoFiles {
			b, err := os.ReadFile(filepath.Join(p.Dir, f))
			require.NoError(t, err)
			if bytes.Contains(b, []byte("\nfunc init() {")) && p.ImportPath != module+"platform/logging" {
				t.Errorf("%s/%s declares func init(): build sets explicitly (see ARCHITECTURE.md)", p.ImportPath, f)
			}
		}
	}
}

// TestNoImportAliases: our packages import each other by their own names
// (ARCHITECTURE.md: a module's worker package is named so that it imports
// beside its domain package without one).
func TestNoImportAliases(t *testing.T) {
	t.Parallel()
	for _, p := range goList(t, "./...", "./testdata/exampleapp") {
		files, err := filepath.Glob(filepath.Join(p.Dir, "*.go"))
		require.NoError(t, err)
		for _, f := range files {
			parsed, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
			require.NoError(t, err)
			for _, imp := range parsed.Imports {
				path := strings.Trim(imp.Path.Value, `"`)
				if strings.HasPrefix(path, module) && imp.Name != nil && imp.Name.Name != "_" {
					t.Errorf("%s imports %s as %s: import our packages by their own names", f, path, imp.Name.Name)
				}
			}
		}
	}
}

// riverWriters are the migrations whose SQL functions write River's tables
// (ARCHITECTURE.md, "River's tables"): each is called by a statement of
// riverStatementFiles or of a fenced step, and a test checks the rows it writes
// against what River expects.
var riverWriters = map[string]bool{
	"core/0008_batch_functions.sql":      true, // compute_finish_batch, compute_finish_taken: a batch's job completed with its keys
	"core/0009_dirty_trace.sql":          true, // compute_mark_dirty: a key's reconcile job
	"workflow/0003_signal_barrier.sql":   true, // a signal's wake-up of its workflow's job
	"workflow/0004_advance_function.sql": true, // compute_workflow_advance: a step's next job
	"tenancy/0002_tenant_work.sql":       true, // compute_fetch_jobs: River's fetch, tenants round-robin; compute_mark_dirty
	"workflow/0006_tenant.sql":           true, // compute_workflow_advance, compute_workflow_start: jobs naming the tenant
}

// riverStatementFiles are the Go files that may write River's tables: the
// statements of the domain packages and the command (jobs), and those of the
// worker engine (workers/internal/riverjob), each checked against River's
// schema and defaults by its package's riverjob_test.go.
var riverStatementFiles = map[string]bool{
	"jobs/riverjob.go":                      true,
	"workers/internal/riverjob/riverjob.go": true,
}

// TestRiverTablesAreWrittenInOnePlace: Go writes River's tables only in
// riverStatementFiles, and SQL only in the functions of riverWriters.
func TestRiverTablesAreWrittenInOnePlace(t *testing.T) {
	t.Parallel()
	write := regexp.MustCompile(`(?i)\b(insert\s+into|update|delete\s+from)\s+river_[a-z_]+`)
	for _, p := range goList(t, "./...") {
		for _, f := range p.GoFiles {
			rel := strings.TrimPrefix(p.ImportPath, module) + "/" + f
			if riverStatementFiles[rel] {
				continue
			}
			b, err := os.ReadFile(filepath.Join(p.Dir, f))
			require.NoError(t, err)
			if m := write.Find(b); m != nil {
				t.Errorf("%s writes River's tables (%q): only jobs/riverjob.go and workers/internal/riverjob/riverjob.go may (ARCHITECTURE.md)", rel, m)
			}
		}
	}
	require.NoError(t, fs.WalkDir(migrations.FS, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".sql") || strings.HasPrefix(path, "jobs/") {
			return err // the jobs owner's migrations are River's own
		}
		b, err := fs.ReadFile(migrations.FS, path)
		if err != nil {
			return err
		}
		if m := write.Find(b); m != nil && !riverWriters[path] {
			t.Errorf("migration %s writes River's tables (%q): list it in riverWriters and in ARCHITECTURE.md, with the test that checks its rows", path, m)
		}
		return nil
	}))
}
