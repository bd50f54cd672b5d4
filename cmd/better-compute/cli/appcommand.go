package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"regexp"

	"github.com/rs/zerolog"

	"github.com/bettercompute/bettercompute/platform/config"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
)

// Command is one of the application's own commands (App.Commands): it runs
// with the pool and logger every command configures, and the standard flags
// (the configuration's, --dev) work as they do for the built-in ones. It does
// not run migrations.
//
// Flags binds the command's flags to variables its Run reads, usually ones
// the two functions share:
//
//	var loud bool
//	cli.Command{
//		Name: "greet", Summary: "greet someone", Usage: "NAME",
//		Flags: func(fs *flag.FlagSet) { fs.BoolVar(&loud, "loud", false, "shout") },
//		Run: func(ctx context.Context, c *cli.CommandContext, args []string) error { … },
//	}
type Command struct {
	// Name is the command's name: a lowercase word (letters, digits and
	// dashes, starting with a letter), not a built-in command's name.
	Name string
	// Summary is the command's one line in --help.
	Summary string
	// Usage names the positional arguments in the command's --help, for
	// example "ITEM QTY".
	Usage string
	// Flags, optional, binds the command's own flags. It must not redefine a
	// standard flag (--dev, --no-migrate, a configuration flag).
	Flags func(fs *flag.FlagSet)
	// Run runs the command with its positional arguments. An error it returns
	// is printed as CODE: message (a fault code, INTERNAL_ERROR without one)
	// and the command exits 1; return a fault.InvalidArgument error for bad
	// arguments.
	Run func(ctx context.Context, c *CommandContext, args []string) error
}

// CommandContext is what an application command runs with.
type CommandContext struct {
	// DB is the pool opened from BETTER_COMPUTE_DATABASE_URL (an embedded:
	// URL needs --dev), closed when the command returns.
	DB *pg.Pool
	// Log is the configured logger (BETTER_COMPUTE_LOG_LEVEL, _LOG_FORMAT),
	// writing to Stderr, with the field command=Name.
	Log zerolog.Logger
	// Stdout and Stderr are the command line's output streams.
	Stdout, Stderr io.Writer
	// Config is the validated configuration, flags applied.
	Config *config.Config
}

// commandName is what an application command's name may be.
var commandName = regexp.MustCompile(`^[a-z][a-z0-9]*(-[a-z0-9]+)*$`)

// checkCommands returns INVALID_CONFIG for the first application command that
// is not well defined: a bad or duplicate name, a built-in command's name, or
// no Run.
func checkCommands(builtin []*command, cmds []Command) error {
	taken := map[string]string{"help": "the help command"}
	for _, c := range builtin {
		taken[c.name] = "a built-in command"
	}
	for i, c := range cmds {
		bad := func(format string, args ...any) error {
			return fault.New(fault.InvalidConfig, "App.Commands[%d] %q: %s", i, c.Name, fmt.Sprintf(format, args...))
		}
		switch {
		case !commandName.MatchString(c.Name):
			return bad("a command's name is a lowercase word (letters, digits and dashes, starting with a letter)")
		case taken[c.Name] != "":
			return bad("the name is taken by %s", taken[c.Name])
		case c.Run == nil:
			return bad("Run is nil")
		}
		taken[c.Name] = fmt.Sprintf("App.Commands[%d]", i)
	}
	return nil
}

// appCommand is the command of an application's Command.
func appCommand(c Command) *command {
	o := &appOpts{c: c}
	return &command{
		name:    c.Name,
		summary: c.Summary,
		usage:   c.Usage,
		opts:    o,
		run:     o.run,
	}
}

// appOpts are an application command's options: the flags its Flags binds;
// its Run checks the positional arguments.
type appOpts struct{ c Command }

func (o *appOpts) bind(fs *flag.FlagSet) {
	if o.c.Flags != nil {
		o.c.Flags(fs)
	}
}

func (*appOpts) Validate([]string) error { return nil }

// run opens the pool (no migrations) and hands it to the command's Run.
func (o *appOpts) run(ctx context.Context, s *Session, args []string) error {
	db, err := s.Pool(ctx)
	if err != nil {
		return err
	}
	return o.c.Run(ctx, &CommandContext{
		DB:     db,
		Log:    s.Log.With().Str("command", o.c.Name).Logger(),
		Stdout: s.Env.Stdout,
		Stderr: s.Env.Stderr,
		Config: s.Config,
	}, args)
}
