package jobs

// OutboxDeliverKind is the River job kind of an outbox delivery: the job that
// delivers the next batch of the event log to one sink, in the maintenance
// queue, fenced by the sink's lease. Worker processes start it (one live job
// per sink); applications never insert it.
const OutboxDeliverKind = "outbox_deliver"

// OutboxDispatchKind is the River job kind of one pass of a table dispatcher:
// it claims, publishes and finishes batches until no row is due. The
// dispatcher's Notify and every reconcile interval insert it, in the
// maintenance queue.
const OutboxDispatchKind = "outbox_dispatch"
