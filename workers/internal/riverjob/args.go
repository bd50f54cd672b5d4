package riverjob

import (
	"encoding/json"

	"github.com/riverqueue/river"

	"github.com/bettercompute/bettercompute/jobs"
)

// The args of the River jobs that only the worker engine inserts and works
// (the workers' maintenance and workflow jobs); the jobs that domain
// packages insert have their args in jobs.

// OutboxDeliver is the River job that delivers the next batch of the event log
// to one sink, in the maintenance queue, fenced by the sink's lease. Worker
// processes start it (one live job per sink); applications never insert it.
// Its kind is jobs.OutboxDeliverKind.
type OutboxDeliver struct {
	Sink string `json:"sink"`
}

// Kind implements river.JobArgs.
func (OutboxDeliver) Kind() string { return jobs.OutboxDeliverKind }

// OutboxDispatch is the River job that runs one pass of a table dispatcher: it
// claims, publishes and finishes batches until no row is due. It is inserted by
// the dispatcher's Notify and every reconcile interval, in the maintenance queue.
// Its kind is jobs.OutboxDispatchKind.
type OutboxDispatch struct {
	Dispatcher string `json:"dispatcher"`
}

// Kind implements river.JobArgs.
func (OutboxDispatch) Kind() string { return jobs.OutboxDispatchKind }

// OutboxRetention is the periodic River job that prunes, in bounded batches, the
// events every sink cursor has passed and that are older than the replay window.
type OutboxRetention struct{}

// outboxRetentionKind is OutboxRetention's River job kind.
const outboxRetentionKind = "outbox_retention"

// Kind implements river.JobArgs.
func (OutboxRetention) Kind() string { return outboxRetentionKind }

// WorkflowStep is the River job that runs one step of a durable workflow
// (domain/workflow). It is inserted by the workflow's own transactions (start,
// each step's commit, a re-arm), never directly; River UI shows its args. Its
// kind is jobs.WorkflowStepKind.
type WorkflowStep struct {
	WorkflowID string `json:"workflow_id"`
	Workflow   string `json:"workflow"` // the workflow kind
	Step       string `json:"step"`
	// Seq is the instance's sequence number this job may advance: the
	// compare-and-set its fenced transaction checks.
	Seq int64 `json:"seq"`
}

// Kind implements river.JobArgs.
func (WorkflowStep) Kind() string { return jobs.WorkflowStepKind }

// UnmarshalJSON rejects args without a workflow id or a sequence number, so a
// malformed job is cancelled at decode instead of advancing nothing.
func (a *WorkflowStep) UnmarshalJSON(b []byte) error {
	type plain WorkflowStep
	var p plain
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	if p.WorkflowID == "" || p.Seq <= 0 {
		return invalid("workflow_step job args need a workflow_id and a seq: %s", b)
	}
	*a = WorkflowStep(p)
	return nil
}

// WorkflowPrune is the periodic maintenance job that deletes finished
// workflows past their retention.
type WorkflowPrune struct{}

// workflowPruneKind is WorkflowPrune's River job kind.
const workflowPruneKind = "workflow_prune"

// Kind implements river.JobArgs.
func (WorkflowPrune) Kind() string { return workflowPruneKind }

// InsertOpts puts it in the maintenance queue, one at a time.
func (WorkflowPrune) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: jobs.MaintenanceQueue, UniqueOpts: river.UniqueOpts{ByState: jobs.LiveStates}}
}

// CapacityExpirySweep is the periodic, unfenced safety net of hold expiry: it
// enqueues a jobs.CapacityHoldExpiry for every hold overdue by more than a grace
// period (its job was cancelled or discarded by an operator, say). It runs in the
// maintenance queue and writes nothing but unique jobs.
type CapacityExpirySweep struct{}

// CapacityExpirySweepKind is CapacityExpirySweep's River job kind.
const CapacityExpirySweepKind = "capacity_expiry_sweep"

// Kind implements river.JobArgs.
func (CapacityExpirySweep) Kind() string { return CapacityExpirySweepKind }
