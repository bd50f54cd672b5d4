// Package prereq finds the programs from outside Go that Better Compute runs:
// the PostgreSQL server binaries (initdb, postgres) of the embedded cluster,
// pgbench (the commit-rate peer of the benchmarks), pg_dump (the schema
// check's dump of a migrated database), PgBouncer (the pooler of
// the tests that prove the pool is safe behind one) and Chromium (the browser
// of the web pages' tests). It is the one place that knows where each is
// looked for and which package installs it: the embedded cluster, the test
// helpers and the set-up check (cmd/deps, `go tool task deps`) all ask it.
//
// A Finder looks as if Root were the file system's root (the set-up check's
// tests hide a program that way) and reads the environment through Getenv.
// Its zero value looks at the real machine.
package prereq

import (
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/bettercompute/bettercompute/platform/fault"
)

// Tool is one program from outside Go.
type Tool struct {
	// Name is how messages name it.
	Name string
	// Package is the Debian (and Ubuntu) package that installs it.
	Package string
	// Env is the variable that names it explicitly, "" if none.
	Env string
	// For says what needs it.
	For string
}

// The variables that name a tool explicitly.
const (
	EnvPGBin    = "BETTER_COMPUTE_PG_BIN"
	EnvChromium = "BETTER_COMPUTE_CHROMIUM"
)

// The tools, as Finder.Find knows them.
var (
	PostgreSQL = Tool{Name: "PostgreSQL server binaries (initdb, postgres)", Package: "postgresql",
		Env: EnvPGBin, For: "the embedded cluster"}
	Pgbench = Tool{Name: "pgbench", Package: "postgresql-contrib",
		For: "the benchmarks' peer and one test"}
	PgDump = Tool{Name: "pg_dump", Package: "postgresql-client",
		For: "the checked-in schema's test (migrations/schema.sql)"}
	PgBouncer = Tool{Name: "PgBouncer", Package: "pgbouncer",
		For: "the tests behind PgBouncer"}
	Chromium = Tool{Name: "Chromium", Package: "chromium",
		Env: EnvChromium, For: "the web pages' tests"}
)

// Finder finds the tools. The zero value looks at this machine.
type Finder struct {
	// Root is the directory looked in as if it were "/"; "" is "/".
	Root string
	// Getenv reads the environment (PATH and the tools' variables); nil is
	// os.Getenv.
	Getenv func(string) string
}

func (f Finder) getenv(k string) string {
	if f.Getenv != nil {
		return f.Getenv(k)
	}
	return os.Getenv(k)
}

// abs is p (absolute) under the finder's root.
func (f Finder) abs(p string) string {
	if f.Root == "" {
		return p
	}
	return filepath.Join(f.Root, p)
}

// executable reports whether path is a file (or a link to one) with an
// execute bit.
func executable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

// onPath returns the first of names that PATH holds, as a path under the root.
// A link to Debian's pg_wrapper (postgresql-client-common's /usr/bin/pgbench,
// say) does not count: it fails unless the program it stands for is
// installed, which the other places looked at find directly.
func (f Finder) onPath(names ...string) (string, bool) {
	for _, n := range names {
		for _, dir := range filepath.SplitList(f.getenv("PATH")) {
			if dir == "" || !filepath.IsAbs(dir) {
				continue
			}
			p := f.abs(filepath.Join(dir, n))
			if !executable(p) {
				continue
			}
			if real, err := filepath.EvalSymlinks(p); err == nil && filepath.Base(real) == "pg_wrapper" {
				continue
			}
			return p, true
		}
	}
	return "", false
}

// pgBinDirs are the /usr/lib/postgresql/*/bin directories, newest major first.
func (f Finder) pgBinDirs() []string {
	dirs, _ := filepath.Glob(f.abs("/usr/lib/postgresql/*/bin"))
	sort.Slice(dirs, func(i, j int) bool { return pgMajor(dirs[i]) > pgMajor(dirs[j]) })
	return dirs
}

func pgMajor(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

func hasServer(dir string) bool {
	return executable(filepath.Join(dir, "initdb")) && executable(filepath.Join(dir, "postgres"))
}

// PGBin returns the directory that holds initdb and postgres: hint if given,
// else BETTER_COMPUTE_PG_BIN, else the directory of initdb on PATH, else the
// newest /usr/lib/postgresql/*/bin. Missing: INVALID_CONFIG, saying where it
// looked and how to install them.
func (f Finder) PGBin(hint string) (string, error) {
	if hint == "" {
		hint = f.getenv(PostgreSQL.Env)
	}
	if hint != "" {
		if hasServer(f.abs(hint)) {
			return f.abs(hint), nil
		}
		return "", fault.New(fault.InvalidConfig, "%s=%s does not hold initdb and postgres: point it at PostgreSQL's bin directory (such as /usr/lib/postgresql/15/bin), or install the server binaries with `%s` (PostgreSQL 15 or newer) and unset it",
			PostgreSQL.Env, hint, InstallCommand(false, PostgreSQL))
	}
	if p, ok := f.onPath("initdb"); ok {
		if real, err := filepath.EvalSymlinks(p); err == nil && hasServer(filepath.Dir(real)) {
			return filepath.Dir(real), nil
		}
		if hasServer(filepath.Dir(p)) {
			return filepath.Dir(p), nil
		}
	}
	for _, d := range f.pgBinDirs() {
		if hasServer(d) {
			return d, nil
		}
	}
	return "", fault.New(fault.InvalidConfig, "no PostgreSQL server binaries found (initdb and postgres): looked in %s, on PATH and under /usr/lib/postgresql/*/bin; install them with `%s` (PostgreSQL 15 or newer) or set %s",
		PostgreSQL.Env, InstallCommand(false, PostgreSQL), PostgreSQL.Env)
}

// Find returns the path of t's program (for PostgreSQL, its bin directory).
// Missing: INVALID_CONFIG, naming what to install and the command that does.
func (f Finder) Find(t Tool) (string, error) {
	switch t {
	case PostgreSQL:
		return f.PGBin("")
	case Pgbench:
		// The server's own first: the same version as the cluster it measures.
		if dir, err := f.PGBin(""); err == nil && executable(filepath.Join(dir, "pgbench")) {
			return filepath.Join(dir, "pgbench"), nil
		}
		for _, d := range f.pgBinDirs() {
			if executable(filepath.Join(d, "pgbench")) {
				return filepath.Join(d, "pgbench"), nil
			}
		}
		if p, ok := f.onPath("pgbench"); ok {
			return p, nil
		}
	case PgDump:
		// The server's own first: pg_dump refuses a server newer than itself,
		// and each major writes its dump a little differently.
		if dir, err := f.PGBin(""); err == nil && executable(filepath.Join(dir, "pg_dump")) {
			return filepath.Join(dir, "pg_dump"), nil
		}
		for _, d := range f.pgBinDirs() {
			if executable(filepath.Join(d, "pg_dump")) {
				return filepath.Join(d, "pg_dump"), nil
			}
		}
		if p, ok := f.onPath("pg_dump"); ok {
			return p, nil
		}
	case PgBouncer:
		if p, ok := f.onPath("pgbouncer"); ok {
			return p, nil
		}
		// Debian installs it in /usr/sbin, which a user's PATH may lack.
		for _, p := range []string{"/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"} {
			if executable(f.abs(p)) {
				return f.abs(p), nil
			}
		}
	case Chromium:
		if v := f.getenv(t.Env); v != "" {
			if !strings.Contains(v, "/") {
				if p, ok := f.onPath(v); ok {
					return p, nil
				}
			} else if filepath.IsAbs(v) && executable(f.abs(v)) {
				return f.abs(v), nil
			}
			return "", fault.New(fault.InvalidConfig, "%s=%s is not an executable: point it at a Chromium or Chrome binary, or unset it", t.Env, v)
		}
		if p, ok := f.onPath("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"); ok {
			return p, nil
		}
	default:
		return "", fault.New(fault.InvalidArgument, "prereq: unknown tool %q", t.Name)
	}
	return "", Missing(t)
}

// Missing is the error for t not found: INVALID_CONFIG, one line that names
// it, what needs it and the command that installs it.
func Missing(t Tool) error {
	or := ""
	if t.Env != "" && t != PostgreSQL {
		or = ", or set " + t.Env + " to one"
	}
	return fault.New(fault.InvalidConfig, "%s is not installed (%s need it): install it with `%s`%s",
		t.Name, t.For, InstallCommand(os.Geteuid() != 0, t), or)
}

// Packages are the packages that install tools, each once, in order.
func Packages(tools ...Tool) []string {
	var pkgs []string
	for _, t := range tools {
		if !slices.Contains(pkgs, t.Package) {
			pkgs = append(pkgs, t.Package)
		}
	}
	return pkgs
}

// InstallCommand is the command that installs tools on Debian or Ubuntu,
// with sudo in front when sudo is true.
func InstallCommand(sudo bool, tools ...Tool) string {
	cmd := "apt-get install -y " + strings.Join(Packages(tools...), " ")
	if sudo {
		cmd = "sudo " + cmd
	}
	return cmd
}

// Default is the Finder of this machine.
var Default Finder

// PGBin is Default.PGBin.
func PGBin(hint string) (string, error) { return Default.PGBin(hint) }

// Find is Default.Find.
func Find(t Tool) (string, error) { return Default.Find(t) }
