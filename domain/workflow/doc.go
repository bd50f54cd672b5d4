// Package workflow is Better Compute's durable workflows: multi-step processes
// ("reserve, then wait up to 3 days for payment, then confirm or release")
// that survive crashes, deploys and paused processes, run as fenced River jobs.
//
// # The model: typed state plus named steps, no replay
//
// A Workflow[In, S, Out] is a kind, an input type In, a state type S, a result
// type Out and named steps. Each River job (kind workflow_step, in the shard
// queue the workflow's id picks, as keys do) runs exactly one step, which reads
// and changes the saved state and returns what comes next (Next): go to a
// step, sleep, await a signal with a timeout, start children and await them,
// finish, fail. Branching reads the saved state, so there are no determinism
// rules and no version patches: the code of a step may change between deploys
// as long as its name stays (see Versioning).
//
// # States of an instance
//
//	StartTx ─▶ running ──Goto(s)──────────────────────▶ running (s)
//	           running ──Sleep(d, s)──▶ sleeping ──wake_at reached──▶ running (s)
//	           running ──AwaitSignal(n, t, s, ts)──▶ waiting ─┬─ signal n ──▶ s (consumes it)
//	                                                          └─ deadline ──▶ ts
//	           running ──StartChildren(cs, s)──▶ waiting ─┬─ children done ──▶ s
//	                                                      └─ deadline ─────▶ ts
//	           running ──Finish(r)───────────────────────────▶ completed
//	           running ──Fail, or attempts exhausted───────────▶ failed (or OnError step)
//	           failed ──RetryTx──▶ running (the failed step)
//	           running|sleeping|waiting ──CancelTx─┬─ compensation ──▶ cancelling ──▶ cancelled
//	                                               └─ none ──────────────────────────▶ cancelled
//
// completed, failed and cancelled are finished: only RetryTx (of a failed
// workflow) moves one again, and retention prunes them.
//
// # Invariants
//
//   - Seq: an instance's seq grows by one at every transition, and each seq
//     has at most one River job (the instance's job_id). A step's fenced
//     transaction locks the instance row with the seq its job carries, so a
//     stale attempt, a duplicated job, a job superseded by a cancel or a
//     paused process that wakes commits nothing: its job completes as a no-op.
//   - Three fences before any write: the shard lease (FOR KEY SHARE, this
//     process's epoch), the job's attempt (its river_job row FOR UPDATE,
//     running), and the instance's seq (compare-and-set on its row, FOR NO
//     KEY UPDATE: every transaction that moves an instance takes that lock,
//     so they serialize). All three are checked in the step's transaction, so
//     at most one commit per seq, ever.
//   - A transactional step's domain writes, the new state, the history row,
//     the consumed signal, the started children and the next step's River job
//     commit together, exactly once, or not at all.
//   - An external step calls the outside world before its transaction, at
//     least once, with an idempotency key (Call.IdempotencyKey: id/step/seq)
//     that is the same on every retry of that step execution; its result is
//     recorded under the same three fences.
//   - Timers hold no worker and no connection: a sleeping or waiting instance
//     has one River job scheduled at its wake_at, and wake_at is on
//     compute_now(). Every worker process wakes the jobs whose wake_at has come
//     on compute_now() once a second, so a sim clock moved 3 days forward ends
//     a 3-day sleep at once.
//   - Signals never wait for a step, and are never lost: SignalTx stores the
//     signal in the workflow's inbox, in the sender's transaction, holding
//     the instance row FOR KEY SHARE only, which a step's FOR NO KEY UPDATE
//     does not conflict with: a step in progress, even in a process paused
//     mid-transaction, holds no signal up. It wakes the waiting job when the
//     workflow waits for that name. A transaction that commits a signal wait
//     (or finishes the workflow) runs a barrier inside its COMMIT, on the
//     server (migrations/workflow/0003_signal_barrier.sql): it takes the row
//     FOR UPDATE, so it waits for the signals in flight, then reads the inbox
//     and makes the waiting job due if a signal it names is there. A signal
//     whose lock comes after the barrier's waits for that COMMIT (no client
//     round trip) and then sees the wait and wakes the job. So in any
//     interleaving one sees the other: a committed signal resumes the next
//     await at once, never at a timeout. A signal accepted while a step
//     finishes the workflow commits before the finish (and stays unconsumed);
//     after the finish it is CONFLICT. A signal and its await's timeout are
//     decided in one fenced transaction holding the instance lock: exactly one
//     wins, and a signal that lost stays in the inbox for a later await. A
//     dedup key makes a repeated signal count once.
//   - A child's finish wakes its parent's waiting job when the parent's
//     condition (any or all of the children of that fan-out) holds; the child
//     locks its parent's row first, so the last child to finish sees every
//     sibling's outcome.
//   - Cancel bumps the seq of the workflow and of its unfinished descendants:
//     their outstanding jobs are cancelled or fenced; a declared compensation
//     step then runs once (its own seq). The cancel's reason is the workflow's
//     error from then on, cancelling and cancelled.
//
// # Trace context
//
// A step job carries its cause, the W3C traceparent of the span of the call
// that inserted it (platform/tracing.Cause), in its River metadata as
// {"traceparent": …}: the key River's OpenTelemetry middleware reads, so with it
// installed River's span of the job is in the cause's trace too. StartTx records
// the caller's span (the application's request); a step's transaction inserts
// the next step's job in the step's span (workers/workflowworker:
// bettercompute.workflow.step), and so do the children it starts; CancelTx and
// RetryTx record the operator's call. So the steps of a workflow chain in the
// request's trace, each the parent of the next. SignalTx records the sender's
// span on the signal's row (compute_workflow_signals.cause), and the step that
// consumes the signal links to it (Signal.Cause). With no sampled span nothing
// is stored (no metadata key, a NULL cause); a cause is only a traceparent,
// never the input, state or payload; a malformed one is ignored.
//
// # Versioning
//
// A worker records its definitions (kinds, step names, signals) in
// compute_workflow_kinds at migrate and at start, and refuses to start
// (INVALID_CONFIG, naming the workflows) when an unfinished workflow sits on a
// step its definitions lack. A state that no longer decodes into S fails the
// workflow with a clear error and cancels the step's job: never retried for
// ever.
package workflow
