package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// sample is go test -bench output of three packages: sub-benchmarks, a result
// that the benchmark's own output separated from its name, a failed and a
// skipped benchmark, and a benchmark of the same name in another package.
const sample = `goos: linux
goarch: amd64
pkg: github.com/bettercompute/bettercompute/workers
cpu: Intel(R) Xeon(R) Processor
BenchmarkThroughput-2   	       1	42994432305 ns/op	         0.2496 e2e/pgbench	       780.0 e2e_dirty+reconcile/s	      3125 pgbench_N_tps	      2746 fenced_reconciles/s
BenchmarkPickup-2   	2026/03/01 10:00:00 INF runtime started shards=16
took 5 2 ms
       1	30000000000 ns/op	        30.20 ours_p50_ms	        29.40 river_p50_ms	         1.027 ours/river_p50
BenchmarkDirtyVsInsertTx/InsertTx-2         	    2000	    850000 ns/op
BenchmarkDirtyVsInsertTx/Dirty-2            	    2000	   1010000 ns/op	         1.188 dirty/inserttx
--- FAIL: BenchmarkPickupPostgresRestart
    --- FAIL: BenchmarkPickupPostgresRestart/fast-2
        pickup_bench_test.go:500: no server
FAIL
exit status 1
FAIL	github.com/bettercompute/bettercompute/workers	120.5s
goos: linux
goarch: amd64
pkg: github.com/bettercompute/bettercompute/domain/capacity
cpu: Intel(R) Xeon(R) Processor
BenchmarkReserve/devices=1000-2         	    4000	   4464285 ns/op	         1.500 retries/1k	       224.0 reservations/s	         0.09676 reservations_per_pgbench_tx	      2315 pgbench_tps
BenchmarkReserve/devices=20-2           	    4000	   7092198 ns/op	       141.0 reservations/s	      2074 pgbench_tps
--- SKIP: BenchmarkVote
    bench_test.go:30: no pgbench
PASS
ok  	github.com/bettercompute/bettercompute/domain/capacity	60.1s
goos: linux
goarch: amd64
pkg: github.com/bettercompute/bettercompute/domain/outbox
cpu: Intel(R) Xeon(R) Processor
BenchmarkThroughput-2   	       1	1000 ns/op	         99 e2e/pgbench
BenchmarkAppend-2       	    1000	    350000 ns/op	       116.0 extra-µs	       158.0 peer-µs/tx	       274.0 append-µs/tx	         1.450 ratio
PASS
`

func parsed(t *testing.T, outputs ...string) *run {
	t.Helper()
	r := newRun()
	for _, o := range outputs {
		require.NoError(t, r.parse(strings.NewReader(o)))
	}
	return r
}

func TestParse(t *testing.T) {
	t.Parallel()
	r := parsed(t, sample)
	require.Equal(t, "Intel(R) Xeon(R) Processor", r.cpu)

	var got []string
	for _, res := range r.results {
		got = append(got, strings.TrimPrefix(res.pkg, "github.com/bettercompute/bettercompute/")+" "+res.name)
	}
	require.Equal(t, []string{
		"workers BenchmarkThroughput",
		"workers BenchmarkPickup",
		"workers BenchmarkDirtyVsInsertTx/InsertTx",
		"workers BenchmarkDirtyVsInsertTx/Dirty",
		"domain/capacity BenchmarkReserve/devices=1000",
		"domain/capacity BenchmarkReserve/devices=20",
		"domain/outbox BenchmarkThroughput",
		"domain/outbox BenchmarkAppend",
	}, got)

	w := "github.com/bettercompute/bettercompute/workers"
	require.Equal(t, map[string]float64{
		"ns/op": 42994432305, "e2e/pgbench": 0.2496, "e2e_dirty+reconcile/s": 780,
		"pgbench_N_tps": 3125, "fenced_reconciles/s": 2746,
	}, r.byKey[key(w, "BenchmarkThroughput")].metrics)
	// The log line that looks like a result ("5 2 ms") is not taken for one.
	require.Equal(t, map[string]float64{
		"ns/op": 30000000000, "ours_p50_ms": 30.2, "river_p50_ms": 29.4, "ours/river_p50": 1.027,
	}, r.byKey[key(w, "BenchmarkPickup")].metrics)

	c := "github.com/bettercompute/bettercompute/domain/capacity"
	require.Equal(t, map[string]string{
		key(w, "BenchmarkPickupPostgresRestart"):      "failed",
		key(w, "BenchmarkPickupPostgresRestart/fast"): "failed",
		key(c, "BenchmarkVote"):                       "skipped",
	}, r.status)
}

// A later output's result of a benchmark replaces the earlier one, in its
// place, and clears a failure.
func TestParseRerunReplaces(t *testing.T) {
	t.Parallel()
	rerun := "pkg: github.com/bettercompute/bettercompute/workers\n" +
		"BenchmarkPickupPostgresRestart/fast-2  1  9 ns/op  61 before_p99_ms  59 after5s_p99_ms\n" +
		"BenchmarkThroughput-2  1  5 ns/op  0.6 e2e/pgbench\n"
	r := parsed(t, sample, rerun)
	w := "github.com/bettercompute/bettercompute/workers"
	require.Equal(t, r.results[0], r.byKey[key(w, "BenchmarkThroughput")])
	require.Equal(t, map[string]float64{"ns/op": 5, "e2e/pgbench": 0.6}, r.results[0].metrics)
	require.Equal(t, "BenchmarkPickupPostgresRestart/fast", r.results[len(r.results)-1].name)
	require.NotContains(t, r.status, key(w, "BenchmarkPickupPostgresRestart/fast"))
}

// testRows are rows for the sample, one of each kind: a ratio the benchmark
// reports, one computed, a peer of another benchmark, a target on our figure,
// a metric renamed away, rows whose benchmark did not run, failed or was
// skipped.
var testRows = []Row{
	{Bench: "Throughput", Pkg: "workers", What: "e2e ÷ pgbench", Ours: "e2e_dirty+reconcile/s", Peer: "`pgbench -N`", PeerUnit: "pgbench_N_tps", Ratio: "e2e/pgbench", Target: ">= 0.5"},
	{Bench: "Throughput", Pkg: "workers", What: "fenced ÷ pgbench, computed", Ours: "fenced_reconciles/s", Peer: "`pgbench -N`", PeerUnit: "pgbench_N_tps", Ratio: "fenced/pgbench", Target: "> 0.8"},
	{Bench: "Throughput", Pkg: "workers", What: "renamed away", Ours: "raw_river_jobs/s", Peer: "raw River", PeerUnit: "raw_river_e2e_jobs/s", Ratio: "gone", Target: ">= 2"},
	{Bench: "Pickup", Pkg: "workers", What: "pickup p50", Ours: "ours_p50_ms", Peer: "River", PeerUnit: "river_p50_ms", Ratio: "ours/river_p50", Target: "<= 1.2"},
	{Bench: "PickupPostgresRestart", Pkg: "workers", What: "restart", Ours: "after5s_p99_ms"},
	{Bench: "DirtyVsInsertTx/Dirty", Pkg: "workers", What: "DirtyTx ÷ InsertTx", Ours: "ns/op", Peer: "InsertTx", PeerUnit: "ns/op", PeerBench: "DirtyVsInsertTx/InsertTx", Ratio: "dirty/inserttx"},
	{Bench: "Reserve", Pkg: "domain/capacity", What: "reservations", Ours: "reservations/s", Peer: "pgbench", PeerUnit: "pgbench_tps", Ratio: "reservations_per_pgbench_tx", Target: ">= 0.05"},
	{Bench: "Vote", Pkg: "domain/quorum", What: "votes", Ours: "votes/s"},
	{Bench: "Vote", What: "votes, any package", Ours: "votes/s"},
	{Bench: "Append", Pkg: "domain/outbox", What: "append", Ours: "append-µs/tx", Peer: "without", PeerUnit: "peer-µs/tx", Ratio: "ratio", Target: "<= 1.2"},
	{Bench: "Append", Pkg: "outbox", What: "append p99 on ours", Ours: "append-µs/tx", Target: "< 300"},
	{Bench: "Claim", Pkg: "domain/outbox", What: "claim", Ours: "claim-1M-µs", Target: "<= 1.5"},
}

const wantTable = `Measured 2026-03-01 10:30 UTC on Linux x86_64, Intel(R) Xeon(R) Processor, 2 cores, PostgreSQL 15.18.

| what | ours | peer | ratio | target | met? |
| --- | --- | --- | --- | --- | --- |
| e2e ÷ pgbench (` + "`BenchmarkThroughput`" + `) | 780 e2e_dirty+reconcile/s | ` + "`pgbench -N`" + `: 3,125 pgbench_N_tps | 0.25 | ≥ 0.5 | **no** |
| fenced ÷ pgbench, computed (` + "`BenchmarkThroughput`" + `) | 2,746 fenced_reconciles/s | ` + "`pgbench -N`" + `: 3,125 pgbench_N_tps | 0.879 | > 0.8 | yes |
| renamed away (` + "`BenchmarkThroughput`" + `) | — | raw River: — | — | ≥ 2 | — |
| pickup p50 (` + "`BenchmarkPickup`" + `) | 30.2 ours_p50_ms | River: 29.4 river_p50_ms | 1.03 | ≤ 1.2 | yes |
| restart (` + "`BenchmarkPickupPostgresRestart`" + `) | failed | — | — | — | — |
| DirtyTx ÷ InsertTx (` + "`BenchmarkDirtyVsInsertTx/Dirty`" + `) | 1.01 ms/op | InsertTx: 850 µs/op | 1.19 | — | — |
| reservations (` + "`BenchmarkReserve/devices=1000`" + `) | 224 reservations/s | pgbench: 2,315 pgbench_tps | 0.0968 | ≥ 0.05 | yes |
| reservations (` + "`BenchmarkReserve/devices=20`" + `) | 141 reservations/s | pgbench: 2,074 pgbench_tps | 0.068 | ≥ 0.05 | yes |
| votes (` + "`BenchmarkVote`" + `) | not run | — | — | — | — |
| votes, any package (` + "`BenchmarkVote`" + `) | skipped | — | — | — | — |
| append (` + "`BenchmarkAppend`" + `) | 274 append-µs/tx | without: 158 peer-µs/tx | 1.45 | ≤ 1.2 | **no** |
| append p99 on ours (` + "`BenchmarkAppend`" + `) | 274 append-µs/tx | — | — | < 300 | yes |
| claim (` + "`BenchmarkClaim`" + `) | not run | — | — | ≤ 1.5 | — |
`

func TestReport(t *testing.T) {
	t.Parallel()
	header := machine{
		Date: time.Date(2026, 3, 1, 11, 30, 0, 0, time.FixedZone("CET", 3600)),
		OS:   "Linux x86_64", CPU: "Intel(R) Xeon(R) Processor", Cores: 2, PG: "PostgreSQL 15.18",
	}.String()
	var b bytes.Buffer
	require.NoError(t, report(&b, header, testRows, parsed(t, sample), false))
	require.Equal(t, wantTable, b.String())

	// -only-run leaves out the rows whose benchmark did not run, not those
	// that failed or were skipped.
	b.Reset()
	require.NoError(t, report(&b, "", testRows, parsed(t, sample), true))
	var want []string
	for l := range strings.Lines(wantTable) {
		if !strings.Contains(l, "| not run |") && !strings.HasPrefix(l, "Measured") && l != "\n" {
			want = append(want, l)
		}
	}
	require.Equal(t, strings.Join(want, ""), b.String())
}

func TestReportRefusesABadRow(t *testing.T) {
	t.Parallel()
	for _, bad := range []Row{
		{Bench: "Throughput(", What: "a bad regexp", Ours: "x"},
		{Bench: "Throughput", What: "a bad target", Ours: "x", Target: "at least 2"},
		{Bench: "Throughput", What: "a bad bound", Ours: "x", Target: ">= two"},
	} {
		err := report(&bytes.Buffer{}, "", []Row{bad}, newRun(), false)
		require.ErrorContains(t, err, bad.What)
	}
}

// The seeded rows read, each says what it measures in what unit, and none
// repeats another.
func TestRows(t *testing.T) {
	t.Parallel()
	_, err := compile(rows)
	require.NoError(t, err)
	seen := map[string]bool{}
	for _, r := range rows {
		require.NotEmpty(t, r.What, "%+v", r)
		require.NotEmpty(t, r.Ours, "%+v", r)
		require.False(t, r.PeerBench != "" && r.PeerUnit == "", "%+v: PeerBench without PeerUnit", r)
		k := r.Pkg + " " + r.Bench + " " + r.Ours + " " + r.PeerUnit
		require.False(t, seen[k], "%+v repeats a row", r)
		seen[k] = true
	}
}

func TestNum(t *testing.T) {
	t.Parallel()
	for v, want := range map[float64]string{
		0: "0", 0.09676: "0.0968", 0.2496: "0.25", 1.0812: "1.08", 2.5: "2.50", 29.44: "29.4",
		780: "780", 2746.3: "2,746", 321195: "321,195", 1234567: "1,234,567", -4321: "-4,321",
	} {
		require.Equal(t, want, num(v), "%v", v)
	}
	for v, want := range map[float64]string{
		42994432305: "43.0 s/op", 264000000: "264 ms/op", 850000: "850 µs/op", 812: "812 ns/op",
	} {
		require.Equal(t, want, figure(v, "ns/op"), "%v", v)
	}
	require.Equal(t, "1.45 ratio", figure(1.45, "ratio"))
}

// The command reads saved runs, dates the table by the newest, prints it and
// writes it to -o.
func TestRunMain(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	in := filepath.Join(dir, "bench.txt")
	require.NoError(t, os.WriteFile(in, []byte(sample), 0o644))
	when := time.Date(2026, 3, 1, 10, 30, 0, 0, time.UTC)
	require.NoError(t, os.Chtimes(in, when, when))
	md := filepath.Join(dir, "bench.md")

	var out bytes.Buffer
	require.NoError(t, runMain([]string{"-o", md, "-pg", "PostgreSQL 15.18", in}, strings.NewReader(""), &out))
	header, table, ok := strings.Cut(out.String(), "\n\n")
	require.True(t, ok)
	require.Regexp(t, `^Measured 2026-03-01 10:30 UTC on .+, Intel\(R\) Xeon\(R\) Processor, \d+ cores, PostgreSQL 15\.18\.$`, header)
	require.Contains(t, table, "| pickup latency p50, insert → `Work`")
	saved, err := os.ReadFile(md)
	require.NoError(t, err)
	require.Equal(t, out.String(), string(saved))

	// Standard input, with the rows that did not run left out.
	out.Reset()
	require.NoError(t, runMain([]string{"-only-run", "-pg", "x"}, strings.NewReader(sample), &out))
	require.NotContains(t, out.String(), "not run")
	require.Contains(t, out.String(), "(`BenchmarkReserve/devices=20`)")

	require.Error(t, runMain([]string{filepath.Join(dir, "missing.txt")}, nil, &bytes.Buffer{}))
}

// TestBenchmarksPageKeepsTheTable: docs/benchmarks.md shows the table this
// command makes, one line for each row of rows (a row whose benchmark has
// sub-benchmarks, one line each), with its header, and says when and on what
// machine it was measured.
func TestBenchmarksPageKeepsTheTable(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../docs/benchmarks.md")
	require.NoError(t, err)
	page := string(b)
	require.Contains(t, page, "| what | ours | peer | ratio | target | met? |\n| --- | --- | --- | --- | --- | --- |\n")
	require.Regexp(t, `Measured \d{4}-\d{2}-\d{2} [0-9:]+ UTC on [^,]+, [^,]+, \d+ cores, PostgreSQL \d+`, page)
	var lines []string
	for _, l := range strings.Split(page, "\n") {
		if strings.HasPrefix(l, "| ") && !strings.HasPrefix(l, "| what |") && !strings.HasPrefix(l, "| --- |") {
			lines = append(lines, l)
		}
	}
	for _, r := range rows {
		found := false
		for _, l := range lines {
			if strings.HasPrefix(l, "| "+r.What+" (`Benchmark"+strings.SplitN(r.Bench, "/", 2)[0]) {
				found = true
				break
			}
		}
		require.True(t, found, "docs/benchmarks.md has no line for the row %q (%s)", r.What, r.Bench)
	}
}
