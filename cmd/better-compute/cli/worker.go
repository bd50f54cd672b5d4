package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/migrate"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/workers"
)

// workerOpts are worker's options: its flags are the configuration's
// (--shards, --worker-id, …); it takes no arguments.
type workerOpts struct{}

func (*workerOpts) bind(*flag.FlagSet) {}
func (*workerOpts) Validate(args []string) error {
	if len(args) > 0 {
		return usageErr("worker takes no arguments (use --shards), got %q", args)
	}
	return nil
}

func workerCommand() *command {
	o := &workerOpts{}
	return &command{
		name:    "worker",
		summary: "lease and work the given shards' queues (--shards, default all) under a stable identity (--worker-id: a restart takes its shards back at once); SIGTERM stops gracefully",
		opts:    o,
		run:     o.run,
	}
}

// run runs until interrupted, or until another process took over this
// worker's identity (CONFLICT).
func (*workerOpts) run(ctx context.Context, s *Session, _ []string) error {
	rt, err := s.StartWorker(ctx)
	if err != nil {
		return err
	}
	select {
	case <-ctx.Done():
	case <-rt.Done(): // another process took over this identity
	}
	if err := rt.Stop(context.Background()); err != nil {
		return err
	}
	return rt.Err()
}

// ShardSet parses a shard set: "all", a range "0-7", a list "1,3,5", or a mix
// "0-3,8". It returns INVALID_CONFIG for anything malformed or out of range.
func ShardSet(spec string, count int) ([]int, error) {
	bad := func(format string, args ...any) error {
		return fault.New(fault.InvalidConfig, "--shards %q: %s", spec, fmt.Sprintf(format, args...))
	}
	spec = strings.TrimSpace(spec)
	if spec == "" {
		return nil, bad("empty; want all, a range 0-7, a list 1,3,5, or a mix")
	}
	if spec == "all" {
		out := make([]int, count)
		for i := range out {
			out[i] = i
		}
		return out, nil
	}
	var out []int
	for _, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return nil, bad("%q is not a shard number or range", part)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return nil, bad("%q is not a range low-high", part)
			}
		}
		if b >= count {
			return nil, bad("shard %d is out of range: this deployment has %d shards (0-%d)", b, count, count-1)
		}
		for i := a; i <= b; i++ {
			if !slices.Contains(out, i) {
				out = append(out, i)
			}
		}
	}
	slices.Sort(out)
	return out, nil
}

// StartWorker migrates (unless --no-migrate), builds the registry and starts a
// worker Runtime on the configured shards. The runtime is stopped by the caller.
func (s *Session) StartWorker(ctx context.Context) (*workers.Runtime, error) {
	if err := s.setup(); err != nil {
		return nil, err
	}
	// Malformed shard sets fail before anything starts; the range is checked
	// against the stored shard count once connected.
	if _, err := ShardSet(s.Config.Shards, 4096); err != nil {
		return nil, err
	}
	tp, err := s.TracerProvider(ctx) // a bad OTEL_* value fails here, before anything starts
	if err != nil {
		return nil, err
	}
	reg, err := s.Registry()
	if err != nil {
		return nil, err
	}
	db, err := s.Pool(ctx)
	if err != nil {
		return nil, err
	}
	if !s.NoMigrate {
		if _, err := s.Migrate(ctx); err != nil {
			return nil, err
		}
	}
	count, err := migrate.ShardCount(ctx, db)
	if err != nil {
		return nil, err
	}
	if count != s.Config.ShardCount {
		s.Log.Warn().Int("stored", count).Int("configured", s.Config.ShardCount).Msg("BETTER_COMPUTE_SHARD_COUNT differs from the stored shard count; using the stored one")
	}
	shards, err := ShardSet(s.Config.Shards, count)
	if err != nil {
		return nil, err
	}
	promReg := prometheus.NewRegistry()
	metrics := workers.NewMetrics(promReg)
	rt, err := workers.Start(ctx, workers.Options{
		Pool: db, Log: s.Log, Registry: reg, Shards: shards, Work: true, Identity: s.Config.WorkerID,
		Heartbeat: s.Config.Heartbeat, MissedBeats: s.Config.MissedBeats,
		LeaseTTL: s.Config.LeaseTTL, LeaseRenew: s.Config.LeaseRenew, StopGrace: s.Config.StopGrace,
		PollInterval: s.Config.PollInterval, ResyncEvery: s.Config.ResyncEvery,
		WorkersPerShard: s.Config.WorkersPerShard, MaintenanceWorkers: s.Config.MaintenanceWorkers,
		Secrets: s.secrets(), Metrics: metrics, TracerProvider: tp,
	})
	if err != nil {
		return nil, err
	}
	if s.Config.MetricsListen != "" {
		promReg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		if err := s.serveMetrics(ctx, promReg); err != nil {
			_ = rt.Stop(context.Background())
			return nil, err
		}
	}
	s.workerMetrics = promReg
	return rt, nil
}

// secrets are strings never to store in a job row or print.
func (s *Session) secrets() []string {
	out := pg.Secrets(s.Config.DatabaseURL)
	if s.Config.AuthPassword != "" {
		out = append(out, s.Config.AuthPassword)
	}
	return out
}

func (s *Session) serveMetrics(ctx context.Context, reg *prometheus.Registry) error {
	ln, err := net.Listen("tcp", s.Config.MetricsListen)
	if err != nil {
		return fault.Wrap(fault.InvalidConfig, err, "BETTER_COMPUTE_METRICS_LISTEN=%s", s.Config.MetricsListen)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.Log.Error().Err(err).Msg("metrics server")
		}
	}()
	s.onClose(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	})
	s.Log.Info().Str("listen", ln.Addr().String()).Msg("worker metrics on /metrics")
	return nil
}
