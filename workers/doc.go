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
//	held ──every renewal──▶ hand back running jobs of the shard that another
//	                        client attempted ──▶ held
//	held ──lease lost──▶ cancel the shard's in-flight jobs ──▶ remove queue ──▶ want
//	held ──SIGTERM──▶ stop fetching; in-flight jobs finish within the grace period
//	                  or are cancelled and handed back ──▶ release the leases
//
// # Invariant: the holder owns every running job of its shard
//
// River would wait an hour to rescue a dead process's running jobs, and River's
// fetch is not fenced by our lease: a process paused past its lease that wakes
// can fetch jobs of a shard it no longer holds before its next lease round says
// so, and die holding them, with no takeover ever to come (the holder never
// changed). So:
//
//   - the holder hands back, at its takeover and after every lease round (so
//     within one renewal interval), every running job of its shard's queue whose
//     latest attempt is another client's, in one statement fenced by its own
//     lease (a process that lost the lease hands back nothing); the stray attempt
//     is fenced, so it can never commit;
//   - a job is not started, and is given back (snoozed), when its process does
//     not hold the shard's lease unexpired by its own clock; and an attempt that
//     fails after its process lost the lease is given back the same way, never
//     left to River's retry backoff (River's completer checks only state =
//     'running', so the stale attempt's outcome would land on the holder's
//     attempt of the same job).
//
// The holder also hands back its own running jobs that none of its goroutines
// works, that it attempted more than max(renewal, 5 s) ago and whose attempt
// did not return in this process within the last minute: attempts whose outcome
// River's completer could not record (the database restarted under them). A
// job whose Work returned is left alone for that minute, while the completer,
// which writes outcomes asynchronously and retries a failed write, records it:
// handing it back then would run a finished job again.
//
// Work therefore resumes within one TTL after a crash, and within one renewal
// interval of a stray fetch.
//
// The lease rounds, the identity heartbeat and the clock samples run on a
// control pool of their own (2 connections beside Options.Pool): jobs holding
// every connection of the work pool, for longer than the TTL, never delay a
// renewal, so a busy holder does not lose its own leases.
//
// # Identity: restarts resume at once
//
// Each Runtime claims a new incarnation of its worker identity at start
// (Options.Identity, HOST/SLOT by default) and owns its leases, its
// River client id and its jobs' attempted_by as IDENTITY#N. When the previous
// incarnation is gone (killed, crashed, stopped), the new one takes its leases
// at once with new epochs instead of waiting out their TTL, hands back its
// running jobs (shard jobs at the takeover, the maintenance queue's at start),
// clears River's leadership if it held it, and releases the leases it does not
// serve. A live duplicate makes Start return CONFLICT. A Runtime whose
// heartbeat finds a later incarnation cancels its jobs and closes Done (Err is
// the CONFLICT): the binary stops and exits.
//
// # The database restarting
//
// A fenced transaction that loses its connection is run again in place while
// the lease holds (pg.Disconnected): the job's fence keeps it exactly once, and
// the job does not wait for River's completer, which cannot write either. The
// lease keeper retries a round that could not reach the database every 100 ms,
// and River fetches again 5 ms after a full fetch (FetchCooldown), so a backlog
// built up during the outage drains at the machine's pace.
//
// # The fenced job transaction
//
// InTx runs a job's domain writes in one transaction that
//
//  1. locks the shard lease row FOR KEY SHARE with this process's owner and epoch,
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
//
// # Tracing
//
// With Options.TracerProvider set, every job River works is River's own work
// span (otelriver), in the trace of the span that inserted it, with the
// outcome above, the shard and the lease epoch as attributes; a refused fenced
// transaction is a span event, and each lease round that acquired, renewed or
// lost a lease is a span (see tracing.go). With it nil, none of this is
// installed.
//
// # Tenants
//
// A context may name the tenant its work is for (WithTenant): DirtyTx and
// InsertForKeyTx record it on the key or the job, and the work run for it
// gets a context that names it (TenantOf), so what that enqueues is the
// tenant's too. A shard's holder then takes due keys, and River fetches jobs,
// round-robin across tenants, each tenant running at most its limit of units
// across every process; a suspended tenant's work is held where it waits, and
// a workflow of one parks at its next step boundary. Work that names no
// tenant is taken as before (domain/tenancy, docs/tenancy.md).
package workers
