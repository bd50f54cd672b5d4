// Command torture runs the capacity torture test (domain/capacity TestTorture,
// at its large size) many times over, several copies at once beside a CPU
// burner on every core, so the machine's load stays well above its core count:
// the conditions under which a rare anomaly shows. It is `go tool task
// torture`.
//
// Each copy slot has an embedded PostgreSQL cluster of its own (fsync off, as
// the test suite runs it), kept in the run's directory; the copies reach it
// through TEST_DATABASE_URL, so a failed run keeps its database. A run that
// finds a violation writes the test's forensics report (see
// domain/capacity/forensics_test.go) to the directory; the cluster, its
// server.log and the database stay there for inspection. A line per run says
// pass or fail, its time, the load average, its reservations and violations;
// the last line sums them up, and so does summary.txt.
//
//	go tool task torture -- -runs 50 -parallel 4
//	go run ./cmd/torture -runs 100 -until-fail
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/bettercompute/bettercompute/platform/embedded"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "torture:", err)
		os.Exit(1)
	}
}

type options struct {
	runs, parallel, burners int
	untilFail               bool
	dir, pkg, test, size    string
	timeout                 time.Duration
}

func parse(args []string, out io.Writer) (*options, error) {
	fs := flag.NewFlagSet("torture", flag.ContinueOnError)
	fs.SetOutput(out)
	o := &options{}
	fs.IntVar(&o.runs, "runs", 20, "how many runs of the test in all")
	fs.IntVar(&o.parallel, "parallel", 4, "how many copies run at once, each on a PostgreSQL cluster of its own")
	fs.IntVar(&o.burners, "burn", runtime.NumCPU(), "CPU burners (busy loops) running throughout; 0 for none")
	fs.BoolVar(&o.untilFail, "until-fail", false, "start no new run once one has failed")
	fs.StringVar(&o.dir, "dir", "", "where to keep the clusters, logs and reports (default .better-compute/torture/<time>)")
	fs.StringVar(&o.pkg, "pkg", "./domain/capacity", "the package of the test")
	fs.StringVar(&o.test, "run", "^TestTorture$", "the test (go test -run)")
	fs.StringVar(&o.size, "size", "large", "BETTER_COMPUTE_TORTURE: the test's size (large or small)")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Minute, "one run's time limit")
	fs.Usage = func() {
		fmt.Fprintf(out, "Usage: go tool task torture -- [flags]\n\nRuns the capacity torture test many times, several copies at once beside a CPU burner\non every core, and keeps the database, server log and a forensics report of any run\nthat finds a violation.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if o.runs < 1 || o.parallel < 1 || o.burners < 0 {
		return nil, errors.New("-runs and -parallel must be at least 1, -burn at least 0")
	}
	if o.dir == "" {
		o.dir = filepath.Join(".better-compute", "torture", time.Now().Format("20060102-150405"))
	}
	return o, nil
}

// result is one run's outcome.
type result struct {
	n            int
	pass         bool
	interrupted  bool // stopped by Ctrl-C: counted neither way
	elapsed      time.Duration
	load, peak   float64 // mean and highest 1-minute load average during the run
	reservations int
	violations   int
	log          string
}

func run(args []string, out io.Writer) error {
	o, err := parse(args, out)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := os.MkdirAll(o.dir, 0o755); err != nil {
		return err
	}
	dir, err := filepath.Abs(o.dir)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	bin := filepath.Join(dir, "torture.test")
	build := exec.CommandContext(ctx, "go", "test", "-c", "-race", "-o", bin, o.pkg)
	build.Stdout, build.Stderr = out, out
	if err := build.Run(); err != nil {
		return fmt.Errorf("building the test: %w", err)
	}

	clusters := make([]*embedded.Cluster, o.parallel)
	for i := range clusters {
		c, err := embedded.Start(ctx, embedded.Options{
			Dir: filepath.Join(dir, fmt.Sprintf("cluster-%d", i)), Fast: true,
			Settings: map[string]string{"max_connections": "300", "log_line_prefix": "%m [%p] xid=%x vxid=%v ", "log_lock_waits": "on",
				"wal_keep_size": "2GB"}, // for pg_waldump after a failure: about 100 runs of WAL
		})
		if err != nil {
			return err
		}
		clusters[i] = c
	}
	failedSlots := map[int]bool{}
	defer func() {
		for i, c := range clusters {
			_ = c.Stop()
			if !failedSlots[i] {
				_ = os.RemoveAll(c.Dir())
			}
		}
	}()

	burnCtx, stopBurn := context.WithCancel(ctx)
	defer stopBurn()
	runtime.GOMAXPROCS(max(runtime.GOMAXPROCS(0), o.burners+2))
	for range o.burners {
		go burn(burnCtx)
	}
	fmt.Fprintf(out, "torture: %d runs of %s %s (size %s), %d at once, %d CPU burners; kept in %s\n",
		o.runs, o.pkg, o.test, o.size, o.parallel, o.burners, dir)

	var (
		mu      sync.Mutex
		results []result
		next    atomic.Int64
		failed  atomic.Bool
		wg      sync.WaitGroup
	)
	for slot := range o.parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil && !(o.untilFail && failed.Load()) {
				n := int(next.Add(1))
				if n > o.runs {
					return
				}
				r := runOnce(ctx, o, bin, dir, clusters[slot], n)
				if r.interrupted {
					fmt.Fprintf(out, "run %d/%d: interrupted, not counted\n", n, o.runs)
					return
				}
				mu.Lock()
				results = append(results, r)
				if !r.pass {
					failed.Store(true)
					failedSlots[slot] = true
				}
				fmt.Fprintln(out, r.line(o.runs))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	stopBurn()

	sum := summary(results, o)
	fmt.Fprintln(out, sum)
	if err := os.WriteFile(filepath.Join(dir, "summary.txt"), []byte(sum+"\n"), 0o644); err != nil {
		return err
	}
	if failed.Load() {
		return fmt.Errorf("a run failed: its log, forensics report and cluster (data directory, server.log) are in %s", dir)
	}
	return ctx.Err()
}

var resultLine = regexp.MustCompile(`torture result: reservations=(\d+) violations=(\d+)`)

func runOnce(ctx context.Context, o *options, bin, dir string, c *embedded.Cluster, n int) result {
	r := result{n: n, log: filepath.Join(dir, fmt.Sprintf("run-%03d.log", n))}
	logFile, err := os.Create(r.log)
	if err != nil {
		return r
	}
	defer logFile.Close()
	cmd := exec.CommandContext(ctx, bin, "-test.run", o.test, "-test.count=1", "-test.v", "-test.timeout", o.timeout.String())
	cmd.Dir, _ = filepath.Abs(o.pkg) // the test's own directory, as go test runs it
	cmd.Env = append(os.Environ(), "TEST_DATABASE_URL="+c.DatabaseURL("postgres"),
		"BETTER_COMPUTE_TORTURE="+o.size, "BETTER_COMPUTE_TORTURE_DIR="+dir)
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		return r
	}
	cmd.Stderr = cmd.Stdout
	start := time.Now()
	sampler := newLoadSampler()
	defer sampler.stop()
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(logFile, "torture: %v\n", err)
		return r
	}
	sc := bufio.NewScanner(pipe)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		fmt.Fprintln(logFile, line)
		if m := resultLine.FindStringSubmatch(line); m != nil {
			r.reservations, _ = strconv.Atoi(m[1])
			r.violations, _ = strconv.Atoi(m[2])
		}
	}
	err = cmd.Wait()
	r.elapsed = time.Since(start)
	r.pass = err == nil
	r.interrupted = !r.pass && ctx.Err() != nil
	r.load, r.peak = sampler.stop()
	return r
}

func (r result) line(runs int) string {
	status := "PASS"
	if !r.pass {
		status = "FAIL (log " + r.log + ")"
	}
	return fmt.Sprintf("run %d/%d: %s in %s, load %.1f (peak %.1f), %d reservations, %d violations",
		r.n, runs, status, r.elapsed.Round(time.Second), r.load, r.peak, r.reservations, r.violations)
}

func summary(rs []result, o *options) string {
	var pass, res, viol int
	var load, peak float64
	for _, r := range rs {
		if r.pass {
			pass++
		}
		res += r.reservations
		viol += r.violations
		load += r.load
		peak = max(peak, r.peak)
	}
	if len(rs) > 0 {
		load /= float64(len(rs))
	}
	return fmt.Sprintf("torture summary: %d runs (%d passed, %d failed), %d at once, %d CPU burners on %d cores, load %.1f on average (peak %.1f), %d reservations, %d violations",
		len(rs), pass, len(rs)-pass, o.parallel, o.burners, runtime.NumCPU(), load, peak, res, viol)
}

// burn keeps one core busy until ctx ends.
func burn(ctx context.Context) {
	x := uint64(1)
	for i := 0; ; i++ {
		x = x*6364136223846793005 + 1442695040888963407
		if i%(1<<20) == 0 && ctx.Err() != nil {
			sink.Store(x)
			return
		}
	}
}

var sink atomic.Uint64

// loadSampler reads the 1-minute load average every 5 seconds.
type loadSampler struct {
	done       chan struct{}
	once       sync.Once
	mu         sync.Mutex
	sum, peak  float64
	n          int
	wg         sync.WaitGroup
	mean, high float64
}

func newLoadSampler() *loadSampler {
	s := &loadSampler{done: make(chan struct{})}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		tick := time.NewTicker(5 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-s.done:
				return
			case <-tick.C:
				if l, ok := loadavg(); ok {
					s.mu.Lock()
					s.sum += l
					s.n++
					s.peak = max(s.peak, l)
					s.mu.Unlock()
				}
			}
		}
	}()
	return s
}

// stop ends the sampling and returns the mean and the peak.
func (s *loadSampler) stop() (float64, float64) {
	s.once.Do(func() {
		close(s.done)
		s.wg.Wait()
		if s.n > 0 {
			s.mean, s.high = s.sum/float64(s.n), s.peak
		} else if l, ok := loadavg(); ok {
			s.mean, s.high = l, l
		}
	})
	return s.mean, s.high
}

func loadavg() (float64, bool) {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, false
	}
	l, err := strconv.ParseFloat(f[0], 64)
	return l, err == nil
}
