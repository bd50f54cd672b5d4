package cli

import (
	"context"
	"flag"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
	"github.com/riverqueue/river"

	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/web"
	"github.com/bettercompute/bettercompute/workers"
)

// serveOpts are serve's options: its flags are the configuration's (--listen,
// --auth-user, --read-only, …); it takes no arguments.
type serveOpts struct{}

func (*serveOpts) bind(*flag.FlagSet)           {}
func (*serveOpts) Validate(args []string) error { return noArgs("serve", args) }

func serveCommand() *command {
	o := &serveOpts{}
	return &command{
		name:    "serve",
		summary: "serve River UI (at /), the workflows pages (/workflows), the event stream, /healthz, /readyz and /metrics on BETTER_COMPUTE_LISTEN (loopback unless credentials are set), and the confirmation links on BETTER_COMPUTE_PUBLIC_LISTEN (if set; a listener of their own, for anyone), until interrupted",
		opts:    o,
		run:     o.run,
	}
}

func (*serveOpts) run(ctx context.Context, s *Session, _ []string) error {
	if err := s.setup(); err != nil {
		return err
	}
	// A bind that would expose River UI without credentials fails before the
	// database is touched.
	if err := web.CheckBind(ctx, s.Config.Listen, s.Config.AuthUser != ""); err != nil {
		return err
	}
	if _, err := s.Pool(ctx); err != nil {
		return err
	}
	if !s.NoMigrate {
		if _, err := s.Migrate(ctx); err != nil {
			return err
		}
	}
	stop, err := s.StartServe(ctx, nil)
	if err != nil {
		return err
	}
	<-ctx.Done()
	s.Log.Info().Msg("serve: stopping")
	stop()
	return nil
}

// StartServe starts the HTTP server of serve on BETTER_COMPUTE_LISTEN: River UI
// at /, /healthz, /readyz, /metrics and every registered Route, behind the
// guards of package web (loopback unless credentials are set, basic auth,
// read-only mode). It prints the URL on stdout. dev calls it with its worker
// Runtime, whose River client River UI then uses, and whose metrics join
// /metrics; with rt nil River UI gets an insert-only client on the session's
// pool. It does not migrate. stop shuts the server down gracefully (also done
// when ctx is cancelled) and may be called more than once.
//
// It returns INVALID_CONFIG for a non-loopback address without credentials, an
// address that cannot be bound, or a bad route.
func (s *Session) StartServe(ctx context.Context, rt *workers.Runtime) (stop func(), err error) {
	if err := s.setup(); err != nil {
		return nil, err
	}
	if err := web.CheckBind(ctx, s.Config.Listen, s.Config.AuthUser != ""); err != nil {
		return nil, err
	}
	db, err := s.Pool(ctx)
	if err != nil {
		return nil, err
	}
	set, err := s.MigrationSet()
	if err != nil {
		return nil, err
	}

	reg, err := s.serveRegistry(db)
	if err != nil {
		return nil, err
	}
	var gatherer prometheus.Gatherer = reg
	if s.workerMetrics != nil {
		gatherer = prometheus.Gatherers{reg, withoutRuntimeMetrics(s.workerMetrics)}
	}

	var client *river.Client[pgx.Tx]
	if rt != nil {
		client = rt.Client()
	}
	// The public listener first: once it listens, PublicBase is its URL,
	// which the operator's routes may show (links of the demo's mailbox).
	pub, err := s.startPublic(ctx, db)
	if err != nil {
		return nil, err
	}
	rs := routes(s, db)

	srv, err := web.Start(ctx, web.Options{
		Listen: s.Config.Listen, User: s.Config.AuthUser, Password: s.Config.AuthPassword,
		ReadOnly: s.Config.ReadOnly, Pool: db, Client: client, Migrations: set,
		Metrics: gatherer, Routes: rs, Log: s.Log,
	})
	if err != nil {
		if pub != nil {
			_ = pub.Shutdown(context.Background())
		}
		return nil, err
	}
	mode := ""
	if s.Config.ReadOnly {
		mode = " (read-only)"
	}
	fmt.Fprintf(s.Env.Stdout, "River UI: %s%s\n", srv.URL(), mode)
	if pub != nil {
		fmt.Fprintf(s.Env.Stdout, "Confirmation links: %sconfirm/…\n", pub.URL())
	}
	stop = func() {
		if pub != nil {
			if err := pub.Shutdown(context.Background()); err != nil {
				s.Log.Warn().Err(err).Msg("serve: shutdown of the public listener")
			}
		}
		if err := srv.Shutdown(context.Background()); err != nil {
			s.Log.Warn().Err(err).Msg("serve: shutdown")
		}
	}
	s.onClose(stop)
	return stop, nil
}

// serveRegistry is serve's Prometheus registry: the collectors that read the
// database at each scrape (jobs and queues, shards, and each module's own:
// Module.Metrics of the built-in modules, the outbox, backfills and
// workflows, then the application's) and the Go runtime and process families.
func (s *Session) serveRegistry(db *pg.Pool) (*prometheus.Registry, error) {
	app, err := s.Registry()
	if err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(workers.NewQueueCollector(db), workers.NewWorkCollector(db), s.confirmationOutcomes(),
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, m := range s.App.modules() {
		if m.Metrics == nil {
			continue
		}
		cs, err := m.Metrics(db, app)
		if err != nil {
			return nil, err
		}
		for _, c := range cs {
			if err := reg.Register(c); err != nil {
				return nil, fault.Wrap(fault.InvalidConfig, err, "module %s: a metrics collector", m.Name)
			}
		}
	}
	return reg, nil
}

// withoutRuntimeMetrics drops the Go runtime and process families from the
// worker's registry (registered there when the worker serves its own /metrics),
// since serve's registry already has them and Gatherers refuses duplicates.
func withoutRuntimeMetrics(g prometheus.Gatherer) prometheus.Gatherer {
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		mfs, err := g.Gather()
		out := mfs[:0]
		for _, mf := range mfs {
			if n := mf.GetName(); strings.HasPrefix(n, "go_") || strings.HasPrefix(n, "process_") {
				continue
			}
			out = append(out, mf)
		}
		return out, err
	})
}
