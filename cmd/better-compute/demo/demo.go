// Package demo is the better-compute binary's demo application: what
// `better-compute dev` (and `go tool task dev`) runs on the embedded database
// to show the whole system working. Each demo is a cli.Module with its own
// tables (migrations.Demo: owners demo, demo_backfill, demo_domain,
// demo_outbox and demo_workflow), what it registers, and a Dev loop that plays
// the application:
//
//   - counters (owner demo): a table of counters and the demo_counter
//     reconciler, which copies each counter's value to its reconciled column;
//     the loop changes a random counter and marks it dirty, every 500 ms.
//   - backfill: demo_greetings fills in a greeting per person, 200 rows a batch;
//     the loop starts it, and again a minute after it is done.
//   - domain: capacity reservations on a pool of demo GPUs and quorum batches of
//     kind demo_change, applied into demo_domain_changes.
//   - outbox: orders whose events a log sink prints, and a table dispatcher that
//     "sends" each order's confirmation.
//   - workflow: orders as durable workflows (kind demo_order): each holds
//     devices of the demo pool, mails its customer a payment link (a
//     confirmation of its "paid" signal, through the outbox into the
//     demo_workflow_mailbox, shown at GET /demo/mailbox), waits 15 s for the
//     signal, then confirms the booking or releases the hold, with an event
//     either way; the loop places an order every 2 s and pays most of them by
//     confirming their links, cancels some and lets some time out.
//
// Only cmd/better-compute's main imports this package
// (cli.Main(cli.App{Modules: demo.Modules()})): an application's binary
// carries none of it.
package demo

import (
	"io/fs"

	"github.com/bettercompute/bettercompute/cmd/better-compute/cli"
	"github.com/bettercompute/bettercompute/migrations"
)

// migrationsOf is owner's directory of migrations.Demo.
func migrationsOf(owner string) fs.FS {
	sub, err := fs.Sub(migrations.Demo, owner)
	if err != nil {
		panic(err) // a constant path into an embedded FS
	}
	return sub
}

// Modules are the demo application's modules, in registration order.
func Modules() []cli.Module {
	return []cli.Module{demoModule(), demoBackfillModule(), demoDomainModule(), demoOutboxModule(), demoWorkflowModule()}
}
