package cli

import (
	"context"
	"fmt"
)

func init() { commandSet = append(commandSet, migrateCommand) }

func migrateCommand() *command {
	return &command{
		name:    "migrate",
		summary: "validate the configuration and apply pending migrations (idempotent, safe to run from many processes at once)",
		run: func(ctx context.Context, s *Session, args []string) error {
			if len(args) > 0 {
				return usageErr("migrate takes no arguments, got %q", args)
			}
			res, err := s.Migrate(ctx)
			if err != nil {
				return err
			}
			for _, name := range res.Applied {
				fmt.Fprintf(s.Env.Stdout, "applied %s\n", name)
			}
			fmt.Fprintf(s.Env.Stdout, "migrate: %d applied, %d already current (%s)\n", len(res.Applied), res.Skipped, res.Duration.Round(1e6))
			return nil
		},
	}
}
