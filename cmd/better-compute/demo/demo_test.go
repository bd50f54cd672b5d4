package demo

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/platform/migrate"
)

// TestDemoMigrationsKeepTheirLedgerNames pins the demos' migrations to the
// names they landed with: a database that dev migrated is still accounted for,
// and a landed migration is never renamed or removed.
func TestDemoMigrationsKeepTheirLedgerNames(t *testing.T) {
	t.Parallel()
	var names []string
	for _, m := range Modules() {
		ms, err := migrate.FromFS(m.Name, m.Migrations)
		require.NoError(t, err)
		for _, mg := range ms {
			names = append(names, mg.Name())
		}
	}
	require.Equal(t, []string{
		"demo/0001_counters",
		"demo_backfill/0001_greetings",
		"demo_domain/0001_applied_changes",
		"demo_outbox/0001_orders",
		"demo_workflow/0001_orders",
		"demo_workflow/0002_mailbox",
	}, names)
}
