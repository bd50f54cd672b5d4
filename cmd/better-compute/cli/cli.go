// Package cli is Better Compute's application API: an application's main hands
// its modules to Main and gets every command (migrate, worker, serve, doctor,
// dev, and the operator verbs) with them.
//
//	func main() {
//		cli.Main(cli.App{Name: "inventory", Modules: []cli.Module{inventory.Module()}})
//	}
//
// The better-compute binary is Main with its demo application
// (cmd/better-compute/demo); an application's binary carries none of it.
//
// Nothing here registers itself: commands builds the command set, the built-in
// modules and the HTTP routes are explicit lists (builtinModules, routes). Each
// command has its options (flags bound to fields, checked by Validate before
// anything runs) and its run function, which tests call with a configuration
// instead of spawning the binary; Run (the function) is the whole command line,
// with its own output streams and environment.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/bettercompute/bettercompute/platform/config"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/web"
	"github.com/bettercompute/bettercompute/workers"
)

// App is an application built on Better Compute.
type App struct {
	// Name is the binary's name in help output and dev's banner (default
	// better-compute).
	Name string
	// Modules are the application's modules, in registration order: their
	// migrations run after the built-in ones, in this order.
	Modules []Module
	// Commands are the application's own commands, listed in --help after the
	// built-in ones. Each runs with the configured pool and logger.
	Commands []Command
}

// Module is one application module.
type Module struct {
	// Name is the module's migration owner: a lowercase identifier, not core,
	// river or a built-in module's name.
	Name string
	// Migrations holds the module's nnnn_slug.sql files at its root (for
	// example an embed.FS narrowed with fs.Sub). Nil for none.
	Migrations fs.FS
	// Register adds the module's reconcilers, River workers, sinks, backfills
	// and periodic jobs to a worker process's registry. Nil for none.
	Register func(r *workers.Registry) error
	// Metrics, optional, returns the module's Prometheus collectors, which
	// read the database at each scrape of serve's /metrics (db is serve's
	// pool, r the registry Register filled). Nil for none.
	Metrics func(db *pg.Pool, r *workers.Registry) ([]prometheus.Collector, error)
	// Routes, optional, returns the module's HTTP endpoints, which serve (and
	// dev) mount beside River UI, behind the same listener, credentials and
	// read-only mode (a route not marked ReadOnly is refused there). s is the
	// serving command's session (its registry, logger and configuration).
	Routes func(s *Session, db *pg.Pool) []web.Route
	// PublicRoutes, optional, returns endpoints for anyone: serve (and dev)
	// mount them on the public listener (BETTER_COMPUTE_PUBLIC_LISTEN), which
	// serves nothing else and asks no credentials (the confirmation links
	// are; a payment provider's callback could be). Each must guard itself.
	PublicRoutes func(s *Session, db *pg.Pool) []web.Route
	// Checks, optional, returns the module's own doctor checks, printed after
	// the built-in ones: a Check not OK fails doctor (set its Code for a
	// stable error code). It runs on doctor's pool; ctx ends with doctor.
	Checks func(ctx context.Context, s *Session, db *pg.Pool) []Check
	// Dev, optional, plays the application while dev runs: started once the
	// worker runs, it changes rows and marks them dirty until ctx is done (the
	// demo application's modules do). Only dev runs it. TracerProvider(ctx) is
	// dev's tracer provider, to trace what it does as the application's requests.
	Dev func(ctx context.Context, db *pg.Pool, log zerolog.Logger)
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

// options are a command's flags and arguments: bind adds its flags, bound to
// its fields; Validate checks them and the positional arguments before the
// command touches anything (INVALID_ARGUMENT, printed as a usage error).
type options interface {
	bind(fs *flag.FlagSet)
	Validate(args []string) error
}

// command is one subcommand: its help, its options and what it runs.
type command struct {
	name    string
	summary string
	usage   string // arguments after the flags
	opts    options
	run     func(ctx context.Context, s *Session, args []string) error
}

// commands builds the command set, in the order --help lists it: the ones that
// run the system, then the ones that look at it and steer it, then the
// application's own (App.Commands). It returns INVALID_CONFIG for an
// application command that is not well defined (checkCommands).
func (a *App) commands() ([]*command, error) {
	cmds := []*command{
		migrateCommand(),
		workerCommand(),
		serveCommand(),
		devCommand(a.DevDatabase()),
		dbCommand(a.DevDatabase()),
		doctorCommand(),
		backfillCommand(),
		sinksCommand(),
		workflowCommand(),
		tenantCommand(),
		confirmationCommand(),
	}
	if err := checkCommands(cmds, a.Commands); err != nil {
		return nil, err
	}
	for _, c := range a.Commands {
		cmds = append(cmds, appCommand(c))
	}
	return cmds, nil
}

// noArgs is the Validate of a command that takes no positional arguments.
func noArgs(name string, args []string) error {
	if len(args) > 0 {
		return usageErr("%s takes no arguments, got %q", name, args)
	}
	return nil
}

// usageErr is a usage error: INVALID_ARGUMENT.
func usageErr(format string, args ...any) error {
	return fault.New(fault.InvalidArgument, format, args...)
}

func (a *App) name() string {
	if a.Name == "" {
		return "better-compute"
	}
	return a.Name
}

// Run runs one command line and returns the exit status: 0 on success, 1 on an
// error (printed as CODE: message on stderr), 2 on a usage error found while
// parsing flags. An application command that is not well defined fails every
// command line, --help included, with INVALID_CONFIG.
func Run(ctx context.Context, app App, args []string, env Env) int {
	if env.Stdout == nil {
		env.Stdout = io.Discard
	}
	if env.Stderr == nil {
		env.Stderr = io.Discard
	}
	cmds, err := app.commands()
	if err != nil {
		return printErr(env.Stderr, err)
	}
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
	fset.BoolVar(&s.Dev, "dev", false, "allow an embedded: database URL (development only); without BETTER_COMPUTE_DATABASE_URL, the application's dev database")
	fset.BoolVar(&s.NoMigrate, "no-migrate", false, "do not run migrations on start")
	if err := bindFlags(fset, cmd, cfg); err != nil {
		return printErr(env.Stderr, err)
	}
	pos, err := parseInterspersed(fset, args[1:])
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			app.printCommandHelp(env.Stdout, cmd, fset)
			return 0
		}
		printErr(env.Stderr, usageErr("%s %s: %v (see %s %s --help)", app.name(), cmd.name, err, app.name(), cmd.name))
		return 2
	}
	if err := cmd.opts.Validate(pos); err != nil {
		return printErr(env.Stderr, err)
	}
	if s.Dev && s.Config.DatabaseURL == "" {
		// --dev names no database: the application's own, as dev and db use.
		s.Config.DatabaseURL = app.DevDatabase()
	}
	defer s.close()
	if err := cmd.run(ctx, s, pos); err != nil {
		// A driver error (from an application command, say) gets its code: a
		// unique violation is CONFLICT, a lost connection UNAVAILABLE.
		err = pg.Translate(err)
		if ctx.Err() != nil && fault.CodeOf(err) == fault.Internal {
			err = fault.Wrap(fault.Unavailable, err, "interrupted")
		}
		s.Log.Debug().Err(err).Msg("command failed")
		return printErr(env.Stderr, err)
	}
	return 0
}

// bindFlags adds cmd's flags and the configuration's to fset. A flag defined
// twice (an application command's Flags redefining a standard one) is
// INVALID_CONFIG instead of the flag package's panic.
func bindFlags(fset *flag.FlagSet, cmd *command, cfg *config.Config) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fault.New(fault.InvalidConfig, "command %s: its flags: %v", cmd.name, r)
		}
	}()
	cmd.opts.bind(fset)
	cfg.RegisterFlags(fset)
	return nil
}

// parseInterspersed parses fs's flags wherever they stand among the arguments
// (backfill status NAME --watch) and returns the positional ones, in order.
// After "--" everything is positional.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
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
	msg := oneLine(err.Error(), 0)
	if code := string(fault.CodeOf(err)); !strings.HasPrefix(msg, code+":") {
		msg = code + ": " + msg
	}
	return msg
}

func (a *App) printHelp(w io.Writer, cmds []*command) {
	fmt.Fprintf(w, "%s: durable background work on PostgreSQL.\n\nUsage:\n  %s COMMAND [flags]\n\nCommands:\n", a.name(), a.name())
	width := 10
	for _, c := range cmds {
		width = max(width, len(c.name))
	}
	builtin := len(cmds) - len(a.Commands)
	for i, c := range cmds {
		if i == builtin {
			fmt.Fprintf(w, "\nApplication commands:\n")
		}
		fmt.Fprintf(w, "  %-*s %s\n", width, c.name, c.summary)
	}
	fmt.Fprintf(w, "\nEvery command reads these variables; a flag of the same name overrides each:\n")
	cfg, _ := config.Load(nil)
	cfg.PrintHelp(w)
	fmt.Fprintf(w, "\nRun %s COMMAND --help for a command's own flags.\n", a.name())
}

func (a *App) printCommandHelp(w io.Writer, cmd *command, fset *flag.FlagSet) {
	fmt.Fprintf(w, "Usage: %s %s [flags] %s\n\n%s\n\nFlags:\n", a.name(), cmd.name, cmd.usage, cmd.summary)
	defaults, _ := config.Load(nil)
	cfgFlags := map[string]bool{}
	for _, f := range defaults.Fields() {
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
	defaults.PrintHelp(w)
}
