// Package jobs holds the job kinds and args the domain packages enqueue, the
// helpers that route them (the shard of a key, its queue), and the statements
// on River's tables that the domain packages and the command run. What only
// the worker engine uses (the args of the jobs only workers insert, the
// statements of its fences, hand-backs and batched reconciles) is in
// workers/internal/riverjob, which only packages under workers/ can import.
// It imports only River, pgx, the standard library, platform/fault (the one
// error type, itself standard library only) and platform/tracing (the
// OpenTelemetry API, no SDK), so enqueueing never pulls in worker code. Bad
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
// workers.InsertForKeyTx puts it in the shard queue of a key, in the caller's
// transaction. Its kind is recorded in compute_fenced_kinds (at migrate and
// worker start, by workers/internal/riverjob.RecordFencedKinds), and a trigger
// on river_job refuses a job of a recorded kind in any other queue
// (INVALID_ARGUMENT), where no worker would ever take it:
//
//	no job ──InsertForKeyTx(key)──▶ available in shard_<ShardOf(key)>
//	no job ──InsertTx(queue default)──▶ refused (fenced kind) | available (other kind)
//
// # DirtyTx: a work queue in compute_dirty
//
// workers.DirtyTx marks a key of a reconciler kind as needing a reconcile, in
// the caller's transaction, with one statement: the SQL function
// compute_mark_dirty, which triggers and other languages call the same way. It
// upserts the key's row in compute_dirty and inserts no River job:
//
//	no row ──DirtyTx──▶ waiting (row gen=1, job_id NULL, not_before)
//	waiting ──DirtyTx──▶ waiting (gen+1; the earlier not_before wins)
//
// The holder of the key's shard takes due keys from that table in batches,
// each batch one fenced transaction that writes no River job; a key that fails
// alone becomes a River job of its own. What happens to a key from there is
// drawn once, in workers/reconcile.go. (A batch River job, kind
// ReconcileBatchKind, is what an older binary claimed; workers still work one.)
// A wake-up during a run is never lost, and the row commits or rolls back with
// the caller's change.
//
// Call DirtyTx after the transaction's own writes (as seed 003 writes its outbox row
// after the UPDATE that locks the item): the reconcile of the key locks the dirty
// row last, so taking it first and a domain row second could deadlock with it.
// PostgreSQL breaks such a deadlock (40P01, CONFLICT); nothing is lost, but it costs
// a retry.
//
// # Trace context
//
// A dirty records its cause: the W3C traceparent of the caller's sampled span
// (tracing.Cause), nothing else. DirtyTx passes the span of its ctx; a call of
// compute_mark_dirty without one (a trigger's) takes the transaction's setting
// bettercompute.traceparent, which TraceTx sets from ctx. The causes gather on the
// key's row (compute_dirty.trace_links) until a claim takes them, each once and
// at most tracing.MaxCauses (later ones are dropped), so a key dirtied by two
// requests before its reconcile keeps both:
//
//	no row ──DirtyTx (request A)──▶ waiting, trace_links {A}
//	waiting ──DirtyTx (request B)──▶ waiting, trace_links {A, B}
//	waiting ──taken by a batch──▶ trace_claimed {A, B}, trace_links NULL (a later dirty starts afresh)
//
// The reconcile's span (workers: bettercompute.reconcile) has the first cause of
// its batch as parent when it has no other (the claimed path, where no River span
// runs), so it is in request A's trace, and a link to every cause of every key
// of the batch (at most MaxCauses). A key failing alone keeps its causes for its
// own job. With no sampled span the column stays NULL and a dirty costs one
// check; a malformed cause is ignored, never an error.
package jobs
