// Package workers runs Better Compute's River workers in a worker process: the
// Runtime (a River client, the shard leases and their queues), the fenced job
// transaction that every worker writing domain state uses (InTx), the reconcile
// worker, and the Registry through which modules contribute workers.
//
// # Shards and leases
//
// A worker process serves a set of shards. For each it wants the lease
// shard/<n>; while it holds the lease it works the River queue shard_<n>, and
// only then. Several processes may want the same shards: one holds each lease,
// the others retry at the holder's expiry, so a dead holder's shards move within
// one lease TTL and a stopped one's (its leases released) at once.
//
//	want ──lease acquired──▶ hand back the previous holder's running jobs of the
//	                         shard (in the acquiring transaction) ──▶ add queue
//	held ──lease lost──▶ cancel the shard's in-flight jobs ──▶ remove queue ──▶ want
//	held ──SIGTERM──▶ stop fetching; in-flight jobs finish within the grace period
//	                  or are cancelled and handed back ──▶ release the leases
//
// River would wait an hour to rescue a dead process's running jobs; the handback
// at takeover makes work resume within one TTL.
//
// # The fenced job transaction
//
// InTx runs a job's domain writes in one transaction that
//
//  1. locks the shard lease row FOR SHARE with this process's owner and epoch,
//  2. locks the job's own river_job row FOR UPDATE with this attempt and state
//     running (both in one round trip),
//  3. runs the worker's writes,
//  4. completes the job with river.JobCompleteTx and checks the returned state,
//  5. commits.
//
// A lost lease or a stale attempt (the job was handed back and another attempt
// runs) aborts with FENCED before any write, so a paused or partitioned process
// can never commit stale state: River's own completion checks only state =
// 'running', and a stale attempt would otherwise commit while the next one runs.
//
// # Outcomes
//
// One middleware turns errors into River outcomes: args that do not decode and
// INVALID_ARGUMENT cancel the job (never retried forever); FENCED gives the job
// back (snoozed briefly, for the lease holder to run); a panic fails that attempt
// only; anything else is retried with River's backoff, its message stored with
// secrets removed.
package workers
