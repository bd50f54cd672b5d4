package cli_test

import (
	"os"
	"strings"
	"testing"

	"github.com/bettercompute/bettercompute/platform/config"
)

// TestReadmeDocumentsEveryVariable keeps the README's configuration table in step
// with the code: every BETTER_COMPUTE_ variable, with its flag, is documented,
// and the two set-up commands are shown.
func TestReadmeDocumentsEveryVariable(t *testing.T) {
	b, err := os.ReadFile("../../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	c, err := config.Load(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range c.Fields() {
		if !strings.Contains(readme, "`"+f.Env+"`") || !strings.Contains(readme, "`--"+f.Flag+"`") {
			t.Errorf("README.md does not document %s (--%s)", f.Env, f.Flag)
		}
	}
	for _, cmd := range []string{"go tool task dev", "go tool task test"} {
		if !strings.Contains(readme, cmd) {
			t.Errorf("README.md does not show %q", cmd)
		}
	}
}
