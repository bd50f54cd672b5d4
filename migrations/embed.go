// Package migrations holds the SQL migrations of Better Compute's own owners,
// embedded into the binary: migrations/<owner>/<nnnn>_<slug>.sql.
//
// A migration that has landed is never edited, renamed or removed; a change is a
// new file with the next number. The ledger (platform/migrate) refuses a database
// that holds a name this build cannot account for.
package migrations

import "embed"

// FS holds every built-in owner's migrations, one directory per owner.
//
//go:embed */*.sql
var FS embed.FS

// Owners lists the built-in owners in the order their migrations run. River's
// own schema (owner river) runs after core; platform/migrate inserts it. The demo
// application's owners are not here: they live with it, in cmd/better-compute/demo.
var Owners = []string{"core", "outbox", "backfill", "capacity", "quorum"}
