package cli

import (
	"context"
	"flag"
	"fmt"

	"github.com/bettercompute/bettercompute/platform/pg"
)

// DevDatabase is dev's database when BETTER_COMPUTE_DATABASE_URL is not set.
const DevDatabase = "embedded:.better-compute/pg"

// devOpts are dev's options: its flags are the configuration's; it takes no
// arguments.
type devOpts struct{}

func (*devOpts) bind(*flag.FlagSet)           {}
func (*devOpts) Validate(args []string) error { return noArgs("dev", args) }

func devCommand() *command {
	o := &devOpts{}
	return &command{
		name:    "dev",
		summary: "run everything in one process on the embedded PostgreSQL (" + DevDatabase + " unless BETTER_COMPUTE_DATABASE_URL says otherwise), until interrupted",
		opts:    o,
		run:     o.run,
	}
}

// run migrates, starts a worker on every shard and serve in one process, and
// runs each module's Dev (the application's play), until interrupted.
func (*devOpts) run(ctx context.Context, s *Session, _ []string) error {
	s.Dev = true
	if s.Config.DatabaseURL == "" {
		s.Config.DatabaseURL = DevDatabase
	}
	db, err := s.Pool(ctx)
	if err != nil {
		return err
	}
	rt, err := s.StartWorker(ctx) // migrates first, unless --no-migrate
	if err != nil {
		return err
	}
	defer func() { _ = rt.Stop(context.Background()) }()
	stopServe, err := s.StartServe(ctx, rt)
	if err != nil {
		return err
	}
	defer stopServe()
	for _, m := range s.App.Modules {
		if m.Dev != nil {
			go m.Dev(ctx, rt.Pool(), s.Log.With().Str("module", m.Name).Logger())
		}
	}
	url := db.Config().ConnString()
	if s.cluster != nil {
		url = s.cluster.URL()
	}
	name := s.App.name()
	fmt.Fprintf(s.Env.Stdout, "%s dev: database ready at %s\n", name, pg.RedactURL(url))
	fmt.Fprintf(s.Env.Stdout, "  psql %s\n  BETTER_COMPUTE_DATABASE_URL=%s %s doctor\nPress Ctrl-C to stop.\n", pg.RedactURL(url), pg.RedactURL(url), name)
	<-ctx.Done()
	s.Log.Info().Msg("dev: stopping")
	return nil
}
