package cli_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// docFile is a block of a documentation page marked to be extracted: the line
// <!-- readme-test: PROGRAM/PATH --> right before its fence. A program's blocks
// may stand on several pages (the README shows a program, a guide its test).
var docFile = regexp.MustCompile("(?s)<!-- readme-test: (\\S+) -->\n```[a-z]*\n(.*?)\n```\n")

// docPages returns the documentation a newcomer reads, by path from the
// module's root: README.md, ARCHITECTURE.md and every page of docs/.
func docPages(t testing.TB) map[string]string {
	t.Helper()
	root := moduleRoot(t)
	paths, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	require.NoError(t, err)
	paths = append(paths, filepath.Join(root, "README.md"), filepath.Join(root, "ARCHITECTURE.md"))
	pages := map[string]string{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		rel, err := filepath.Rel(root, p)
		require.NoError(t, err)
		pages[filepath.ToSlash(rel)] = string(b)
	}
	return pages
}

// moduleRoot is the module's root directory.
func moduleRoot(t testing.TB) string {
	t.Helper()
	root, err := filepath.Abs("../../..")
	require.NoError(t, err)
	return root
}

// docPrograms returns every program the documentation marks, by name: its
// files by path (main.go, main_test.go, migrations/…), from whichever page.
func docPrograms(t testing.TB) map[string]map[string]string {
	t.Helper()
	programs := map[string]map[string]string{}
	for page, text := range docPages(t) {
		for _, b := range docFile.FindAllStringSubmatch(text, -1) {
			name, path, ok := strings.Cut(b[1], "/")
			require.True(t, ok, "%s: readme-test %s names no program directory", page, b[1])
			if programs[name] == nil {
				programs[name] = map[string]string{}
			}
			_, dup := programs[name][path]
			require.False(t, dup, "%s: %s is marked twice", page, b[1])
			programs[name][path] = b[2] + "\n"
		}
	}
	return programs
}

// TestDocsProgramsPass extracts every program the README and the guides in
// docs/ show, and runs its tests (each shows one, written with the test kit):
// what a newcomer copies compiles against this code and does what the page
// says.
func TestDocsProgramsPass(t *testing.T) {
	t.Parallel()
	programs := docPrograms(t)
	names := make([]string, 0, len(programs))
	for name := range programs {
		names = append(names, name)
	}
	sort.Strings(names)
	require.NotEmpty(t, names)
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			require.Contains(t, programs[name], "main.go", "the docs show %s's main.go", name)
			require.Contains(t, programs[name], "main_test.go", "the docs show %s's test, which the suite runs", name)
			pkg := extractDocProgram(t, name)
			cmd := exec.Command("go", "test", "-count=1", "-v", pkg)
			cmd.Dir = moduleRoot(t)
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "%s", out)
			require.Regexp(t, `(?m)^--- PASS: Test`, string(out))
			require.NotContains(t, string(out), "--- SKIP", "no test of a docs program is skipped")
		})
	}
}

// extractDocProgram writes the docs' blocks of program name (want are the
// paths it must have) inside the module, in a directory that ./... skips
// (it starts with _), and returns the program's import path.
func extractDocProgram(t *testing.T, name string, want ...string) string {
	t.Helper()
	files := docPrograms(t)[name]
	for _, path := range want {
		require.Contains(t, files, path, "the docs mark %s/%s", name, path)
	}
	root := moduleRoot(t)
	dir, err := os.MkdirTemp(root, "_readme-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	for path, body := range files {
		p := filepath.Join(dir, name, filepath.FromSlash(path))
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(body), 0o644))
	}
	return "github.com/bettercompute/bettercompute/" + filepath.Base(dir) + "/" + name
}
