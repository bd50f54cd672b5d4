package cli

import (
	"context"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/bettercompute/bettercompute/platform/config"
	"github.com/bettercompute/bettercompute/platform/embedded"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/logging"
	"github.com/bettercompute/bettercompute/platform/migrate"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/telemetry"
	"github.com/bettercompute/bettercompute/workers"
)

// Session is one command's run: its configuration, logger, database and the
// cleanups to run at the end.
type Session struct {
	App       *App
	Config    *config.Config
	Env       Env
	Log       zerolog.Logger
	Dev       bool // --dev: an embedded: URL is allowed
	NoMigrate bool // --no-migrate

	cluster *embedded.Cluster
	pool    *pg.Pool
	// workerMetrics holds the worker's Prometheus metrics once StartWorker ran.
	workerMetrics *prometheus.Registry
	closers       []func()
	logReady      bool
	// traceConsole (dev --trace) adds the console exporter, as
	// OTEL_TRACES_EXPORTER=console would.
	traceConsole bool
	tracer       trace.TracerProvider // once tracerBuilt: nil when tracing is off
	tracerBuilt  bool
	// publicURL is the public listener's URL once it listens, and
	// publicOutcomes its confirmation routes' counter (confirmations.go).
	publicURL      string
	publicOutcomes *prometheus.CounterVec
}

func (s *Session) close() {
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
}

// onClose registers f to run when the command ends, after the ones registered later.
func (s *Session) onClose(f func()) { s.closers = append(s.closers, f) }

// setup validates the configuration and builds the logger.
func (s *Session) setup() error {
	if err := s.Config.Validate(); err != nil {
		return err
	}
	if !s.logReady {
		s.Log = logging.New(s.Env.Stderr, s.Config.LogLevel, s.Config.LogFormat)
		s.logReady = true
	}
	return nil
}

// Pool validates the configuration, starts the embedded cluster if the URL
// names one (only with --dev or in dev), and opens the pool.
func (s *Session) Pool(ctx context.Context) (*pg.Pool, error) {
	if s.pool != nil {
		return s.pool, nil
	}
	if err := s.setup(); err != nil {
		return nil, err
	}
	url := s.Config.DatabaseURL
	if embedded.IsURL(url) {
		if !s.Dev {
			return nil, fault.New(fault.InvalidConfig, "BETTER_COMPUTE_DATABASE_URL=%s is an embedded development cluster: pass --dev to use it, or point at a real server", url)
		}
		c, err := embedded.FromURL(ctx, url, embedded.Options{BinDir: s.Config.PGBin, Logf: func(f string, a ...any) {
			s.Log.Info().Msgf(f, a...)
		}})
		if err != nil {
			return nil, err
		}
		s.cluster = c
		s.onClose(func() {
			if err := c.Stop(); err != nil {
				s.Log.Warn().Err(err).Msg("stopping the embedded PostgreSQL")
			}
		})
		url = c.URL()
	}
	p, err := pg.Open(ctx, pg.Options{
		URL:              url,
		MaxConns:         int32(s.Config.DBMaxConns),
		StatementTimeout: s.Config.StatementTimeout,
		CancelRequests:   s.Config.DBCancelRequests,
		StatementCache:   s.Config.DBStatementCache,
	})
	if err != nil {
		return nil, err
	}
	s.pool = p
	s.onClose(p.Close)
	s.Log.Debug().Str("database", pg.RedactURL(url)).Msg("connected")
	return p, nil
}

// MigrationSet is the built-in set followed by the application's modules.
func (s *Session) MigrationSet() (*migrate.Set, error) {
	var groups []migrate.Group
	for _, m := range s.App.Modules {
		g := migrate.Group{Owner: m.Name}
		if m.Migrations != nil {
			ms, err := migrate.FromFS(m.Name, m.Migrations)
			if err != nil {
				return nil, err
			}
			g.Migrations = ms
		}
		groups = append(groups, g)
	}
	return migrate.Builtin(groups...)
}

// Migrate validates the configuration and every module (its migrations, and
// what it registers: reconcilers, sinks, dispatchers, backfills) before touching
// the store, then applies pending migrations, logging each.
func (s *Session) Migrate(ctx context.Context) (*migrate.Result, error) {
	if err := s.setup(); err != nil {
		return nil, err
	}
	set, err := s.MigrationSet()
	if err != nil {
		return nil, err
	}
	reg, err := s.Registry()
	if err != nil {
		return nil, err
	}
	p, err := s.Pool(ctx)
	if err != nil {
		return nil, err
	}
	if err := migrate.EnsureExtensions(ctx, p); err != nil {
		return nil, err
	}
	res, err := set.Apply(ctx, p, func(name string, took time.Duration) {
		s.Log.Info().Str("migration", name).Dur("took", took).Msg("applied migration")
	})
	if err != nil {
		return res, err
	}
	stored, err := migrate.InitSettings(ctx, p, s.Config.ShardCount)
	if err != nil {
		return res, err
	}
	if err := reg.Record(ctx, p); err != nil {
		return res, err
	}
	if stored != s.Config.ShardCount {
		s.Log.Warn().Int("stored", stored).Int("configured", s.Config.ShardCount).
			Msg("BETTER_COMPUTE_SHARD_COUNT differs from the shard count fixed at the first migrate; the stored one is used")
	}
	return res, nil
}

// Registry builds the worker registry from the built-in modules and the
// application's: App.Registry.
func (s *Session) Registry() (*workers.Registry, error) { return s.App.Registry() }

// Registry builds the worker registry of a's worker processes: the built-in
// modules', then a's modules', in order (an application's tests start a
// workertest runtime on it). It returns INVALID_CONFIG for a module that
// registers something invalid.
func (a App) Registry() (*workers.Registry, error) {
	reg := workers.NewRegistry()
	for _, m := range a.modules() {
		if m.Register == nil {
			continue
		}
		if err := m.Register(reg); err != nil {
			if fault.CodeOf(err) == fault.Internal {
				err = fault.Wrap(fault.InvalidConfig, err, "module %s", m.Name)
			}
			return nil, err
		}
	}
	return reg, nil
}

// modules are the built-in modules, then a's, in registration order.
func (a App) modules() []Module { return append(builtinModules(), a.Modules...) }

// TracerProvider is the process's tracer provider, built once from the OTEL_*
// variables of the command line's environment (telemetry.FromEnv), printing to
// stderr for the console exporter; nil when tracing is off. The command's end
// flushes and shuts it down, after the work it traced has stopped. It returns
// INVALID_CONFIG for a bad OTEL_* value.
func (s *Session) TracerProvider(ctx context.Context) (trace.TracerProvider, error) {
	if s.tracerBuilt {
		return s.tracer, nil
	}
	getenv := s.getenv
	if s.traceConsole {
		getenv = func(k string) string {
			v := s.getenv(k)
			if k != telemetry.EnvTracesExporter {
				return v
			}
			if v = strings.TrimSpace(v); v == "" || strings.EqualFold(v, telemetry.ExporterNone) {
				return telemetry.ExporterConsole
			}
			return v + "," + telemetry.ExporterConsole
		}
	}
	tp, shutdown, err := telemetry.FromEnv(ctx, getenv, s.Env.Stderr)
	if err != nil {
		return nil, err
	}
	s.tracer, s.tracerBuilt = tp, true
	if tp != nil {
		s.onClose(func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := shutdown(sctx); err != nil {
				s.Log.Warn().Err(err).Msg("tracing: the last spans were not all sent")
			}
		})
	}
	return tp, nil
}

// getenv reads the command line's environment (Env.Environ), or the process's
// when it has none.
func (s *Session) getenv(key string) string {
	if s.Env.Environ == nil {
		return os.Getenv(key)
	}
	v := ""
	for _, kv := range s.Env.Environ {
		if k, val, ok := strings.Cut(kv, "="); ok && k == key {
			v = val // the last one wins, as in os/exec
		}
	}
	return v
}
