package cli_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/bettercompute/bettercompute/platform/config"
)

// TestDocsDocumentEveryVariable keeps the operating guide's configuration table
// in step with the code: every BETTER_COMPUTE_ variable, with its flag, is
// documented; and the README shows the two commands.
func TestDocsDocumentEveryVariable(t *testing.T) {
	pages := docPages(t)
	guide, readme := pages["docs/operating.md"], pages["README.md"]
	c, err := config.Load(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range c.Fields() {
		if !strings.Contains(guide, "`"+f.Env+"`") || !strings.Contains(guide, "`--"+f.Flag+"`") {
			t.Errorf("docs/operating.md does not document %s (--%s)", f.Env, f.Flag)
		}
	}
	for _, cmd := range []string{"go tool task dev", "go tool task test"} {
		if !strings.Contains(readme, cmd) {
			t.Errorf("README.md does not show %q", cmd)
		}
	}
}

// TestDocsNameOnlyRealVariables: every BETTER_COMPUTE_ variable a page names
// is one the configuration reads, or one a test or task reads (named in the
// code or the Taskfile): a renamed variable leaves no stale doc.
func TestDocsNameOnlyRealVariables(t *testing.T) {
	c, err := config.Load(nil)
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, f := range c.Fields() {
		known[f.Env] = true
	}
	var code strings.Builder
	for _, p := range append(sourceFiles(t, true), filepath.Join(moduleRoot(t), "Taskfile.yml")) {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		code.Write(b)
	}
	variable := regexp.MustCompile(`BETTER_COMPUTE_[A-Z0-9_]*[A-Z0-9]`)
	n := 0
	for page, text := range docPages(t) {
		for _, v := range variable.FindAllString(text, -1) {
			n++
			if !known[v] && !strings.Contains(code.String(), `"`+v+`"`) && !strings.Contains(code.String(), v+`=`) {
				t.Errorf("%s names %s, which the configuration does not read", page, v)
			}
		}
	}
	if n < 50 {
		t.Errorf("the pages name %d variables; expected the configuration guide's table at least", n)
	}
}

// TestReadmeIsShort: the README is the front door, at most 400 lines; the
// guides in docs/ hold the rest.
func TestReadmeIsShort(t *testing.T) {
	if n := strings.Count(docPages(t)["README.md"], "\n"); n > 400 {
		t.Errorf("README.md has %d lines; keep it to 400 and move the rest to a guide in docs/", n)
	}
}
