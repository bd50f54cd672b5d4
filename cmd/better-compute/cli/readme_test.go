package cli_test

import (
	"os"
	"strings"
	"testing"

	"github.com/bettercompute/bettercompute/platform/config"
)

// TestDocsDocumentEveryVariable keeps the operating guide's configuration table
// in step with the code: every BETTER_COMPUTE_ variable, with its flag, is
// documented; and the README shows the two commands.
func TestDocsDocumentEveryVariable(t *testing.T) {
	b, err := os.ReadFile("../../../docs/operating.md")
	if err != nil {
		t.Fatal(err)
	}
	guide := string(b)
	b, err = os.ReadFile("../../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
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
