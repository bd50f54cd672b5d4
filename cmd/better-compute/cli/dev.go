package cli

import (
	"context"
	"fmt"

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
			db, err := s.Pool(ctx)
			if err != nil {
				return err
			}
			if !s.NoMigrate {
				res, err := s.Migrate(ctx)
				if err != nil {
					return err
				}
				s.Log.Info().Int("applied", len(res.Applied)).Int("current", res.Skipped).Msg("migrations done")
			}
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
