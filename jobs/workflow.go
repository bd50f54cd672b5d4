package jobs

// WorkflowStepKind is the River job kind of one step of a durable workflow
// (domain/workflow): the job the workflow's own transactions insert (start,
// each step's commit, a re-arm), never directly (StartWorkflowsSQL,
// StepWorkflowSQL).
const WorkflowStepKind = "workflow_step"
