package cli_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/cmd/better-compute/cli"
	"github.com/bettercompute/bettercompute/cmd/better-compute/cli/clitest"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

// greetCommand is an application command: greet [--loud] NAME greets NAME from
// the database the command was given, and logs that it did through the
// command's logger. Each call has its own flag variable, so parallel tests do
// not share it.
func greetCommand() cli.Command {
	var loud bool
	return cli.Command{
		Name:    "greet",
		Summary: "greet someone from the database",
		Usage:   "NAME",
		Flags: func(fs *flag.FlagSet) {
			fs.BoolVar(&loud, "loud", false, "greet in capitals")
		},
		Run: func(ctx context.Context, c *cli.CommandContext, args []string) error {
			if len(args) != 1 {
				return fault.New(fault.InvalidArgument, "greet takes one NAME, got %q", args)
			}
			if args[0] == "ghost" {
				return fault.New(fault.NotFound, "no one called %s", args[0])
			}
			var db string
			if err := c.DB.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil {
				return err
			}
			msg := fmt.Sprintf("hello, %s from %s", args[0], db)
			if loud {
				msg = strings.ToUpper(msg)
			}
			fmt.Fprintln(c.Stdout, msg)
			c.Log.Info().Str("name", args[0]).Msg("greeted")
			return nil
		},
	}
}

func greeterApp() cli.App {
	return cli.App{Name: "greeter", Commands: []cli.Command{greetCommand()}}
}

// TestAppCommandHelp: --help lists the application's command after the
// built-in ones, with its summary; greet --help shows its usage, its own flag
// and the standard ones.
func TestAppCommandHelp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := clitest.Run(t, ctx, greeterApp(), nil, "--help")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Regexp(t, `(?m)^Application commands:\n\s+greet\s+greet someone from the database$`, r.Stdout)
	require.Regexp(t, `(?m)^\s+sinks\s`, r.Stdout, "the built-in commands are still listed")
	require.Less(t, strings.Index(r.Stdout, "  sinks "), strings.Index(r.Stdout, "  greet "), "after the built-in ones")
	require.Contains(t, r.Stdout, "Usage:\n  greeter COMMAND")

	r = clitest.Run(t, ctx, cli.App{}, nil, "--help")
	require.NotContains(t, r.Stdout, "Application commands", "no section without application commands")

	r = clitest.Run(t, ctx, greeterApp(), nil, "greet", "--help")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "Usage: greeter greet [flags] NAME\n\ngreet someone from the database\n")
	require.Regexp(t, `(?m)^\s+--loud\s+greet in capitals$`, r.Stdout)
	require.Regexp(t, `(?m)^\s+--dev\s`, r.Stdout)
	require.Regexp(t, `(?m)^\s+BETTER_COMPUTE_DATABASE_URL\s+--database-url\s`, r.Stdout)
}

// TestAppCommandRuns: greet runs with the pool of the configured database (its
// output names it) and the configured logger (level and format from the
// environment, overridden by the standard flags), its own flag and arguments
// in any order, and no migrations; its errors print as CODE: message, exit 1.
func TestAppCommandRuns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, pgtest.Options{Empty: true})
	env := []string{"BETTER_COMPUTE_DATABASE_URL=" + db.URL, "BETTER_COMPUTE_LOG_LEVEL=warn", "BETTER_COMPUTE_LOG_FORMAT=json"}
	app := greeterApp()

	r := clitest.Run(t, ctx, app, env, "greet", "world")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Equal(t, "hello, world from "+db.Name+"\n", r.Stdout)
	require.NotContains(t, r.Stderr, "greeted", "the info line is below the configured level")

	r = clitest.Run(t, ctx, app, env, "greet", "world", "--loud", "--log-level", "info")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Equal(t, strings.ToUpper("hello, world from "+db.Name)+"\n", r.Stdout)
	require.Regexp(t, `\{.*"command":"greet".*"name":"world".*"message":"greeted"`, r.Stderr, "logged as JSON through the given logger, at the flag's level")

	require.Equal(t, 0, db.MustCount(t, "SELECT count(*) FROM pg_class WHERE relname = 'compute_migrations'"), "an application command does not migrate")

	r = clitest.Run(t, ctx, app, env, "greet", "ghost")
	require.Equal(t, 1, r.Code)
	require.Equal(t, "NOT_FOUND: no one called ghost\n", r.Stderr)
	require.Empty(t, r.Stdout)

	r = clitest.Run(t, ctx, app, env, "greet")
	require.Equal(t, 1, r.Code)
	require.Contains(t, r.Stderr, `INVALID_ARGUMENT: greet takes one NAME, got []`)

	r = clitest.Run(t, ctx, app, env, "greet", "--shout", "world")
	require.Equal(t, 2, r.Code, "an unknown flag is a usage error")
	require.Contains(t, r.Stderr, "shout")

	// The command's database comes from the configuration: an unreachable one
	// fails before Run, like any command's.
	r = clitest.Run(t, ctx, app, []string{"BETTER_COMPUTE_DATABASE_URL=postgres://nobody@127.0.0.1:" + fmt.Sprint(refusedPort(t)) + "/none?connect_timeout=5"}, "greet", "world")
	require.Equal(t, 1, r.Code)
	require.Contains(t, r.Stderr, "UNAVAILABLE")
	require.Empty(t, r.Stdout)
}

// TestAppCommandWithDev: an embedded: database needs --dev, as for the
// built-in commands; with it the command runs on the embedded cluster.
func TestAppCommandWithDev(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := []string{"BETTER_COMPUTE_DATABASE_URL=embedded:memory", "BETTER_COMPUTE_LOG_LEVEL=warn"}
	r := clitest.Run(t, ctx, greeterApp(), env, "greet", "world")
	require.Equal(t, 1, r.Code)
	require.Contains(t, r.Stderr, "INVALID_CONFIG")
	require.Contains(t, r.Stderr, "--dev")

	r = clitest.Run(t, ctx, greeterApp(), env, "greet", "--dev", "world")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Equal(t, "hello, world from bettercompute\n", r.Stdout)
}

// TestAppCommandInvalidDefinitions: a badly defined application command fails
// every command line, --help included, with INVALID_CONFIG and exit 1, before
// anything runs; a flag redefining a standard one fails its command the same
// way instead of panicking.
func TestAppCommandInvalidDefinitions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	run := func(context.Context, *cli.CommandContext, []string) error { return nil }
	for name, tc := range map[string]struct {
		cmds []cli.Command
		want string
	}{
		"built-in name": {[]cli.Command{{Name: "worker", Run: run}}, `"worker": the name is taken by a built-in command`},
		"help":          {[]cli.Command{{Name: "help", Run: run}}, `"help": the name is taken`},
		"duplicate":     {[]cli.Command{{Name: "greet", Run: run}, {Name: "greet", Run: run}}, `App.Commands[1] "greet": the name is taken by App.Commands[0]`},
		"empty name":    {[]cli.Command{{Run: run}}, `App.Commands[0] "": a command's name is a lowercase word`},
		"capitals":      {[]cli.Command{{Name: "Greet", Run: run}}, `"Greet": a command's name is a lowercase word`},
		"flag-like":     {[]cli.Command{{Name: "--greet", Run: run}}, `a command's name is a lowercase word`},
		"nil Run":       {[]cli.Command{{Name: "greet"}}, `"greet": Run is nil`},
	} {
		app := cli.App{Name: "bad", Commands: tc.cmds}
		for _, args := range [][]string{nil, {"--help"}, {"help"}, {"migrate"}, {"greet"}, {"worker", "--help"}} {
			r := clitest.Run(t, ctx, app, nil, args...)
			require.Equal(t, 1, r.Code, "%s %v", name, args)
			require.Regexp(t, `^INVALID_CONFIG: `, r.Stderr, "%s %v", name, args)
			require.Contains(t, r.Stderr, tc.want, "%s %v", name, args)
			require.Empty(t, r.Stdout, "%s %v: nothing else printed", name, args)
		}
	}

	// Names the rules allow.
	for _, n := range []string{"greet", "import-items", "sync2"} {
		r := clitest.Run(t, ctx, cli.App{Commands: []cli.Command{{Name: n, Run: run}}}, nil, "--help")
		require.Equal(t, 0, r.Code, "%s: %s", n, r.Stderr)
		require.Regexp(t, `(?m)^\s+`+regexp.QuoteMeta(n)+`\s`, r.Stdout)
	}

	clash := cli.App{Commands: []cli.Command{{Name: "greet", Run: run, Flags: func(fs *flag.FlagSet) {
		fs.Bool("dev", false, "mine")
	}}}}
	r := clitest.Run(t, ctx, clash, nil, "greet")
	require.Equal(t, 1, r.Code)
	require.Regexp(t, `^INVALID_CONFIG: command greet: its flags: .*redefined: dev`, r.Stderr)
}

// TestDevDatabaseIsPerApplication: dev's default database is the embedded
// cluster in .NAME/pg, NAME the application's (the better-compute binary
// keeps DevDatabase), and dev --help says so.
func TestDevDatabaseIsPerApplication(t *testing.T) {
	t.Parallel()
	require.Equal(t, cli.DevDatabase, cli.App{}.DevDatabase())
	require.Equal(t, "embedded:.better-compute/pg", cli.DevDatabase)
	require.Equal(t, "embedded:.exampleapp/pg", cli.App{Name: "exampleapp"}.DevDatabase())

	r := clitest.Run(t, context.Background(), cli.App{Name: "exampleapp"}, nil, "dev", "--help")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "(embedded:.exampleapp/pg unless BETTER_COMPUTE_DATABASE_URL says otherwise)")
	require.NotContains(t, r.Stdout, cli.DevDatabase)
}

// TestDevForAnApplication runs dev of an application without
// BETTER_COMPUTE_DATABASE_URL in a fresh working directory: it creates the
// embedded cluster in .devapp/pg, writes the database's URL to
// .devapp/database-url (mode 0600) while it runs, a URL that connects to the
// migrated database, names the application and the file in its banner, and
// removes the file when it stops. It changes the working directory, so it does
// not run in parallel.
func TestDevForAnApplication(t *testing.T) {
	// The server runs as an unprivileged user when the tests run as root: its
	// directory's parents must be enterable (t.TempDir is private to root).
	dir, err := os.MkdirTemp("", "bc-cli-dev-")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(dir, 0o755))
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	t.Chdir(dir)

	env := []string{"BETTER_COMPUTE_LOG_LEVEL=warn", "BETTER_COMPUTE_LISTEN=127.0.0.1:0"}
	app := cli.App{Name: "devapp", Commands: []cli.Command{greetCommand()}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan clitest.Result, 1)
	go func() { done <- clitest.Run(t, ctx, app, env, "dev") }()

	urlFile := filepath.Join(dir, ".devapp", "database-url")
	var content []byte
	deadline := time.Now().Add(60 * time.Second)
	for {
		if content, err = os.ReadFile(urlFile); err == nil {
			break
		}
		select {
		case r := <-done:
			t.Fatalf("dev ended before writing %s: exit %d\n%s", urlFile, r.Code, r.Stderr)
		case <-time.After(50 * time.Millisecond):
		}
		require.True(t, time.Now().Before(deadline), "dev did not write %s", urlFile)
	}
	require.FileExists(t, filepath.Join(dir, ".devapp", "pg", "PG_VERSION"), "the cluster is in .devapp/pg")
	fi, err := os.Stat(urlFile)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	url, ok := strings.CutSuffix(string(content), "\n")
	require.True(t, ok, "the URL ends with a newline: %q", content)
	require.Regexp(t, `^postgres://postgres@127\.0\.0\.1:\d+/bettercompute\?sslmode=disable$`, url)

	qctx, qcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer qcancel()
	conn, err := pgx.Connect(qctx, url)
	require.NoError(t, err)
	var migrated bool
	var at time.Time
	require.NoError(t, conn.QueryRow(qctx, `SELECT to_regclass('compute_migrations') IS NOT NULL, clock_timestamp()`).Scan(&migrated, &at))
	require.NoError(t, conn.Close(qctx))
	require.True(t, migrated, "the file's URL is dev's migrated database")

	// The application's command runs against the same cluster, as the banner
	// would have a script do.
	r := clitest.Run(t, context.Background(), app, []string{"BETTER_COMPUTE_DATABASE_URL=" + url, "BETTER_COMPUTE_LOG_LEVEL=warn"}, "greet", "dev")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Equal(t, "hello, dev from bettercompute\n", r.Stdout)

	cancel()
	select {
	case r = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("dev did not stop")
	}
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Regexp(t, `(?m)^devapp dev: database ready at `+regexp.QuoteMeta(url)+`\n(  .*\n)*  database URL written to \.devapp/database-url\nPress Ctrl-C to stop\.\n`, r.Stdout,
		"the banner names the application, its database and the file")
	require.NoFileExists(t, urlFile, "removed when dev stops")
}
