// Package migrations holds the SQL migrations of Better Compute's own owners,
// embedded into the binary: migrations/<owner>/<nnnn>_<slug>.sql.
//
// A migration that has landed is never edited, renamed or removed; a change is a
// new file with the next number. The ledger (platform/migrate) refuses a database
// that holds a name this build cannot account for.
//
// schema.sql, beside the owners' directories, is no migration and is not
// embedded: it is the live schema the built-in migrations make, each table,
// index, function and trigger once, as TestSchemaIsCheckedIn
// (platform/migrate) writes and checks it.
package migrations

import "embed"

// FS holds every built-in owner's migrations, one directory per owner.
//
//go:embed core/*.sql jobs/*.sql tenancy/*.sql outbox/*.sql backfill/*.sql capacity/*.sql quorum/*.sql workflow/*.sql confirmations/*.sql
var FS embed.FS

// Demo holds the demo application's migrations (owners demo, demo_backfill,
// demo_domain, demo_outbox and demo_workflow). They stay where they landed,
// because a landed migration is never moved, but they are not in FS: only the
// demo package (cmd/better-compute/demo) refers to Demo, so the linker leaves
// them out of every binary that does not import it.
//
//go:embed demo/*.sql demo_backfill/*.sql demo_domain/*.sql demo_outbox/*.sql demo_workflow/*.sql
var Demo embed.FS

// Renamed maps the ledger name a migration landed under to the name it has
// now, for a migration that had to be renumbered after it landed:
// capacity/0007_overlap_index_out_of_reach landed while 0007_book_groups, which
// had landed before it, was out of the tree; with 0007_book_groups back, it is
// 0008. Its first file stays as it landed, and is not applied: a database
// whose ledger holds the old name holds the new one (platform/migrate).
var Renamed = map[string]string{
	"capacity/0007_overlap_index_out_of_reach": "capacity/0008_overlap_index_out_of_reach",
}

// Owners lists the built-in owners in the order their migrations run. River's
// own schema (owner river) runs after core; platform/migrate inserts it. jobs
// (what Better Compute adds to River's tables) comes right after River. The demo
// application's owners are not here: they are in Demo.
var Owners = []string{"core", "jobs", "tenancy", "outbox", "backfill", "capacity", "quorum", "workflow", "confirmations"}
