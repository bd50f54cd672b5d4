package cli

import (
	"context"
	"fmt"

	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/workers"
)

// Demo is one part of dev's demo workload: an optional module (its tables and
// workers, registered by dev only) and an optional loop that plays the
// application, run until dev stops. Each demo's file adds itself to demos in an
// init function.
type Demo struct {
	Name   string
	Module func() Module
	Run    func(ctx context.Context, s *Session, rt *workers.Runtime)
}

var demos []Demo

// DevDatabase is dev's database when BETTER_COMPUTE_DATABASE_URL is not set.
const DevDatabase = "embedded:.better-compute/pg"

func init() { commandSet = append(commandSet, devCommand) }

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
			for _, d := range demos {
				if d.Module != nil {
					s.extraModules = append(s.extraModules, d.Module())
				}
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
			for _, d := range demos {
				if d.Run != nil {
					go d.Run(ctx, s, rt)
				}
			}
			url := db.Config().ConnString()
			if s.cluster != nil {
				url = s.cluster.URL()
			}
			fmt.Fprintf(s.Env.Stdout, "better-compute dev: database ready at %s\n", pg.RedactURL(url))
			fmt.Fprintf(s.Env.Stdout, "  psql %s\n  BETTER_COMPUTE_DATABASE_URL=%s better-compute doctor --demo\nPress Ctrl-C to stop.\n", pg.RedactURL(url), pg.RedactURL(url))
			<-ctx.Done()
			s.Log.Info().Msg("dev: stopping")
			return nil
		},
	}
}
