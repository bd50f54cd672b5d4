// Package outboxworker runs the outbox's two delivery paths on River workers (the SQL
// is in domain/outbox). Its name lets an application import it beside domain/outbox.
//
// # Sinks (the event log)
//
// AddSink adds a named consumer of the event log to a worker registry.
// Every worker process then
//
//   - creates the sink's state at start (its cursor at Sink.From),
//   - polls, every Options.PollEvery, for sinks that have events after their
//     cursor and no live delivery job, and starts one (River job
//     outbox_deliver, maintenance queue): one live job per sink, whatever the
//     number of processes,
//   - hands back the delivery job of a process that died (its sink lease
//     expired while the job was running), so the batch is delivered again
//     within a lease TTL instead of River's one-hour rescue.
//
// A delivery job takes the sink's lease (sink/<name>, LeaseTTL, renewed every
// LeaseRenew while it runs), reads a batch, and moves the cursor past it in a
// transaction fenced by the lease and the job's attempt (workers.FenceTx,
// workers.InTxLease). A sink has one of two handlers:
//
//   - Handle is called outside any transaction, before the fenced one. Use it
//     for outside systems (a webhook, a broker, another database).
//   - HandleTx is called inside the fenced transaction, after the fence and
//     before the cursor moves, with that transaction. Use it for writes into
//     this database (projections, read models, counters).
//
// While batches come back full a job goes on (up to 2 s), then hands over to a
// fresh job. A handler error (or panic) is recorded on the sink and retried with
// backoff (1 s, 2 s … Options.SinkMaxBackoff); other sinks have their own jobs
// and go on.
//
// Guarantees, both handlers: (txid, seq) order per sink; a process that lost
// its lease (paused, partitioned) cannot move the cursor. Then:
//
//   - Handle: at least once. A crash or a lost lease between the handler and
//     the cursor advance redelivers the batch, whole. Make the handler
//     idempotent with each event's ID (TXID:SEQ).
//   - HandleTx: exactly once for its writes through the transaction. They
//     commit with the cursor or not at all: a handler error, a crash or a lost
//     lease commits neither, and a reset during the call rolls the handler's
//     writes back while the rest of the transaction (the lease's release, the
//     job's completion) commits. Writes on any other connection, or calls to
//     outside systems, are back to at least once. The transaction holds every
//     reader of the log at its txid while it is open: keep the handler short.
//
// Each delivered batch is a span, bettercompute.outbox.deliver (the sink, the
// number of events, the outcome), caused by the spans that appended its events
// (domain/outbox: Event.Cause): its parent is the first one, so the delivery is
// in the trace of the request or reconcile that appended it, and each cause is
// a link (at most tracing.MaxCauses), as is River's span of the delivery job
// when there is one.
//
// # Table dispatchers
//
// NewDispatcher defines a dispatcher over an application-owned outbox table
// (seed 003's "Deliver an outbox"); AddDispatcher runs its passes as River
// jobs (outbox_dispatch, maintenance queue) every ReconcileInterval and on
// Notify. A pass claims batches until no row is due; Reconcile runs one in the
// calling process and returns the count (a call while a pass of the same
// dispatcher runs in this process joins it). Guarantees are those of
// domain/outbox's claim (per key in order, different keys in parallel, retries
// without end after 2, 4 … 256 s, one claim at a time across replicas) plus: a
// batch that outlives its claim timeout starts no further publish, and each
// publish's context ends at the claim's deadline. A dispatcher's rows are the
// application's own table, which records no trace context: a pass is not a span
// caused by the request that wrote its rows.
//
// # Retention
//
// A periodic job (outbox_retention, every Options.RetentionEvery) deletes, in
// bounded batches, the events every sink has delivered and that are older than
// Options.Retain (the SSE replay window, 24 h by default).
//
// # Caveat
//
// Delivery jobs and passes share the maintenance queue (4 workers per process)
// with other housekeeping. A slow handler or publish holds one of them while it
// runs: bound handlers with a deadline, and run more worker processes for many
// slow sinks.
package outboxworker
