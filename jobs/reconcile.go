package jobs

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"regexp"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/tracing"
)

// Reconcile is the River job that reconciles one key of a reconciler kind on its
// own: a key whose reconcile failed in a batch gets one, retried with River's
// backoff, its errors and attempts shown in River UI. It is inserted by the
// workers, never directly.
type Reconcile struct {
	Reconciler string `json:"reconciler"` // the reconciler kind
	Key        string `json:"key"`
}

// ReconcileKind is Reconcile's River job kind.
const ReconcileKind = "reconcile"

// Kind implements river.JobArgs.
func (Reconcile) Kind() string { return ReconcileKind }

// UnmarshalJSON rejects args without a kind or a key, so a malformed job fails
// at decode (and is cancelled) instead of reconciling nothing.
func (r *Reconcile) UnmarshalJSON(b []byte) error {
	type plain Reconcile
	var p plain
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	if err := ValidateKind(p.Reconciler); err != nil {
		return err
	}
	if p.Key == "" {
		return invalid("reconcile job args have no key")
	}
	*r = Reconcile(p)
	return nil
}

// invalid is the INVALID_ARGUMENT error of a call or of job args that cannot be
// worked (workers cancel such a job rather than retry it).
func invalid(format string, args ...any) error {
	return fault.New(fault.InvalidArgument, format, args...)
}

var kindRe = regexp.MustCompile(`^[a-z][a-z0-9_]{0,62}$`)

// ValidateKind checks a reconciler kind: lowercase letters, digits and _, at most
// 63 characters, starting with a letter. It returns INVALID_ARGUMENT.
func ValidateKind(kind string) error {
	if !kindRe.MatchString(kind) {
		return invalid("reconciler kind %q: want [a-z][a-z0-9_]{0,62}", kind)
	}
	return nil
}

// MaxKeyLen is the longest key workers.DirtyTx and workers.InsertForKeyTx accept.
const MaxKeyLen = 512

// CheckKey is INVALID_ARGUMENT, prefixed with what, for a key that is empty,
// longer than MaxKeyLen, or not text PostgreSQL stores (fault.CheckText).
func CheckKey(what, key string) error {
	if key == "" || len(key) > MaxKeyLen {
		return invalid("%s: key must be 1 to %d bytes, got %d", what, MaxKeyLen, len(key))
	}
	return fault.CheckText(what+": key", key)
}

// KeyHash is the stable hash that maps a key to its shard: FNV-1a, 32 bits.
func KeyHash(key string) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	return h.Sum32()
}

// ShardOf is key's shard among count shards.
func ShardOf(key string, count int) int { return int(KeyHash(key) % uint32(count)) }

// ShardQueuePrefix starts the River queue of every shard: shard_<n>.
const ShardQueuePrefix = "shard_"

// ShardQueue is the River queue of shard n: ShardQueuePrefix + n.
func ShardQueue(n int) string { return ShardQueuePrefix + strconv.Itoa(n) }

// WorkedQueues are the queues a worker process works in a deployment of
// shardCount shards: every shard queue (each under its lease) and the
// MaintenanceQueue.
func WorkedQueues(shardCount int) []string {
	qs := make([]string, 0, shardCount+1)
	for i := range shardCount {
		qs = append(qs, ShardQueue(i))
	}
	return append(qs, MaintenanceQueue)
}

// MaintenanceQueue is the River queue every worker process works, whatever its
// shards: resync and other unfenced, idempotent housekeeping.
const MaintenanceQueue = "better_compute"

// ScheduledAfter: a job due sooner than this is inserted available with a
// future scheduled_at (River's fetch honours it to the poll interval); a later one
// is scheduled. River promotes scheduled jobs only every 5 s, which would make a
// short delay up to 5 s late.
const ScheduledAfter = 5 * time.Second

// TraceSetting is the transaction-local setting compute_mark_dirty reads the
// cause from when its caller passes none: what a trigger's call records.
const TraceSetting = "bettercompute.traceparent"

const traceTxSQL = `SELECT set_config('` + TraceSetting + `', $1, true)`

// TraceTx records the span of ctx, if sampled, as the cause of the dirties of
// tx that pass none: compute_mark_dirty called by a trigger or by SQL of the
// application's own (set_config(..., true): until tx ends). With no sampled
// span in ctx it does nothing and sends nothing.
//
//	err := pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
//		if err := jobs.TraceTx(ctx, tx); err != nil {
//			return err
//		}
//		_, err := tx.Exec(ctx, `UPDATE stock SET quantity = $2 WHERE sku = $1`, sku, n) // its trigger dirties the sku
//		return err
//	})
func TraceTx(ctx context.Context, tx pgx.Tx) error {
	c := tracing.Cause(ctx)
	if c == "" {
		return nil
	}
	if _, err := tx.Exec(ctx, traceTxSQL, c); err != nil {
		return fmt.Errorf("error recording the transaction's trace context: %w", err)
	}
	return nil
}

// ReconcileBatch is the River job that carries a batch of dirty keys of one
// reconciler and shard: the shard's holder claims due keys from compute_dirty,
// inserts this job running under itself (as River's fetch would mark it) and
// reconciles the keys in one fenced transaction that completes it. If that
// process dies first, the next holder hands the job back and River works it.
// Keys lists the batch's keys when it was claimed, for operators; the job
// reconciles the keys whose dirty rows point at it.
type ReconcileBatch struct {
	Reconciler string   `json:"reconciler"`
	Keys       []string `json:"keys"`
}

// ReconcileBatchKind is ReconcileBatch's River job kind.
const ReconcileBatchKind = "reconcile_batch"

// Kind implements river.JobArgs.
func (ReconcileBatch) Kind() string { return ReconcileBatchKind }

// UnmarshalJSON rejects args without a valid reconciler kind.
func (r *ReconcileBatch) UnmarshalJSON(b []byte) error {
	type plain ReconcileBatch
	var p plain
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	if err := ValidateKind(p.Reconciler); err != nil {
		return err
	}
	*r = ReconcileBatch(p)
	return nil
}

// Resync is the periodic job that re-dirties every key a reconciler owns.
type Resync struct {
	Reconciler string `json:"reconciler"`
}

// ResyncKind is Resync's River job kind.
const ResyncKind = "reconcile_resync"

// Kind implements river.JobArgs.
func (Resync) Kind() string { return ResyncKind }
