package workflowworker_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/tenancy"
	"github.com/bettercompute/bettercompute/domain/workflow"
	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
)

// tenantTx runs f in a transaction on db.
func tenantTx(t *testing.T, db *pg.Pool, f func(ctx context.Context, tx pgx.Tx) error) {
	t.Helper()
	require.NoError(t, pg.InTx(context.Background(), db, f))
}

// startFor starts workflow kind id for tenant.
func startFor(t *testing.T, db *pg.Pool, tenant, kind, id string) error {
	t.Helper()
	return pg.InTx(context.Background(), db, func(ctx context.Context, tx pgx.Tx) error {
		_, err := startKind(jobs.WithTenant(ctx, tenant), tx, kind, orderIn{Order: id}, &workflow.StartOpts{ID: id})
		return err
	})
}

// TestSuspendingATenantParksItsWorkflowAtTheNextStepBoundary: a tenant is
// suspended while one of its workflows runs a step (held in the step's
// transaction). The step commits; the workflow parks at its next step (no
// inline run, its job held by the fetch), and so does a workflow started
// while the tenant is suspended (accepted and held); another tenant's
// workflow runs meanwhile. After resume every step runs, each exactly once.
func TestSuspendingATenantParksItsWorkflowAtTheNextStepBoundary(t *testing.T) {
	t.Parallel()
	entered, release := make(chan string, 4), make(chan struct{})
	var holdFirst atomic.Bool
	holdFirst.Store(true)
	wf := chainWorkflow("tenant_chain", 4, func(ctx context.Context, tx pgx.Tx, c *workflow.Call[orderState]) error {
		if c.Step == "s1" && c.WorkflowID == "acme-1" && holdFirst.Load() {
			entered <- c.WorkflowID
			<-release
		}
		if got := jobs.TenantOf(ctx); got != map[bool]string{true: "acme", false: "globex"}[c.WorkflowID[:4] == "acme"] {
			return fmt.Errorf("step of %s ran with tenant %q in its context", c.WorkflowID, got)
		}
		return nil
	})
	e := start(t, wf)
	db := e.db.Pool
	require.NoError(t, startFor(t, db, "acme", "tenant_chain", "acme-1"))
	<-entered // acme-1's first step is in its transaction
	tenantTx(t, db, func(ctx context.Context, tx pgx.Tx) error { return tenancy.SuspendTx(ctx, tx, "acme", "unpaid") })
	holdFirst.Store(false)
	close(release)

	require.NoError(t, startFor(t, db, "acme", "tenant_chain", "acme-2"), "a suspended tenant's new work is accepted")
	require.NoError(t, startFor(t, db, "globex", "tenant_chain", "globex-1"))
	i := wait(t, db, "globex-1")
	require.Equal(t, workflow.Completed, i.Status, "another tenant's workflow runs")
	require.Eventually(t, func() bool {
		return e.db.MustCount(t, `SELECT count(*) FROM compute_workflow_history WHERE workflow_id = 'acme-1'`) == 1
	}, 30*time.Second, 10*time.Millisecond, "the running step commits")
	time.Sleep(time.Second) // polls and wakes go by: nothing of acme's starts
	require.Equal(t, 1, e.db.MustCount(t, `SELECT count(*) FROM compute_workflow_history WHERE workflow_id LIKE 'acme-%'`),
		"only the step that was running when the tenant was suspended committed")
	require.Equal(t, 2, e.db.MustCount(t, `SELECT count(*) FROM river_job WHERE state = 'available' AND metadata->>'tenant' = 'acme'`),
		"each held workflow's next step waits in a job of its own")
	for _, id := range []string{"acme-1", "acme-2"} {
		i, err := workflow.Get(context.Background(), db, id)
		require.NoError(t, err)
		require.Equal(t, workflow.Running, i.Status, id)
	}

	tenantTx(t, db, func(ctx context.Context, tx pgx.Tx) error { return tenancy.ResumeTx(ctx, tx, "acme") })
	for _, id := range []string{"acme-1", "acme-2"} {
		require.Equal(t, workflow.Completed, wait(t, db, id).Status, id)
		requireChainOnce(t, e.db, id, 4)
	}
}

// TestDeletingATenantCancelsItsWaitingWorkflowsAndCompensatesOnce: a tenant
// with workflows waiting for a signal and sleeping on a timer is deleted;
// each is cancelled and its compensation runs once; the signal and the timer
// that come afterwards run nothing; another tenant's waiting workflow goes on;
// the deleted tenant's new work is refused and the application's rows stay.
func TestDeletingATenantCancelsItsWaitingWorkflowsAndCompensatesOnce(t *testing.T) {
	t.Parallel()
	var undo atomic.Int32
	compensated := func(ctx context.Context, tx pgx.Tx, c *workflow.Call[orderState]) (workflow.Next, error) {
		if !c.Cancelled {
			return workflow.Next{}, errors.New("compensation without Cancelled")
		}
		undo.Add(1)
		return workflow.Finish(nil), effect(ctx, tx, c)
	}
	waiter := orderWorkflow()
	waiter.Kind = "tenant_order"
	waiter.Steps = append(waiter.Steps, workflow.Step[orderState]{Name: "undo", Tx: compensated})
	waiter.Compensate = "undo"
	sleeper := &workflow.Workflow[orderIn, orderState, orderOut]{
		Kind: "tenant_sleeper",
		Steps: []workflow.Step[orderState]{
			{Name: "nap", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[orderState]) (workflow.Next, error) {
				return workflow.Sleep(time.Hour, "wake"), effect(ctx, tx, c)
			}},
			{Name: "wake", Tx: func(ctx context.Context, tx pgx.Tx, c *workflow.Call[orderState]) (workflow.Next, error) {
				return workflow.Finish(orderOut{}), effect(ctx, tx, c)
			}},
			{Name: "undo", Tx: compensated},
		},
		Compensate: "undo",
	}
	e := start(t, waiter, sleeper)
	db := e.db.Pool
	ctx := context.Background()
	require.NoError(t, startFor(t, db, "acme", "tenant_order", "acme-order"))
	require.NoError(t, startFor(t, db, "acme", "tenant_sleeper", "acme-nap"))
	require.NoError(t, startFor(t, db, "globex", "tenant_order", "globex-order"))
	waitStatus(t, db, "acme-order", workflow.Waiting)
	waitStatus(t, db, "acme-nap", workflow.Sleeping)
	waitStatus(t, db, "globex-order", workflow.Waiting)
	before := e.db.MustCount(t, `SELECT count(*) FROM wf_effects`)

	var d *tenancy.Deletion
	tenantTx(t, db, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		d, err = tenancy.DeleteTx(ctx, tx, "acme", "contract ended")
		if err != nil {
			return err
		}
		d.Workflows, err = workflow.CancelTenantTx(ctx, tx, "acme", "contract ended")
		return err
	})
	require.Equal(t, 2, d.Workflows)
	for _, id := range []string{"acme-order", "acme-nap"} {
		i := wait(t, db, id)
		require.Equal(t, workflow.Cancelled, i.Status, id)
		require.Contains(t, i.Error, "contract ended", id)
	}
	// The signal and the timer come too late.
	_, err := e.db.Exec(ctx, `SELECT compute_advance_sim_clock(interval '2 hours')`)
	require.NoError(t, err)
	err = pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		_, err := workflow.SignalTx(ctx, tx, "acme-order", "paid", map[string]int{"amount": 1}, nil)
		return err
	})
	require.Equal(t, fault.Conflict, fault.CodeOf(err), "%v", err)
	require.Equal(t, workflow.Completed, func() workflow.Status {
		signal(t, db, "globex-order", "paid", map[string]int{"amount": 5}, "")
		return wait(t, db, "globex-order").Status
	}(), "another tenant's waiting workflow goes on")
	time.Sleep(300 * time.Millisecond)
	require.Equal(t, int32(2), undo.Load(), "each compensation ran once")
	require.Equal(t, 1, e.db.MustCount(t, `SELECT count(*) FROM wf_effects WHERE workflow_id = 'acme-order' AND step = 'undo'`))
	require.Equal(t, 1, e.db.MustCount(t, `SELECT count(*) FROM wf_effects WHERE workflow_id = 'acme-nap' AND step = 'undo'`))
	require.Zero(t, e.db.MustCount(t, `SELECT count(*) FROM wf_effects WHERE step IN ('confirm', 'release', 'wake') AND workflow_id LIKE 'acme-%'`))
	require.Equal(t, before+3, e.db.MustCount(t, `SELECT count(*) FROM wf_effects`),
		"the application's rows stay: two compensations and globex's confirm added, nothing removed")

	err = startFor(t, db, "acme", "tenant_order", "acme-order-2")
	require.Equal(t, fault.Conflict, fault.CodeOf(err), "%v", err)
	require.Contains(t, err.Error(), "tenant acme is deleted")
}
