package cli

import (
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/backfillworker"
	"github.com/bettercompute/bettercompute/workers/capacityworker"
	"github.com/bettercompute/bettercompute/workers/outboxworker"
	"github.com/bettercompute/bettercompute/workers/quorumworker"
	"github.com/bettercompute/bettercompute/workers/workflowworker"
	"github.com/prometheus/client_golang/prometheus"
)

// builtinModules are Better Compute's own modules, registered before the
// application's, in this order. Each says what it registers in a worker
// process, which collectors serve's /metrics reads and which endpoints serve
// mounts, as an application's module does: a new built-in module is one entry
// here, plus its migrations' owner in migrations.Owners. Their migrations are
// in the built-in set (migrations/, in migrations.Owners order), so they leave
// Migrations nil.
func builtinModules() []Module {
	return []Module{
		{
			Name: "tenancy",
			// Tenants: the held work of suspended tenants and each tenant's
			// limit are kept by the engine (workers); the module adds the
			// operator's endpoints, metrics and doctor check (the tenant
			// command is built in).
			Metrics: func(db *pg.Pool, _ *workers.Registry) ([]prometheus.Collector, error) {
				return []prometheus.Collector{newTenantCollector(db)}, nil
			},
			Routes: tenantRoutes,
			Checks: tenantChecks,
		},
		{
			Name: "outbox",
			// The outbox machinery runs in every worker process: sink delivery,
			// table dispatcher passes, and retention of the event log (which runs
			// even without a sink, keeping the replay window). Applications add
			// sinks (workers.AddSink) and dispatchers (outboxworker.AddDispatcher)
			// from their own modules, and options (outboxworker.Register).
			Register: func(r *workers.Registry) error { return outboxworker.Register(r, nil) },
			Metrics: func(db *pg.Pool, r *workers.Registry) ([]prometheus.Collector, error) {
				c, err := outboxworker.NewCollector(db, r)
				return []prometheus.Collector{c}, err
			},
			Routes: outboxRoutes,
		},
		{
			Name: "backfill",
			// Runs the backfills applications add (workers.AddBackfill) when an
			// operator starts one.
			Register: backfillworker.Register,
			Metrics: func(db *pg.Pool, _ *workers.Registry) ([]prometheus.Collector, error) {
				return []prometheus.Collector{backfillworker.NewCollector(db)}, nil
			},
		},
		{
			Name: "capacity",
			// Every worker process expires the holds of the shards it holds (the
			// fenced hold-expiry job) and runs the periodic safety sweep when
			// River elects it leader.
			Register: func(r *workers.Registry) error { return capacityworker.Register(r, nil) },
		},
		{
			Name: "quorum",
			// The apply and expiry jobs of quorum batches. Applications add an
			// applier per batch kind from their own module's Register
			// (quorumworker.AddApplier).
			Register: func(r *workers.Registry) error { return quorumworker.Register(r, nil) },
		},
		{
			Name: "workflow",
			// Durable workflows: the step worker, the timer wake-ups, retention
			// and the versioning check at start. Applications add their
			// definitions from their own module (workers.AddWorkflow).
			Register: func(r *workers.Registry) error { return workflowworker.Register(r, nil) },
			Metrics: func(db *pg.Pool, _ *workers.Registry) ([]prometheus.Collector, error) {
				return []prometheus.Collector{workflowworker.NewCollector(db), workflowworker.NewStepCollector(db)}, nil
			},
			Routes: workflowRoutes,
		},
		{
			Name: "confirmations",
			// Single-use links that signal a workflow: the public listener's
			// routes, and the operator's (the confirmation command is built in).
			PublicRoutes: confirmationPublicRoutes,
			Metrics: func(db *pg.Pool, _ *workers.Registry) ([]prometheus.Collector, error) {
				return []prometheus.Collector{newConfirmationCollector(db)}, nil
			},
			Routes: confirmationRoutes,
		},
	}
}
