// Package tenancy is Better Compute's tenants: the customers one deployment
// serves, whose work can be held and whose share of the workers is bounded.
//
// Work names its tenant through its context (workers.WithTenant): a dirty
// key, a fenced job, a workflow (and its children), an outbox event. A
// tenant's row appears the first time work names it.
//
// # States
//
//		(first work) ─▶ active ──Suspend──▶ suspended ──Resume──▶ active
//		                active | suspended ──Delete──▶ deleted (for good)
//
//	  - active: its work runs, at most MaxRunning units at once across every
//	    process (River jobs running plus reconcile batches in their
//	    transaction), taken round-robin with the other tenants' work.
//	  - suspended: its work is accepted and held, never lost: new work is
//	    enqueued as ever (the application's transaction does not fail because
//	    a customer's bill is unpaid), queued reconciles, fenced jobs and
//	    workflow steps do not start, a running one finishes and a workflow
//	    parks at its next step boundary; its reservations are refused, its
//	    bookings stay. Resume runs it all.
//	  - deleted: its waiting jobs are cancelled, its dirty keys dropped (DeleteTx),
//	    its unfinished workflows cancelled, each compensation running once
//	    (workflow.CancelTenantTx, in the same transaction); new work is
//	    CONFLICT. The application's own rows are left alone.
//
// # Invariants
//
//   - A tenant never runs more than MaxRunning units: River's fetch of a
//     shard queue and a reconcile batch's take both count its units under the
//     tenant's gate (an advisory lock let go at once), and a batch holds one
//     of its run slots (an advisory lock) until its transaction ends, so a
//     killed process's batch gives it back with its connection and a paused
//     one keeps it counted (migrations/tenancy).
//   - Nothing of a suspended tenant starts after Suspend commits; nothing
//     held is lost: held work stays where it waits (available jobs, waiting
//     keys) and runs after Resume.
//   - Delete waits for the enqueues in flight (the tenant's row, FOR UPDATE,
//     against their FOR KEY SHARE), so no work of a deleted tenant is left
//     waiting.
package tenancy
