package workers

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/tracing"
	"github.com/bettercompute/bettercompute/workers/internal/riverjob"
)

// What an application enqueues in its own transaction: a reconcile of a key
// (DirtyTx) and a fenced job of its own routed by a key (InsertForKeyTx). Both
// commit or roll back with the caller's transaction.

// DirtyOpts are DirtyTx's options.
type DirtyOpts struct {
	// Delay: the key is not reconciled before compute_now() + Delay. If the key is
	// already waiting, the earlier of the two times wins.
	Delay time.Duration
}

// DirtyTx marks key of reconciler kind as needing a reconcile, in tx: see "Reconcilers" in the package doc. If tx rolls back, so does the mark. It is one statement, the SQL function
// compute_mark_dirty (which triggers and other languages call the same way). It
// returns INVALID_ARGUMENT for a kind that is not [a-z][a-z0-9_]{0,62} or a key
// that is empty, longer than MaxKeyLen, not valid UTF-8 or holds a NUL byte,
// before any statement is sent: tx stays usable.
//
// The span of ctx, if sampled, is recorded as a cause of the key's next
// reconcile (tracing.Cause; see "Trace context" in the package doc). The
// tenant ctx names (WithTenant), if any, is the key's: its reconcile is held
// while the tenant is suspended and counts against its limit; a deleted
// tenant's dirty is CONFLICT.
func DirtyTx(ctx context.Context, tx pgx.Tx, kind, key string, opts *DirtyOpts) error {
	if err := riverjob.ValidateKind(kind); err != nil {
		return err
	}
	if err := riverjob.CheckKey("dirty "+kind, key); err != nil {
		return err
	}
	var delay time.Duration
	if opts != nil && opts.Delay > 0 {
		delay = opts.Delay
	}
	if delay > MaxDirtyDelay {
		return fault.New(fault.InvalidArgument, "dirty %s: delay %s is longer than %s", kind, delay, MaxDirtyDelay)
	}
	var tenant any
	if t := jobs.TenantOf(ctx); t != "" {
		if err := jobs.ValidateTenant(t); err != nil {
			return err
		}
		tenant = t
	}
	if _, err := tx.Exec(ctx, markDirtySQL, kind, key, delay.Seconds(), int64(jobs.KeyHash(key)), tracing.CauseOrNil(ctx), tenant); err != nil {
		return pg.Translate(fmt.Errorf("error marking %s/%s dirty: %w", kind, key, err))
	}
	return nil
}

// MaxDirtyDelay is the longest DirtyOpts.Delay: 100 years, as compute_mark_dirty.
const MaxDirtyDelay = 3155760000 * time.Second

// markDirtySQL calls compute_mark_dirty (migrations/tenancy/0002_tenant_work.sql):
// $1 kind, $2 key, $3 delay (s), $4 jobs.KeyHash(key), $5 the caller's cause (a
// traceparent, or NULL: then the transaction's bettercompute.traceparent), $6
// the tenant (NULL for none).
const markDirtySQL = `SELECT compute_mark_dirty($1, $2, $3::float8, $4::bigint, $5::text, $6::text)`

// InsertForKeyTx inserts a River job of an application's fenced kind (one
// registered with AddWorker) in the caller's transaction, into the
// shard queue key picks: the shard of key (jobs.ShardOf, as DirtyTx and workflows
// route), whose lease holder works it and fences its writes. If tx rolls back,
// so does the job. opts may set anything but the queue (nil for River's
// defaults and the args' own InsertOpts); a queue other than the key's shard
// queue is INVALID_ARGUMENT, and so is a key that is empty, longer than
// riverjob.MaxKeyLen, not valid UTF-8 or holding a NUL byte (refused before any
// statement is sent: tx stays usable).
//
//	_, err := workers.InsertForKeyTx(ctx, tx, orderID, ShipArgs{OrderID: orderID}, nil)
func InsertForKeyTx(ctx context.Context, tx pgx.Tx, key string, args river.JobArgs, opts *river.InsertOpts) (*rivertype.JobInsertResult, error) {
	if err := riverjob.CheckKey("InsertForKeyTx (the key picks the job's shard)", key); err != nil {
		return nil, err
	}
	queue, err := jobs.ShardQueueOfTx(ctx, tx, key)
	if err != nil {
		return nil, pg.Translate(fmt.Errorf("error reading the shard count: %w", err))
	}
	o := river.InsertOpts{}
	if opts != nil {
		o = *opts
	}
	if o.Queue != "" && o.Queue != queue {
		return nil, fault.New(fault.InvalidArgument, "InsertForKeyTx: opts.Queue is %s, but key %q belongs to %s (leave Queue empty: the key picks it)", o.Queue, key, queue)
	}
	o.Queue = queue
	return jobs.InsertTx(ctx, tx, args, &o)
}

// WithTenant is ctx naming tenant as the one whose work is enqueued with it:
// DirtyTx, InsertForKeyTx, a workflow's start, an outbox event record it (see
// "Tenants" in the package doc). Work run for a tenant gets a context that
// names it, so what it enqueues is the tenant's too. "" names none.
//
//	ctx = workers.WithTenant(ctx, "acme")
//	err := workers.DirtyTx(ctx, tx, "balance", accountID, nil)
func WithTenant(ctx context.Context, tenant string) context.Context {
	return jobs.WithTenant(ctx, tenant)
}

// TenantOf is the tenant ctx names ("" for none): in a reconcile, a job or a
// workflow step, the tenant the work is done for.
func TenantOf(ctx context.Context) string { return jobs.TenantOf(ctx) }
