package jobs

import (
	"context"
	"fmt"
	"hash/fnv"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/tracing"
)

// invalid is the INVALID_ARGUMENT error of a call or of job args that cannot be
// worked (workers cancel such a job rather than retry it).
func invalid(format string, args ...any) error {
	return fault.New(fault.InvalidArgument, format, args...)
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

// ReconcileBatchKind is the kind of the River job that carries a batch of dirty
// keys of one reconciler and shard: the job ClaimDirtySQL inserts.
const ReconcileBatchKind = "reconcile_batch"

// ResyncKind is the kind of the periodic job that re-dirties every key a
// reconciler owns.
const ResyncKind = "reconcile_resync"
