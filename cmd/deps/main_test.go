package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/platform/prereq"
)

// everything is a Debian machine's layout of what `--for test` needs.
var everything = []string{
	"/usr/lib/postgresql/15/bin/initdb", "/usr/lib/postgresql/15/bin/postgres", "/usr/lib/postgresql/15/bin/pgbench",
	"/usr/sbin/pgbouncer", "/usr/bin/chromium",
}

// buildDeps builds this command once per test binary.
func buildDeps(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "deps")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	return bin
}

// fakeRoot lays out files as one-line executables under a new directory.
func fakeRoot(t *testing.T, files []string) string {
	t.Helper()
	root := t.TempDir()
	for _, f := range files {
		p := filepath.Join(root, f)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755))
	}
	return root
}

func without(files []string, gone string) []string {
	var out []string
	for _, f := range files {
		if f != gone {
			out = append(out, f)
		}
	}
	return out
}

// TestSetUpCheckRealProcess runs the set-up check as the test task does, a
// process of its own, on machines where one program is hidden: it exits 1
// within seconds with one line that names the program and the command that
// installs it, and 0 when nothing `--for` needs is missing.
func TestSetUpCheckRealProcess(t *testing.T) {
	bin := buildDeps(t)
	run := func(root string, args ...string) (stdout, stderr string, code int, took time.Duration) {
		cmd := exec.Command(bin, append([]string{"--root", root}, args...)...)
		cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + t.TempDir()}
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		start := time.Now()
		err := cmd.Run()
		took = time.Since(start)
		if x, ok := err.(*exec.ExitError); ok {
			code = x.ExitCode()
		} else {
			require.NoError(t, err)
		}
		return o.String(), e.String(), code, took
	}

	out, errOut, code, _ := run(fakeRoot(t, everything), "--for", "test")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "deps: ready for test")

	for _, c := range []struct{ hide, name, install string }{
		{"/usr/sbin/pgbouncer", "PgBouncer", "apt-get install -y pgbouncer"},
		{"/usr/bin/chromium", "Chromium", "apt-get install -y chromium"},
		{"/usr/lib/postgresql/15/bin/pgbench", "pgbench", "apt-get install -y postgresql-contrib"},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, errOut, code, took := run(fakeRoot(t, without(everything, c.hide)), "--for", "test")
			require.Equal(t, 1, code, "stdout %q stderr %q", out, errOut)
			require.Empty(t, out)
			lines := strings.Split(strings.TrimRight(errOut, "\n"), "\n")
			require.Len(t, lines, 1, "one line: %q", errOut)
			require.True(t, strings.HasPrefix(lines[0], "deps: missing "+c.name+" ("), lines[0])
			require.Contains(t, lines[0], c.install)
			require.Less(t, took, 5*time.Second, "it fails within seconds")
			t.Logf("%s hidden: exit 1 in %v: %s", c.name, took.Round(time.Millisecond), lines[0])
		})
	}

	// Both hidden: one line that names both and one command for both.
	_, errOut, code, _ = run(fakeRoot(t, without(without(everything, "/usr/bin/chromium"), "/usr/sbin/pgbouncer")), "--for", "test")
	require.Equal(t, 1, code)
	require.Equal(t, 1, strings.Count(errOut, "\n"), errOut)
	require.Contains(t, errOut, "missing PgBouncer, Chromium")
	require.Contains(t, errOut, "apt-get install -y pgbouncer chromium`")

	// dev needs only the server binaries.
	out, errOut, code, _ = run(fakeRoot(t, without(without(everything, "/usr/bin/chromium"), "/usr/sbin/pgbouncer")), "--for", "dev")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "deps: ready for dev")
	_, errOut, code, _ = run(fakeRoot(t, nil), "--for", "dev")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "apt-get install -y postgresql`")

	_, _, code, _ = run(fakeRoot(t, nil), "--for", "prod")
	require.Equal(t, 2, code, "a bad flag")
}

// TestMissingLineSaysSudoWhenNotRoot: the command is the one the user can run.
func TestMissingLineSaysSudoWhenNotRoot(t *testing.T) {
	tools := []prereq.Tool{prereq.PgBouncer}
	require.Contains(t, missingLine(tools, true, true), "with `sudo apt-get install -y pgbouncer`")
	require.Contains(t, missingLine(tools, false, true), "with `apt-get install -y pgbouncer`")
	require.Contains(t, missingLine(tools, true, false), "with your package manager (on Debian or Ubuntu: `sudo apt-get install -y pgbouncer`)")
}

// TestGettingStartedShowsTheLine: the getting-started guide's example of the
// refusal is what a user without the rights to install sees.
func TestGettingStartedShowsTheLine(t *testing.T) {
	readme, err := os.ReadFile("../../docs/getting-started.md")
	require.NoError(t, err)
	require.Contains(t, string(readme),
		"```text\n"+missingLine([]prereq.Tool{prereq.PgBouncer, prereq.Chromium}, true, true)+"\n```")
}
