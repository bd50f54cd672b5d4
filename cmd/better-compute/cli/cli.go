// Package cli is the better-compute binary as a library: an application's main
// hands its modules to Main and gets every command (migrate, worker, serve,
// doctor, dev, and the operator verbs) with them. The built-in binary,
// cmd/better-compute, is Main with no application modules.
//
//	func main() {
//		cli.Main(cli.App{Modules: []cli.Module{inventory.Module()}})
//	}
//
// Every command is a struct with its flags and a Run method, so tests call Run
// with a configuration instead of spawning the binary; Run (the function) is the
// whole command line, with its own output streams and environment.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/bettercompute/bettercompute/platform/config"
	"github.com/bettercompute/bettercompute/platform/embedded"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/logging"
	"github.com/bettercompute/bettercompute/platform/migrate"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/workers"
)

// App is an application built on Better Compute.
type App struct {
	// Name is the binary's name in help output (default better-compute).
	Name string
	// Modules are the application's modules, in registration order: their
	// migrations run after the built-in ones, in this order.
	Modules []Module
}

// Module is one application module.
type Module struct {
	// Name is the module's migration owner: a lowercase identifier, not core,
	// river or a built-in module's name.
	Name string
	// Migrations holds the module's nnnn_slug.sql files at its root (for
	// example an embed.FS narrowed with fs.Sub). Nil for none.
	Migrations fs.FS
	// Register adds the module's reconcilers, River workers and periodic jobs to
	// a worker process's registry. Nil for none.
	Register func(r *workers.Registry) error
}

// Env is what a command line runs against: its streams and environment.
type Env struct {
	Stdout, Stderr io.Writer
	Environ        []string // KEY=VALUE, as os.Environ
}

// Main runs the command line of os.Args and exits with its status. SIGINT and
// SIGTERM cancel the command's context: commands stop gracefully.
func Main(app App) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := Run(ctx, app, os.Args[1:], Env{Stdout: os.Stdout, Stderr: os.Stderr, Environ: os.Environ()})
	stop()
	os.Exit(code)
}

// command is one subcommand.
type command struct {
	name    string
	summary string
	usage   string // arguments after the flags
	// flags adds the command's own flags.
	flags func(fs *flag.FlagSet, s *Session)
	run   func(ctx context.Context, s *Session, args []string) error
}

// commandSet holds every command's constructor; each command's file adds its own
// in an init function.
var commandSet []func() *command

func (a *App) commands() []*command {
	cmds := make([]*command, 0, len(commandSet))
	for _, f := range commandSet {
		cmds = append(cmds, f())
	}
	sort.Slice(cmds, func(i, j int) bool { return cmds[i].name < cmds[j].name })
	return cmds
}

func (a *App) name() string {
	if a.Name == "" {
		return "better-compute"
	}
	return a.Name
}

// Run runs one command line and returns the exit status: 0 on success, 1 on an
// error (printed as CODE: message on stderr), 2 on a usage error.
func Run(ctx context.Context, app App, args []string, env Env) int {
	if env.Stdout == nil {
		env.Stdout = io.Discard
	}
	if env.Stderr == nil {
		env.Stderr = io.Discard
	}
	cmds := app.commands()
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		app.printHelp(env.Stdout, cmds)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	var cmd *command
	for _, c := range cmds {
		if c.name == args[0] {
			cmd = c
		}
	}
	if cmd == nil {
		printErr(env.Stderr, usageErr("%s: unknown command %q (see %s --help)", app.name(), args[0], app.name()))
		return 2
	}

	cfg, err := config.Load(env.Environ)
	if err != nil {
		return printErr(env.Stderr, err)
	}
	s := &Session{App: &app, Config: cfg, Env: env}
	fset := flag.NewFlagSet(app.name()+" "+cmd.name, flag.ContinueOnError)
	fset.SetOutput(io.Discard)
	fset.BoolVar(&s.Dev, "dev", false, "allow an embedded: database URL (development only)")
	fset.BoolVar(&s.NoMigrate, "no-migrate", false, "do not run migrations on start")
	if cmd.flags != nil {
		cmd.flags(fset, s)
	}
	cfg.RegisterFlags(fset)
	if err := fset.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			app.printCommandHelp(env.Stdout, cmd, fset, cfg)
			return 0
		}
		printErr(env.Stderr, usageErr("%s %s: %v (see %s %s --help)", app.name(), cmd.name, err, app.name(), cmd.name))
		return 2
	}
	defer s.close()
	if err := cmd.run(ctx, s, fset.Args()); err != nil {
		if ctx.Err() != nil && fault.CodeOf(err) == fault.Internal {
			err = fault.Wrap(fault.Unavailable, err, "interrupted")
		}
		s.Log.Debug().Err(err).Msg("command failed")
		return printErr(env.Stderr, err)
	}
	return 0
}

// printErr prints err as the command's last line on stderr, CODE: message, on
// one line (a driver's multi-line error is joined), and returns the exit status 1.
func printErr(w io.Writer, err error) int {
	fmt.Fprintln(w, errorLine(err))
	return 1
}

// errorLine is err as the CLI prints it: its code, then its message, on one
// line. An error without a code is INTERNAL_ERROR.
func errorLine(err error) string {
	msg := strings.Join(strings.Fields(err.Error()), " ")
	if code := string(fault.CodeOf(err)); !strings.HasPrefix(msg, code+":") {
		msg = code + ": " + msg
	}
	return msg
}

func (a *App) printHelp(w io.Writer, cmds []*command) {
	fmt.Fprintf(w, "%s: durable background work on PostgreSQL.\n\nUsage:\n  %s COMMAND [flags]\n\nCommands:\n", a.name(), a.name())
	for _, c := range cmds {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "\nEvery command reads these variables; a flag of the same name overrides each:\n")
	cfg, _ := config.Load(nil)
	cfg.PrintHelp(w)
	fmt.Fprintf(w, "\nRun %s COMMAND --help for a command's own flags.\n", a.name())
}

func (a *App) printCommandHelp(w io.Writer, cmd *command, fset *flag.FlagSet, cfg *config.Config) {
	fmt.Fprintf(w, "Usage: %s %s [flags] %s\n\n%s\n\nFlags:\n", a.name(), cmd.name, cmd.usage, cmd.summary)
	cfgFlags := map[string]bool{}
	for _, f := range cfg.Fields() {
		cfgFlags[f.Flag] = true
	}
	fset.VisitAll(func(f *flag.Flag) {
		if cfgFlags[f.Name] {
			return
		}
		def := ""
		if f.DefValue != "" && f.DefValue != "false" {
			def = " (default " + f.DefValue + ")"
		}
		fmt.Fprintf(w, "  --%-14s %s%s\n", f.Name, f.Usage, def)
	})
	fmt.Fprintf(w, "\nConfiguration (environment, or the flag of the same name):\n")
	defaults, _ := config.Load(nil)
	defaults.PrintHelp(w)
}

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
	// extraModules are added by dev (its demo), after the application's.
	extraModules []Module
	// workerMetrics holds the worker's Prometheus metrics once StartWorker ran.
	workerMetrics *prometheus.Registry
	closers       []func()
	logReady      bool
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
	for _, m := range append(append([]Module(nil), s.App.Modules...), s.extraModules...) {
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
	if _, err := s.Registry(); err != nil {
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
	if stored != s.Config.ShardCount {
		s.Log.Warn().Int("stored", stored).Int("configured", s.Config.ShardCount).
			Msg("BETTER_COMPUTE_SHARD_COUNT differs from the shard count fixed at the first migrate; the stored one is used")
	}
	return res, nil
}

// passwordOf returns the password of a postgres:// URL, or "".
func passwordOf(u string) string {
	parsed, err := url.Parse(u)
	if err != nil || parsed.User == nil {
		return ""
	}
	pw, _ := parsed.User.Password()
	return pw
}
