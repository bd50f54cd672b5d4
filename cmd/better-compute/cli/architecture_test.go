package cli_test

import (
	"bytes"
	"encoding/json"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/migrations"
)

const module = "github.com/bettercompute/bettercompute/"

// listed is what go list -json says of a package.
type listed struct {
	ImportPath string
	Imports    []string
	Deps       []string
	GoFiles    []string
	Dir        string
}

// goList is `go list -json` of args, run from the module's root.
func goList(t *testing.T, args ...string) []listed {
	t.Helper()
	_, here, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(here), "..", "..", "..")
	cmd := exec.Command("go", append([]string{"list", "-json"}, args...)...)
	cmd.Dir = root
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
	case strings.HasPrefix(p, "workers"):
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
