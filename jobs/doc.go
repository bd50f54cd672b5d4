// Package jobs holds what applications enqueue and the helpers that route it:
// the reconcile job and DirtyTx (coalescing), and the shard of a key. It imports
// only River, pgx, the standard library and platform/fault (the one error type,
// itself standard library only), so enqueueing never pulls in worker code. Bad
// input (a kind, a key, job args that cannot be worked) is INVALID_ARGUMENT.
//
// # Shards
//
// A deployment has a fixed number of shards, stored in compute_settings at the
// first migrate. A key's shard is FNV-1a(key) mod the shard count, and each
// shard's work runs in the River queue shard_<n>, which only the holder of the
// shard's lease works.
//
// An application's own job kind (registered with workers.AddWorker) is fenced:
// InsertForKeyTx puts it in the shard queue of a key, in the caller's
// transaction. Its kind is recorded in compute_fenced_kinds (RecordFencedKinds,
// at migrate and worker start), and a trigger on river_job refuses a job of a
// recorded kind in any other queue (INVALID_ARGUMENT), where no worker would
// ever take it:
//
//	no job ──InsertForKeyTx(key)──▶ available in shard_<ShardOf(key)>
//	no job ──InsertTx(queue default)──▶ refused (fenced kind) | available (other kind)
//
// # DirtyTx: coalescing on River
//
// DirtyTx marks a key of a reconciler kind as needing a reconcile, in the caller's
// transaction, with one round trip in the common case:
//
//	no row ──DirtyTx──▶ waiting (row gen=1, one River job scheduled at not_before)
//	waiting ──DirtyTx──▶ waiting (gen+1; the earlier not_before wins and moves the job)
//	waiting ──job starts──▶ running (the job reads gen)
//	running ──DirtyTx──▶ running (gen+1; no second job: two reconciles never overlap)
//	running ──done, gen unchanged──▶ no row
//	running ──done, gen moved──▶ waiting (a follow-up job at not_before)
//
// A key therefore has at most one live River job, a wake-up during a run is never
// lost, and the row plus its job commit or roll back with the caller's change.
//
// Call DirtyTx after the transaction's own writes (as seed 003 writes its outbox row
// after the UPDATE that locks the item): the reconcile of the key locks the dirty
// row last, so taking it first and a domain row second could deadlock with it.
// PostgreSQL breaks such a deadlock (40P01, CONFLICT); nothing is lost, but it costs
// a retry.
package jobs
