package cli

import (
	"context"
	"flag"
	"fmt"
)

// migrateOpts are migrate's options: it takes none.
type migrateOpts struct{}

func (*migrateOpts) bind(*flag.FlagSet)           {}
func (*migrateOpts) Validate(args []string) error { return noArgs("migrate", args) }

func migrateCommand() *command {
	o := &migrateOpts{}
	return &command{
		name:    "migrate",
		summary: "validate the configuration and apply pending migrations (idempotent, safe to run from many processes at once)",
		opts:    o,
		run:     o.run,
	}
}

func (*migrateOpts) run(ctx context.Context, s *Session, _ []string) error {
	res, err := s.Migrate(ctx)
	if err != nil {
		return err
	}
	for _, name := range res.Applied {
		fmt.Fprintf(s.Env.Stdout, "applied %s\n", name)
	}
	fmt.Fprintf(s.Env.Stdout, "migrate: %d applied, %d already current (%s)\n", len(res.Applied), res.Skipped, res.Duration.Round(1e6))
	return nil
}
