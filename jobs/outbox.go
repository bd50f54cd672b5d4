package jobs

// OutboxDeliver is the River job that delivers the next batch of the event log
// to one sink, in the maintenance queue, fenced by the sink's lease. Worker
// processes start it (one live job per sink); applications never insert it.
type OutboxDeliver struct {
	Sink string `json:"sink"`
}

// OutboxDeliverKind is OutboxDeliver's River job kind.
const OutboxDeliverKind = "outbox_deliver"

// Kind implements river.JobArgs.
func (OutboxDeliver) Kind() string { return OutboxDeliverKind }

// OutboxDispatch is the River job that runs one pass of a table dispatcher: it
// claims, publishes and finishes batches until no row is due. It is inserted by
// the dispatcher's Notify and every reconcile interval, in the maintenance queue.
type OutboxDispatch struct {
	Dispatcher string `json:"dispatcher"`
}

// OutboxDispatchKind is OutboxDispatch's River job kind.
const OutboxDispatchKind = "outbox_dispatch"

// Kind implements river.JobArgs.
func (OutboxDispatch) Kind() string { return OutboxDispatchKind }

// OutboxRetention is the periodic River job that prunes, in bounded batches, the
// events every sink cursor has passed and that are older than the replay window.
type OutboxRetention struct{}

// outboxRetentionKind is OutboxRetention's River job kind.
const outboxRetentionKind = "outbox_retention"

// Kind implements river.JobArgs.
func (OutboxRetention) Kind() string { return outboxRetentionKind }
