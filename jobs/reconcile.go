package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/platform/fault"
)

// Reconcile is the River job that reconciles one key of a reconciler kind. It is
// inserted by Dirty, never directly.
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

// MaxKeyLen is the longest key Dirty accepts.
const MaxKeyLen = 512

// KeyHash is the stable hash that maps a key to its shard: FNV-1a, 32 bits.
func KeyHash(key string) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	return h.Sum32()
}

// ShardOf is key's shard among count shards.
func ShardOf(key string, count int) int { return int(KeyHash(key) % uint32(count)) }

// ShardQueue is the River queue of shard n.
func ShardQueue(n int) string { return fmt.Sprintf("shard_%d", n) }

// MaintenanceQueue is the River queue every worker process works, whatever its
// shards: resync and other unfenced, idempotent housekeeping.
const MaintenanceQueue = "better_compute"

// ScheduledAfter: a job due sooner than this is inserted available with a
// future scheduled_at (River's fetch honours it to the poll interval); a later one
// is scheduled. River promotes scheduled jobs only every 5 s, which would make a
// short delay up to 5 s late.
const ScheduledAfter = 5 * time.Second

// DirtyOpts are Dirty's options.
type DirtyOpts struct {
	// Delay: the key is not reconciled before compute_now() + Delay. If the key is
	// already waiting, the earlier of the two times wins.
	Delay time.Duration
}

// dirtySQL upserts the key's row and, when the key has no row yet, inserts its
// River job in the same statement (the job id is drawn from River's sequence
// first, so the row knows it). It returns whether the row is new, its job and that
// job's state as this statement's snapshot sees it.
//
// $1 kind, $2 key, $3 key hash, $4 delay (s), $5 River scheduled_at, $6 args, $7 tags.
const dirtySQL = `
WITH d AS (
    INSERT INTO compute_dirty AS d (kind, key, shard, gen, not_before, job_id)
    VALUES ($1, $2, ($3::bigint % (SELECT shard_count FROM compute_settings))::int, 1,
            compute_now() + make_interval(secs => $4), nextval('river_job_id_seq'))
    ON CONFLICT (kind, key) DO UPDATE
       SET gen = d.gen + 1,
           not_before = LEAST(d.not_before, EXCLUDED.not_before)
    RETURNING (xmax = 0) AS inserted, d.job_id, d.shard, d.not_before,
              -- compute_now() is stable within the statement: equal means ours won
              d.not_before = compute_now() + make_interval(secs => $4) AS earlier
), j AS (
    INSERT INTO river_job (id, args, kind, max_attempts, priority, queue, scheduled_at, state, tags, metadata)
    SELECT d.job_id, $6::jsonb, 'reconcile', 25, 1, 'shard_' || d.shard, $5,
           CASE WHEN $4 >= 5 THEN 'scheduled' ELSE 'available' END::river_job_state, $7::varchar(255)[], '{}'
    FROM d WHERE d.inserted
    RETURNING id
)
SELECT d.inserted, d.job_id, d.earlier,
       CASE WHEN d.inserted THEN 'available' ELSE (SELECT r.state::text FROM river_job r WHERE r.id = d.job_id) END
FROM d`

// Dirty marks key of reconciler kind as needing a reconcile, in tx: see the package
// doc. If tx rolls back, so does the mark. It returns INVALID_ARGUMENT for a kind
// that is not [a-z][a-z0-9_]{0,62} or a key that is empty or longer than MaxKeyLen.
func Dirty(ctx context.Context, tx pgx.Tx, kind, key string, opts *DirtyOpts) error {
	if err := ValidateKind(kind); err != nil {
		return err
	}
	if key == "" || len(key) > MaxKeyLen {
		return invalid("dirty %s: key must be 1 to %d bytes, got %d", kind, MaxKeyLen, len(key))
	}
	var delay time.Duration
	if opts != nil && opts.Delay > 0 {
		delay = opts.Delay
	}
	args, err := json.Marshal(Reconcile{Reconciler: kind, Key: key})
	if err != nil {
		return err
	}
	var (
		inserted, earlier bool
		jobID             int64
		state             *string
	)
	err = tx.QueryRow(ctx, dirtySQL, kind, key, int64(KeyHash(key)), delay.Seconds(),
		time.Now().Add(delay), string(args), []string{kind}).Scan(&inserted, &jobID, &earlier, &state)
	if err != nil {
		return fmt.Errorf("error marking %s/%s dirty: %w", kind, key, err)
	}
	if inserted {
		return nil
	}
	if state == nil {
		// The job is invisible to the statement's snapshot: committed by a
		// transaction we waited for (read it again), or deleted by an operator.
		if err := tx.QueryRow(ctx, `SELECT state::text FROM river_job WHERE id = $1`, jobID).Scan(&state); err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("error reading the job of %s/%s: %w", kind, key, err)
		}
	}
	switch s := deref(state); s {
	case "running":
		return nil // the run ends by scheduling a follow-up at not_before
	case "available", "scheduled", "retryable", "pending":
		if !earlier {
			return nil
		}
		// The earlier not-before wins: move the waiting job (never a running one).
		_, err := tx.Exec(ctx, `
UPDATE river_job SET scheduled_at = LEAST(scheduled_at, $2),
       state = CASE WHEN $3 THEN 'available'::river_job_state ELSE state END
WHERE id = $1 AND state IN ('available', 'scheduled', 'retryable', 'pending') AND scheduled_at > $2`,
			jobID, time.Now().Add(delay), delay < ScheduledAfter)
		if err != nil {
			return fmt.Errorf("error moving the job of %s/%s earlier: %w", kind, key, err)
		}
		return nil
	default:
		// No live job (cancelled, discarded or deleted by an operator): start a new one.
		return Requeue(ctx, tx, kind, key)
	}
}

// Requeue inserts a new River job for a key that has a dirty row, scheduled at
// the row's not_before, and records it on the row. Reconcile workers use it when a
// run ends with the key dirtied again.
func Requeue(ctx context.Context, tx pgx.Tx, kind, key string) error {
	args, err := json.Marshal(Reconcile{Reconciler: kind, Key: key})
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `
WITH d AS (
    SELECT kind, key, shard, greatest(extract(epoch FROM not_before - compute_now()), 0) AS delay
    FROM compute_dirty WHERE kind = $1 AND key = $2 FOR UPDATE
), j AS (
    INSERT INTO river_job (args, kind, max_attempts, priority, queue, scheduled_at, state, tags, metadata)
    SELECT $3::jsonb, 'reconcile', 25, 1, 'shard_' || d.shard,
           $4::timestamptz + make_interval(secs => d.delay),
           CASE WHEN d.delay >= 5 THEN 'scheduled' ELSE 'available' END::river_job_state,
           $5::varchar(255)[], '{}'
    FROM d
    RETURNING id
)
UPDATE compute_dirty c SET job_id = j.id FROM j WHERE c.kind = $1 AND c.key = $2`,
		kind, key, string(args), time.Now(), []string{kind})
	if err != nil {
		return fmt.Errorf("error requeueing %s/%s: %w", kind, key, err)
	}
	return nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// Resync is the periodic job that re-dirties every key a reconciler owns.
type Resync struct {
	Reconciler string `json:"reconciler"`
}

// ResyncKind is Resync's River job kind.
const ResyncKind = "reconcile_resync"

// Kind implements river.JobArgs.
func (Resync) Kind() string { return ResyncKind }
