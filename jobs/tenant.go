package jobs

import (
	"bytes"
	"context"
	"encoding/json"
	"regexp"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
)

// Tenants (the tenancy module, migrations/tenancy): work of every kind may
// name the tenant it is done for. The tenant travels in the context, as the
// trace context does: WithTenant names it, every enqueue made with that
// context records it (a dirty key, a River job, a workflow, an outbox event),
// and work run for a tenant (a reconcile batch, a job, a workflow step) runs
// with a context that names it, so what it enqueues in turn is the tenant's
// too. Work that names no tenant is enqueued and taken as before.

// TenantKey is the key of a River job's metadata that names its tenant.
const TenantKey = "tenant"

// MaxTenantLen is the longest tenant name, in bytes.
const MaxTenantLen = 200

var tenantRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:@-]{0,199}$`)

// ValidateTenant returns INVALID_ARGUMENT unless name is 1 to 200 of
// A-Z a-z 0-9 . _ : @ -, starting with a letter or a digit.
func ValidateTenant(name string) error {
	if !tenantRe.MatchString(name) {
		return fault.New(fault.InvalidArgument, "tenant %q: want 1 to %d of A-Z a-z 0-9 . _ : @ -, starting with a letter or a digit", name, MaxTenantLen)
	}
	return nil
}

type tenantCtxKey struct{}

// WithTenant is ctx naming tenant as the one the work enqueued with it is
// done for ("" names none). The name is checked where the work is enqueued.
func WithTenant(ctx context.Context, tenant string) context.Context {
	return context.WithValue(ctx, tenantCtxKey{}, tenant)
}

// TenantOf is the tenant ctx names ("" for none).
func TenantOf(ctx context.Context) string {
	t, _ := ctx.Value(tenantCtxKey{}).(string)
	return t
}

// tenantUseSQL: compute_tenant_use (migrations/tenancy/0001_tenant_states.sql).
const tenantUseSQL = `SELECT compute_tenant_use($1)`

// UseTenantTx is the check every enqueue for tenant makes in tx, before its
// work is written: the tenant's row (made if new) is held until tx ends, so a
// delete waits for this work and then cancels it. INVALID_ARGUMENT for a bad
// name (before any statement: tx stays usable); CONFLICT for a deleted
// tenant. A suspended tenant's work is accepted and held.
func UseTenantTx(ctx context.Context, tx pgx.Tx, tenant string) error {
	if err := ValidateTenant(tenant); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, tenantUseSQL, tenant); err != nil {
		return pg.Translate(err)
	}
	return nil
}

// TenantOfMetadata is the tenant a River job's metadata names ("" for none).
func TenantOfMetadata(metadata []byte) string {
	if !bytes.Contains(metadata, []byte(`"tenant"`)) {
		return ""
	}
	var m struct {
		Tenant string `json:"tenant"`
	}
	_ = json.Unmarshal(metadata, &m)
	return m.Tenant
}

// withMetadata is metadata (a JSON object, or empty) with key set to v.
func withMetadata(metadata []byte, key string, v string) ([]byte, error) {
	m := map[string]json.RawMessage{}
	if len(metadata) > 0 {
		if err := json.Unmarshal(metadata, &m); err != nil {
			return nil, err
		}
	}
	enc, _ := json.Marshal(v)
	m[key] = enc
	return json.Marshal(m)
}
