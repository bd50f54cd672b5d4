package workers

// Hooks for the benchmarks of the tenancy module's cost to work of no tenant
// (BenchmarkTenantOverhead). Set them while no Runtime runs.

// SetRiverFetch makes a shard queue's fetch River's own statement (on) or
// compute_fetch_jobs (off, as always in production).
func SetRiverFetch(on bool) { riverFetch.Store(on) }

// legacyTakeSQL is the take before the tenancy module: compute_take_dirty
// (migrations/core/0011_take_dirty.sql), which knows no tenant, with
// TakeDirtySQL's arguments (the ninth, the group served last, unused) and
// columns (the tenant NULL).
const legacyTakeSQL = `SELECT kind, key, gen, dirtied_at, causes, links, nullif($9::text, $9::text) AS tenant
FROM compute_take_dirty($1, $2, $3, $4, $5::text[], $6::int[], $7::text[], $8::text[])`

// SetLegacyTake makes a reconcile batch's take compute_take_dirty (on) or
// compute_take_fair (off, as always in production).
func SetLegacyTake(on bool) {
	if on {
		s := legacyTakeSQL
		takeSQL.Store(&s)
		return
	}
	takeSQL.Store(nil)
}
