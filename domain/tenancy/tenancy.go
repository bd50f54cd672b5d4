package tenancy

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
)

// State is a tenant's state.
type State string

// The states of a tenant.
const (
	Active    State = "active"
	Suspended State = "suspended"
	Deleted   State = "deleted"
)

// Tenant is a tenant and its work now.
type Tenant struct {
	Name       string    `json:"name"`
	State      State     `json:"state"`
	MaxRunning int       `json:"max_running"`
	Reason     string    `json:"reason,omitempty"`
	CreatedAt  time.Time `json:"created_at"`
	ChangedAt  time.Time `json:"changed_at"`
	// Running is its units running now (compute_tenant_running); Waiting its
	// River jobs waiting to run and its dirty keys; Workflows its unfinished
	// workflows.
	Running   int64 `json:"running"`
	Waiting   int64 `json:"waiting"`
	Workflows int64 `json:"workflows"`
}

const tenantColumns = `t.name, t.state, t.max_running, coalesce(t.reason, ''), t.created_at, t.changed_at,
    compute_tenant_running(t.name),
    (SELECT count(*) FROM river_job j WHERE j.state IN ('available', 'scheduled', 'retryable', 'pending')
        AND j.metadata ? 'tenant' AND (j.metadata ->> 'tenant') = t.name)
  + (SELECT count(*) FROM compute_dirty d WHERE d.tenant = t.name),
    (SELECT count(*) FROM compute_workflows w WHERE w.tenant = t.name
        AND w.status IN ('running', 'sleeping', 'waiting', 'cancelling'))`

func scanTenant(row pgx.Row) (*Tenant, error) {
	var t Tenant
	err := row.Scan(&t.Name, &t.State, &t.MaxRunning, &t.Reason, &t.CreatedAt, &t.ChangedAt, &t.Running, &t.Waiting, &t.Workflows)
	return &t, err
}

// List returns every tenant, by name (state "" for all, or only those in state).
func List(ctx context.Context, db pg.DBTX, state State) ([]Tenant, error) {
	rows, err := db.Query(ctx, `SELECT `+tenantColumns+` FROM compute_tenants t
WHERE $1 = '' OR t.state = $1 ORDER BY t.name`, string(state))
	if err != nil {
		return nil, pg.Translate(err)
	}
	defer rows.Close()
	var out []Tenant
	for rows.Next() {
		t, err := scanTenant(rows)
		if err != nil {
			return nil, pg.Translate(err)
		}
		out = append(out, *t)
	}
	return out, pg.Translate(rows.Err())
}

// Get returns tenant name: NOT_FOUND if no work ever named it,
// INVALID_ARGUMENT for a bad name.
func Get(ctx context.Context, db pg.DBTX, name string) (*Tenant, error) {
	if err := jobs.ValidateTenant(name); err != nil {
		return nil, err
	}
	t, err := scanTenant(db.QueryRow(ctx, `SELECT `+tenantColumns+` FROM compute_tenants t WHERE t.name = $1`, name))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fault.New(fault.NotFound, "no tenant %s: no work has named it", name)
	}
	return t, pg.Translate(err)
}

// lockTx locks tenant name FOR UPDATE in tx (waiting for the enqueues in
// flight) and returns its state: NOT_FOUND for an unknown one, CONFLICT for
// a deleted one.
func lockTx(ctx context.Context, tx pgx.Tx, name string) (State, error) {
	if err := jobs.ValidateTenant(name); err != nil {
		return "", err
	}
	var st State
	err := tx.QueryRow(ctx, `SELECT state FROM compute_tenants WHERE name = $1 FOR UPDATE`, name).Scan(&st)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", fault.New(fault.NotFound, "no tenant %s: no work has named it", name)
	}
	if err != nil {
		return "", pg.Translate(err)
	}
	if st == Deleted {
		return st, fault.New(fault.Conflict, "tenant %s is deleted", name)
	}
	return st, nil
}

// checkReason refuses a reason over 500 bytes or that is not text.
func checkReason(reason string) error {
	if len(reason) > 500 {
		return fault.New(fault.InvalidArgument, "reason: at most 500 bytes, got %d", len(reason))
	}
	return fault.CheckText("reason", reason)
}

// setState moves tenant name to st with reason, in tx, and returns its state
// before.
func setState(ctx context.Context, tx pgx.Tx, name string, st State, reason string) (State, error) {
	if err := checkReason(reason); err != nil {
		return "", err
	}
	was, err := lockTx(ctx, tx, name)
	if err != nil {
		return was, err
	}
	_, err = tx.Exec(ctx, `UPDATE compute_tenants SET state = $2, reason = nullif($3, ''), changed_at = compute_now() WHERE name = $1`,
		name, string(st), reason)
	return was, pg.Translate(err)
}

// SuspendTx suspends tenant name in tx: from its commit none of its work
// starts (what runs finishes), its new work is accepted and held, its
// reservations are refused. Suspending a suspended tenant does nothing.
func SuspendTx(ctx context.Context, tx pgx.Tx, name, reason string) error {
	_, err := setState(ctx, tx, name, Suspended, reason)
	return err
}

// ResumeTx makes tenant name active again in tx: its held work runs.
func ResumeTx(ctx context.Context, tx pgx.Tx, name string) error {
	_, err := setState(ctx, tx, name, Active, "")
	return err
}

// SetLimitTx sets how many units of tenant name's work may run at once
// across every process (n > 0).
func SetLimitTx(ctx context.Context, tx pgx.Tx, name string, n int) error {
	if n <= 0 || n > 1_000_000 {
		return fault.New(fault.InvalidArgument, "limit of tenant %s: want 1 to 1000000, got %d", name, n)
	}
	if _, err := lockTx(ctx, tx, name); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `UPDATE compute_tenants SET max_running = $2, changed_at = compute_now() WHERE name = $1`, name, n)
	return pg.Translate(err)
}

// Deletion is what a tenant's deletion cancelled.
type Deletion struct {
	Jobs      int64 `json:"jobs"`      // River jobs that waited to run
	Keys      int64 `json:"keys"`      // dirty keys
	Workflows int   `json:"workflows"` // unfinished workflows cancelled (workflow.CancelTenantTx; their compensation runs once)
}

// DeleteTx deletes tenant name in tx, for good: its waiting jobs are
// cancelled and its dirty keys dropped; its new work is CONFLICT from the
// commit. A running job finishes. The application's rows are left alone. Its
// unfinished workflows are cancelled by workflow.CancelTenantTx, which the
// caller runs in the same tx (the tenant command does both; domain packages
// do not import each other).
func DeleteTx(ctx context.Context, tx pgx.Tx, name, reason string) (*Deletion, error) {
	if reason == "" {
		reason = "tenant deleted"
	}
	if _, err := setState(ctx, tx, name, Deleted, reason); err != nil {
		return nil, err
	}
	var d Deletion
	if err := tx.QueryRow(ctx, jobs.CancelTenantWorkSQL, name, time.Now().UTC(), "tenant "+name+" deleted: "+reason).
		Scan(&d.Jobs, &d.Keys); err != nil {
		return nil, pg.Translate(fmt.Errorf("error cancelling the work of tenant %s: %w", name, err))
	}
	return &d, nil
}
