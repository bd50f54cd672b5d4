package prereq_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/prereq"
)

// fakeRoot makes a directory laid out like a Debian machine with the given
// executables (paths from "/"), each a one-line shell script, and returns it.
func fakeRoot(t *testing.T, files ...string) string {
	t.Helper()
	root := t.TempDir()
	for _, f := range files {
		p := filepath.Join(root, f)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755))
	}
	return root
}

func finder(root string, env map[string]string) prereq.Finder {
	return prereq.Finder{Root: root, Getenv: func(k string) string {
		if k == "PATH" {
			if v, ok := env[k]; ok {
				return v
			}
			return "/usr/local/bin:/usr/bin:/bin"
		}
		return env[k]
	}}
}

// TestFindsEachToolWhereDebianPutsIt: the server binaries in the newest
// /usr/lib/postgresql/N/bin, pgbench and pg_dump beside them, PgBouncer in /usr/sbin
// (off a user's PATH), Chromium on PATH.
func TestFindsEachToolWhereDebianPutsIt(t *testing.T) {
	root := fakeRoot(t,
		"/usr/lib/postgresql/15/bin/initdb", "/usr/lib/postgresql/15/bin/postgres", "/usr/lib/postgresql/15/bin/pgbench", "/usr/lib/postgresql/15/bin/pg_dump",
		"/usr/lib/postgresql/16/bin/initdb", "/usr/lib/postgresql/16/bin/postgres", "/usr/lib/postgresql/16/bin/pgbench", "/usr/lib/postgresql/16/bin/pg_dump",
		"/usr/sbin/pgbouncer", "/usr/bin/chromium")
	f := finder(root, nil)
	bin, err := f.Find(prereq.PostgreSQL)
	require.NoError(t, err)
	require.Equal(t, filepath.Join(root, "/usr/lib/postgresql/16/bin"), bin, "the newest major")
	p, err := f.Find(prereq.Pgbench)
	require.NoError(t, err)
	require.Equal(t, filepath.Join(root, "/usr/lib/postgresql/16/bin/pgbench"), p, "the server's own pgbench")
	p, err = f.Find(prereq.PgDump)
	require.NoError(t, err)
	require.Equal(t, filepath.Join(root, "/usr/lib/postgresql/16/bin/pg_dump"), p, "the server's own pg_dump")
	p, err = f.Find(prereq.PgBouncer)
	require.NoError(t, err)
	require.Equal(t, filepath.Join(root, "/usr/sbin/pgbouncer"), p)
	p, err = f.Find(prereq.Chromium)
	require.NoError(t, err)
	require.Equal(t, filepath.Join(root, "/usr/bin/chromium"), p)

	// The variables win.
	f = finder(root, map[string]string{prereq.EnvPGBin: "/usr/lib/postgresql/15/bin"})
	bin, err = f.Find(prereq.PostgreSQL)
	require.NoError(t, err)
	require.Equal(t, filepath.Join(root, "/usr/lib/postgresql/15/bin"), bin)
}

// TestMissingNamesThePackage: each tool missing is INVALID_CONFIG on one line
// that names the package installing it; a pgbench or pg_dump that is only Debian's
// pg_wrapper (postgresql-client-common without a server) does not count.
func TestMissingNamesThePackage(t *testing.T) {
	root := fakeRoot(t, "/usr/share/postgresql-common/pg_wrapper")
	require.NoError(t, os.MkdirAll(filepath.Join(root, "usr/bin"), 0o755))
	require.NoError(t, os.Symlink("../share/postgresql-common/pg_wrapper", filepath.Join(root, "usr/bin/pgbench")))
	require.NoError(t, os.Symlink("../share/postgresql-common/pg_wrapper", filepath.Join(root, "usr/bin/pg_dump")))
	f := finder(root, nil)
	for _, c := range []struct {
		tool prereq.Tool
		pkg  string
	}{
		{prereq.PostgreSQL, "apt-get install -y postgresql"},
		{prereq.Pgbench, "apt-get install -y postgresql-contrib"},
		{prereq.PgDump, "apt-get install -y postgresql-client"},
		{prereq.PgBouncer, "apt-get install -y pgbouncer"},
		{prereq.Chromium, "apt-get install -y chromium"},
	} {
		_, err := f.Find(c.tool)
		require.Error(t, err, c.tool.Name)
		require.Equal(t, fault.InvalidConfig, fault.CodeOf(err), c.tool.Name)
		require.Contains(t, err.Error(), c.pkg)
		require.NotContains(t, err.Error(), "\n")
	}

	f = finder(root, map[string]string{prereq.EnvChromium: "/opt/nothing/chrome"})
	_, err := f.Find(prereq.Chromium)
	require.ErrorContains(t, err, prereq.EnvChromium+"=/opt/nothing/chrome is not an executable")
}

func TestInstallCommandNamesEachPackageOnce(t *testing.T) {
	require.Equal(t, "sudo apt-get install -y pgbouncer chromium",
		prereq.InstallCommand(true, prereq.PgBouncer, prereq.Chromium, prereq.PgBouncer))
	require.Equal(t, []string{"postgresql", "postgresql-contrib"}, prereq.Packages(prereq.PostgreSQL, prereq.Pgbench))
}
