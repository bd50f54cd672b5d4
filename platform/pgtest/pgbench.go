package pgtest

import (
	"os/exec"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/platform/prereq"
)

var pgbenchTPS = regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`)

// Pgbench runs pgbench -N (TPC-B without the teller and branch updates) with
// clients connections for d on a fresh database of the test server (scale 10),
// and returns its TPS without the initial connection time: the commit-rate
// peer that benchmarks report their ratios against, measured in the same run.
// It fails the benchmark when pgbench is missing (see prereq.Pgbench; `go
// tool task deps` installs it).
func Pgbench(tb testing.TB, clients int, d time.Duration) float64 {
	tb.Helper()
	bin, err := prereq.Find(prereq.Pgbench)
	if err != nil {
		tb.Fatal("pgtest: ", err)
	}
	db := New(tb, Options{Empty: true})
	if out, err := exec.Command(bin, "-i", "-q", "-s", "10", db.URL).CombinedOutput(); err != nil {
		tb.Fatalf("pgtest: pgbench -i: %v: %s", err, out)
	}
	out, err := exec.Command(bin, "-N", "-c", strconv.Itoa(clients), "-j", "2",
		"-T", strconv.Itoa(max(1, int(d.Seconds()))), db.URL).CombinedOutput()
	if err != nil {
		tb.Fatalf("pgtest: pgbench -N: %v: %s", err, out)
	}
	m := pgbenchTPS.FindSubmatch(out)
	if m == nil {
		tb.Fatalf("pgtest: no tps in pgbench's output: %s", out)
	}
	tps, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		tb.Fatal(err)
	}
	return tps
}

var (
	pgbenchMu   sync.Mutex
	pgbenchByID = map[string]float64{}
)

// PgbenchOnce is Pgbench run once per key (a sub-benchmark's name, say) in this
// test binary: a benchmark function runs several times with growing b.N, and its
// peer should be measured once, right before the first of them.
func PgbenchOnce(tb testing.TB, key string, clients int, d time.Duration) float64 {
	tb.Helper()
	pgbenchMu.Lock()
	defer pgbenchMu.Unlock()
	if tps, ok := pgbenchByID[key]; ok {
		return tps
	}
	tps := Pgbench(tb, clients, d)
	pgbenchByID[key] = tps
	return tps
}
