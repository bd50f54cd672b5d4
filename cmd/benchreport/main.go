// Command benchreport reads `go test -bench` output (files, or standard input)
// and prints docs/benchmarks.md's table in Markdown: for each row of rows.go,
// our figure, the peer it ran beside, the ratio, the target and whether it is
// met, under a line with the date and the machine.
//
//	go tool task bench:report                           # runs the benchmarks, then this
//	go run ./cmd/benchreport .better-compute/bench.txt  # a saved run
//	go test -run '^$' -bench . ./domain/outbox/ | go run ./cmd/benchreport -only-run
//
// Flags: -o FILE also writes the table to FILE; -only-run leaves out the rows
// whose benchmark did not run (not those that failed); -pg TEXT names the PostgreSQL server (by
// default, the version of the postgres binary the embedded cluster runs).
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/bettercompute/bettercompute/platform/embedded"
)

func main() {
	if err := runMain(os.Args[1:], os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(2)
	}
}

func runMain(args []string, stdin io.Reader, stdout io.Writer) error {
	fs := flag.NewFlagSet("benchreport", flag.ContinueOnError)
	out := fs.String("o", "", "also write the table to this file")
	onlyRun := fs.Bool("only-run", false, "leave out the rows whose benchmark did not run (not those that failed or were skipped)")
	pgVersion := fs.String("pg", "", "the PostgreSQL server the benchmarks ran on (default: postgres --version of the embedded cluster's binary)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: benchreport [-o FILE] [-only-run] [-pg TEXT] [go-test-bench-output ...]  (none or -: standard input)")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}

	// The date is now, or a saved run's: when its output was last written.
	r := newRun()
	var m machine
	files := fs.Args()
	if len(files) == 0 {
		files = []string{"-"}
	}
	for _, name := range files {
		if name == "-" {
			m.Date = time.Now()
			if err := r.parse(stdin); err != nil {
				return fmt.Errorf("standard input: %w", err)
			}
			continue
		}
		f, err := os.Open(name)
		if err != nil {
			return err
		}
		err = r.parse(f)
		if st, serr := f.Stat(); serr == nil && st.ModTime().After(m.Date) {
			m.Date = st.ModTime()
		}
		f.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}

	m.OS, m.CPU, m.Cores, m.PG = unameSM(), r.cpu, runtime.NumCPU(), *pgVersion
	if m.CPU == "" {
		m.CPU = cpuModel()
	}
	if m.PG == "" {
		m.PG = postgresVersion()
	}
	var b bytes.Buffer
	if err := report(&b, m.String(), rows, r, *onlyRun); err != nil {
		return err
	}
	if *out != "" {
		if err := os.WriteFile(*out, b.Bytes(), 0o644); err != nil {
			return err
		}
	}
	_, err := stdout.Write(b.Bytes())
	return err
}

// machine is what the header line says: when and where the benchmarks ran.
type machine struct {
	Date    time.Time
	OS, CPU string // uname -sm; the CPU's model
	Cores   int
	PG      string
}

func (m machine) String() string {
	var parts []string
	for _, p := range []string{m.OS, m.CPU} {
		if p != "" {
			parts = append(parts, p)
		}
	}
	if m.Cores > 0 {
		parts = append(parts, fmt.Sprintf("%d cores", m.Cores))
	}
	if m.PG != "" {
		parts = append(parts, m.PG)
	}
	return fmt.Sprintf("Measured %s on %s.", m.Date.UTC().Format("2006-01-02 15:04 UTC"), strings.Join(parts, ", "))
}

func unameSM() string {
	if out, err := exec.Command("uname", "-sm").Output(); err == nil {
		return strings.TrimSpace(string(out))
	}
	return runtime.GOOS + " " + runtime.GOARCH
}

// cpuModel is /proc/cpuinfo's first model name, for output without go test's
// "cpu:" line.
func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	for l := range strings.Lines(string(b)) {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// postgresVersion is "PostgreSQL 15.18 (…)" from the postgres binary the
// benchmarks' embedded cluster runs, or, with TEST_DATABASE_URL set, says the
// server is that one (its version is not read: pass -pg).
func postgresVersion() string {
	if os.Getenv("TEST_DATABASE_URL") != "" {
		return "PostgreSQL at TEST_DATABASE_URL"
	}
	dir, err := embedded.FindBin("")
	if err != nil {
		return ""
	}
	out, err := exec.Command(filepath.Join(dir, "postgres"), "--version").Output()
	if err != nil {
		return ""
	}
	return "PostgreSQL " + strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(string(out)), "postgres (PostgreSQL)"))
}
