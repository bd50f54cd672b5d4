package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/bettercompute/bettercompute/platform/pg"
)

// DevDatabase is dev's database when BETTER_COMPUTE_DATABASE_URL is not set.
const DevDatabase = "embedded:.better-compute/pg"

func devCommand() *command {
	return &command{
		name:    "dev",
		summary: "run everything in one process on the embedded PostgreSQL (" + DevDatabase + " unless BETTER_COMPUTE_DATABASE_URL says otherwise), until interrupted",
		run: func(ctx context.Context, s *Session, args []string) error {
			if len(args) > 0 {
				return usageErr("dev takes no arguments, got %q", args)
			}
			s.Dev = true
			if s.Config.DatabaseURL == "" {
				s.Config.DatabaseURL = DevDatabase
			}
			s.extraModules = append(s.extraModules, demoModule())
			db, err := s.Pool(ctx)
			if err != nil {
				return err
			}
			rt, err := s.StartWorker(ctx) // migrates first, unless --no-migrate
			if err != nil {
				return err
			}
			defer func() { _ = rt.Stop(context.Background()) }()
			go runDemo(ctx, s, db, 500*time.Millisecond)
			url := db.Config().ConnString()
			if s.cluster != nil {
				url = s.cluster.URL()
			}
			fmt.Fprintf(s.Env.Stdout, "better-compute dev: database ready at %s\n", pg.RedactURL(url))
			fmt.Fprintf(s.Env.Stdout, "  psql %s\n  BETTER_COMPUTE_DATABASE_URL=%s better-compute doctor\nPress Ctrl-C to stop.\n", pg.RedactURL(url), pg.RedactURL(url))
			<-ctx.Done()
			s.Log.Info().Msg("dev: stopping")
			return nil
		},
	}
}
