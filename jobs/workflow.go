package jobs

import (
	"encoding/json"

	"github.com/riverqueue/river"
)

// WorkflowStep is the River job that runs one step of a durable workflow
// (domain/workflow). It is inserted by the workflow's own transactions (start,
// each step's commit, a re-arm), never directly; River UI shows its args.
type WorkflowStep struct {
	WorkflowID string `json:"workflow_id"`
	Workflow   string `json:"workflow"` // the workflow kind
	Step       string `json:"step"`
	// Seq is the instance's sequence number this job may advance: the
	// compare-and-set its fenced transaction checks.
	Seq int64 `json:"seq"`
}

// WorkflowStepKind is WorkflowStep's River job kind.
const WorkflowStepKind = "workflow_step"

// Kind implements river.JobArgs.
func (WorkflowStep) Kind() string { return WorkflowStepKind }

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
	return river.InsertOpts{Queue: MaintenanceQueue, UniqueOpts: river.UniqueOpts{ByState: liveStates}}
}
