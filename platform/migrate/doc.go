// Package migrate is the migrations ledger: it applies SQL migrations named
// <owner>/<nnnn>_<slug>, one transaction each, and refuses a database it cannot
// account for.
//
// # The ledger
//
// Two tables record what ran: compute_migrations(name, applied_at) and
// compute_schema_version(version), whose version is the number of base (core)
// migrations applied. Each migration runs in its own transaction, which first
// takes pg_advisory_xact_lock(1650683248, 1) (released at COMMIT, so it is safe
// behind PgBouncer), then checks the ledger, applies the SQL and inserts its
// ledger row. A failed migration leaves nothing, not even its row; two migrators
// at once serialize on the lock and the second skips what the first applied.
//
// # Order
//
// core (the base schema), then River's schema (owner river, applied with
// rivermigrate one version per transaction), then the built-in modules, then the
// application's modules in the order it registers them.
//
// # Refusals
//
// Before anything is applied, with INVALID_CONFIG naming every entry:
//
//   - a later number from an owner this build knows: a newer release migrated
//     this database;
//   - an unknown name at or below an owner's last number: a migration was renamed
//     or removed;
//   - a base schema version above this build's.
//
// Ledger entries of owners this build has no migrations for are ignored. A
// name a migration landed under before it was renumbered (Migration.Formerly,
// migrations.Renamed) is known: it stands for that migration, which is not
// applied again.
//
// # Loading
//
// A set is validated when it is loaded, before any SQL runs: file names must be
// nnnn_slug.sql (four digits, lowercase slug), numbers start at 1 and have no
// duplicates or gaps, and an owner appears once.
package migrate
