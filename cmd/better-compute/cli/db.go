package cli

import (
	"context"
	"flag"
	"fmt"
	"strings"

	"github.com/bettercompute/bettercompute/platform/embedded"
	"github.com/bettercompute/bettercompute/platform/fault"
)

const dbUsage = "start | url | stop"

// dbOpts are the db command's options: a verb, no flags of its own.
type dbOpts struct{}

func (*dbOpts) bind(*flag.FlagSet) {}

// Validate checks the verb.
func (*dbOpts) Validate(args []string) error {
	if len(args) == 0 {
		return usageErr("db needs a verb: %s", dbUsage)
	}
	switch args[0] {
	case "start", "url", "stop":
		if len(args) > 1 {
			return usageErr("db %s takes no arguments, got %q", args[0], args[1:])
		}
		return nil
	default:
		return usageErr("db: unknown verb %q: want %s", args[0], dbUsage)
	}
}

// dbCommand is db, whose cluster defaults to db's (the application's dev
// database).
func dbCommand(db string) *command {
	o := &dbOpts{}
	return &command{
		name: "db",
		summary: "run the embedded PostgreSQL (" + db + " unless BETTER_COMPUTE_DATABASE_URL is another embedded:DIR) in the background, for several processes: " +
			"start prints its postgres:// URL and writes it to database-url beside it, url prints it, stop stops it",
		usage: dbUsage,
		opts:  o,
		run:   o.run,
	}
}

func (*dbOpts) run(ctx context.Context, s *Session, args []string) error {
	url := s.Config.DatabaseURL
	if !embedded.IsURL(url) {
		// A postgres:// URL, such as the one db start printed and the user
		// exported, does not name a cluster: db manages the application's.
		url = s.App.DevDatabase()
	}
	s.Config.DatabaseURL = url
	if err := s.setup(); err != nil {
		return err
	}
	dir := strings.TrimPrefix(url, embedded.Scheme)
	if dir == "" || dir == embedded.Memory {
		return fault.New(fault.InvalidConfig, "BETTER_COMPUTE_DATABASE_URL=%s: db keeps a cluster in a directory (embedded:DIR); a temporary one is gone with its process", url)
	}
	name := s.App.name()
	switch args[0] {
	case "start":
		c, err := embedded.FromURL(ctx, url, embedded.Options{BinDir: s.Config.PGBin, Detach: true, Logf: func(f string, a ...any) {
			s.Log.Info().Msgf(f, a...)
		}})
		if err != nil {
			return err
		}
		file := devURLPath(url)
		if _, err := writeURLFile(file, c.URL()); err != nil {
			return err
		}
		fmt.Fprintln(s.Env.Stdout, c.URL())
		fmt.Fprintf(s.Env.Stderr, "%s db: PostgreSQL runs in %s in the background, its URL is in %s; stop it with `%s db stop`\n", name, dir, file, name)
		return nil
	case "url":
		c, err := runningCluster(ctx, dir, name)
		if err != nil {
			return err
		}
		fmt.Fprintln(s.Env.Stdout, c.URL())
		return nil
	default: // stop
		c, err := runningCluster(ctx, dir, name)
		if err != nil {
			return err
		}
		if err := embedded.Shutdown(ctx, dir); err != nil {
			return err
		}
		removeURLFile(devURLPath(url), c.URL())
		fmt.Fprintf(s.Env.Stderr, "%s db: stopped PostgreSQL in %s\n", name, dir)
		return nil
	}
}

// runningCluster is the cluster running in dir, or NOT_FOUND saying how to
// start one.
func runningCluster(ctx context.Context, dir, name string) (*embedded.Cluster, error) {
	c, err := embedded.Running(ctx, dir)
	if fault.CodeOf(err) == fault.NotFound {
		return nil, fault.New(fault.NotFound, "no embedded cluster running in %s: start one with `%s db start`", dir, name)
	}
	return c, err
}
