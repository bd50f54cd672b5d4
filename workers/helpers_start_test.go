package workers_test

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/domain/workflow"
	"github.com/bettercompute/bettercompute/workers"
	"github.com/bettercompute/bettercompute/workers/workflowworker"
)

// startKind starts a workflow of kind with in, as the binary that defines the
// kind would (its definition lives in another binary, or the test wants a
// kind it does not register): a definition with the same kind and input type,
// and no Init.
func startKind[In any](ctx context.Context, tx pgx.Tx, kind string, in In, opts *workflow.StartOpts) (string, error) {
	return (&workflow.Workflow[In, struct{}, struct{}]{Kind: kind}).StartTx(ctx, tx, in, opts)
}

// addWorkflow registers d, with the workflow module that runs it (which
// cli.App registers for an application).
func addWorkflow(r *workers.Registry, d workflow.Definition) error {
	return errors.Join(workflowworker.Register(r, nil), workers.AddWorkflow(r, d))
}
