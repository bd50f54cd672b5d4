// Package riverjob is the worker engine's half of package jobs: what only the
// packages under workers/ use, kept out of jobs' exported surface (the
// internal rule lets no other package import it). It holds the args of the
// River jobs only workers insert and work (Reconcile, ReconcileBatch, Resync,
// the outbox's, the workflow step's, the capacity sweep's; their kinds stay in
// jobs when the command or the demo names them), the checks of a reconciler
// kind and of a key (ValidateKind, CheckKey), RecordFencedKinds, and in
// riverjob.go the engine's statements on River's tables: the fences'
// hand-backs, the batched reconciles, the metrics' counts and the workflow
// step's completion and hand-over. riverjob_test.go checks those statements
// against River's schema and defaults, as jobs' own test checks jobs'.
//
// It imports jobs (queues, kinds, the statements it composes with) and
// platform; jobs imports nothing of it.
package riverjob
