// Command deps is the set-up check that `go tool task dev` and `go tool task
// test` run first: it finds the programs from outside Go that they need
// (package platform/prereq says where it looks), installs the missing ones
// with the distribution's package manager where it may, and otherwise fails
// within seconds with one line that names what to install and the command
// that does it.
//
//	go run ./cmd/deps --for test    # PostgreSQL, pgbench, PgBouncer, Chromium
//	go run ./cmd/deps --for dev     # PostgreSQL only
//
// It may install (with --install auto, the default) when apt-get is on PATH
// and it runs as root or sudo works without a password (sudo -n); it runs
// `apt-get update` once, then `apt-get install -y` of the missing packages,
// then looks again. --install never only checks. --root DIR looks as if DIR
// were the file system's root and never installs (its tests hide a program
// that way).
//
// Exit status: 0 when everything is there (it prints one line saying what it
// found), 1 when something is missing (one line on standard error), 2 for a
// bad flag.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"

	"github.com/bettercompute/bettercompute/platform/prereq"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// needs is what each use needs, in the order it is reported.
var needs = map[string][]prereq.Tool{
	"dev":  {prereq.PostgreSQL},
	"test": {prereq.PostgreSQL, prereq.Pgbench, prereq.PgBouncer, prereq.Chromium},
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("deps", flag.ContinueOnError)
	fs.SetOutput(stderr)
	use := fs.String("for", "test", "what to set up for: dev (PostgreSQL) or test (PostgreSQL, pgbench, PgBouncer, Chromium)")
	install := fs.String("install", "auto", "auto: install what is missing where allowed (root, or sudo without a password, and apt-get); never: only check")
	root := fs.String("root", "", "look as if `DIR` were the file system's root, and never install")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: deps [--for dev|test] [--install auto|never] [--root DIR]")
		fmt.Fprintln(stderr, "Finds (and where allowed installs) what `go tool task dev` and `go tool task test` need from outside Go.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	tools, ok := needs[*use]
	if !ok || fs.NArg() > 0 || (*install != "auto" && *install != "never") {
		fs.Usage()
		return 2
	}
	f := prereq.Finder{Root: *root}
	found, missing := look(f, tools)
	if len(missing) > 0 && *install == "auto" && *root == "" {
		if how, ok := installer(); ok {
			fmt.Fprintf(stdout, "deps: installing %s (%s)\n", names(missing), prereq.InstallCommand(false, missing...))
			if err := aptInstall(how, missing); err != nil {
				fmt.Fprintf(stderr, "deps: %s\n", oneLine(err.Error()))
				return 1
			}
			found, missing = look(f, tools)
		}
	}
	if len(missing) > 0 {
		fmt.Fprintln(stderr, missingLine(missing, os.Geteuid() != 0, hasAptGet()))
		return 1
	}
	fmt.Fprintf(stdout, "deps: ready for %s: %s\n", *use, strings.Join(found, "; "))
	return 0
}

// look returns, for each of tools, its name and where f found it, and the
// tools f does not find.
func look(f prereq.Finder, tools []prereq.Tool) (found []string, missing []prereq.Tool) {
	for _, t := range tools {
		if p, err := f.Find(t); err != nil {
			missing = append(missing, t)
		} else {
			found = append(found, t.Name+" "+p)
		}
	}
	return found, missing
}

func names(tools []prereq.Tool) string {
	n := make([]string, len(tools))
	for i, t := range tools {
		n[i] = t.Name
	}
	return strings.Join(n, ", ")
}

// missingLine is the one line that says what is missing, what needs it and
// how to install it.
func missingLine(missing []prereq.Tool, sudo, apt bool) string {
	why := make([]string, len(missing))
	for i, t := range missing {
		why[i] = t.For
	}
	it := "it"
	if len(missing) > 1 {
		it = "them"
	}
	cmd := prereq.InstallCommand(sudo, missing...)
	how := fmt.Sprintf("install %s with `%s`", it, cmd)
	if !apt {
		how = fmt.Sprintf("install %s with your package manager (on Debian or Ubuntu: `%s`)", it, cmd)
	}
	return fmt.Sprintf("deps: missing %s (for %s): %s, then run the command again", names(missing), strings.Join(why, "; "), how)
}

func hasAptGet() bool {
	_, err := exec.LookPath("apt-get")
	return err == nil
}

// installer returns the command prefix that runs apt-get with the rights to
// install (nothing as root, sudo -n otherwise), and whether installing is
// allowed at all.
func installer() ([]string, bool) {
	if !hasAptGet() {
		return nil, false
	}
	if os.Geteuid() == 0 {
		return nil, true
	}
	if _, err := exec.LookPath("sudo"); err != nil {
		return nil, false
	}
	if exec.Command("sudo", "-n", "true").Run() != nil {
		return nil, false
	}
	return []string{"sudo", "-n"}, true
}

// aptInstall runs apt-get update, then apt-get install of the tools'
// packages, non-interactively; apt's output is shown only when it fails.
func aptInstall(prefix []string, tools []prereq.Tool) error {
	pkgs := prereq.Packages(tools...)
	steps := [][]string{
		{"apt-get", "update", "-qq"},
		append([]string{"apt-get", "install", "-y", "-qq"}, pkgs...),
	}
	for _, s := range steps {
		argv := append(append([]string{}, prefix...), s...)
		if len(prefix) > 0 {
			// sudo resets the environment: pass the front end through it.
			argv = append(append([]string{}, prefix...), append([]string{"env", "DEBIAN_FRONTEND=noninteractive"}, s...)...)
		}
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%s failed (%v): %s", strings.Join(argv, " "), err, lastLine(out.String()))
		}
	}
	return nil
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
