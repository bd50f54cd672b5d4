package riverjob

// The statements of the worker engine (the packages under workers/) on
// River's tables, as jobs/riverjob.go holds those of the domain packages and
// the command: built from named constants and River's exported defaults
// (river.MaxAttemptsDefault, river.PriorityDefault), never from literals, so
// that riverjob_test.go can check them all against River's schema and
// defaults. The convention is jobs/riverjob.go's: a statement its caller
// composes with its own is an exported constant named …SQL, its parameters in
// its doc; a statement whose result is plain is run by a function here, which
// takes the querier explicitly and ends in Tx when it is only correct in the
// caller's transaction.

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/pg"
)

// --- Fences and hand-backs of worker processes (workers) ---

// anotherAttemptRunningSQL: see AnotherAttemptRunning.
const anotherAttemptRunningSQL = `SELECT EXISTS (SELECT 1 FROM river_job
WHERE id = $1 AND state = 'running' AND NOT (attempt = $2 AND attempted_at = $3))`

// AnotherAttemptRunning reports whether job id is running in an attempt other
// than the one numbered attempt that started at attemptedAt (River sets
// attempted_at at every fetch, and a snooze gives an attempt number back, so
// the pair names one attempt).
func AnotherAttemptRunning(ctx context.Context, db pg.DBTX, id int64, attempt int, attemptedAt time.Time) (bool, error) {
	var other bool
	err := db.QueryRow(ctx, anotherAttemptRunningSQL, id, attempt, attemptedAt).Scan(&other)
	return other, err
}

// handBackShardJobsSQL: see HandBackShardJobs. $1 lease names, $2 epochs, $3
// queues (aligned), $4 this owner, $5 the time for the errors entry, $6 when, $7
// the ids this process works, $8 OwnAfter (s).
const handBackShardJobsSQL = `
WITH fence AS (
    SELECT r.queue FROM compute_leases l
    JOIN unnest($1::text[], $2::bigint[], $3::text[]) AS r(name, epoch, queue)
      ON l.name = r.name AND l.epoch = r.epoch
    WHERE l.owner = $4 AND l.expires_at > compute_now()
    FOR KEY SHARE OF l
), stray AS (
    SELECT j.id FROM river_job j
    WHERE j.state = 'running' AND j.queue = ANY(ARRAY(SELECT queue FROM fence))
      AND (j.attempted_by[array_length(j.attempted_by, 1)] IS DISTINCT FROM $4
           OR (j.id <> ALL($7::bigint[]) AND j.attempted_at < $5::timestamptz - make_interval(secs => $8)))
    FOR UPDATE OF j SKIP LOCKED
)
UPDATE river_job j SET state = 'available',
       errors = array_append(j.errors, jsonb_build_object(
           'at', $5::timestamptz, 'attempt', j.attempt,
           'error', 'handed back by ' || $4 || ', the holder of ' || j.queue || ', ' || $6 || ': '
                    || CASE WHEN j.attempted_by[array_length(j.attempted_by, 1)] = $4
                            THEN 'its own attempt ended without a recorded outcome'
                            ELSE 'the attempt of ' || coalesce(j.attempted_by[array_length(j.attempted_by, 1)], 'nobody') || ' is fenced'
                       END,
           'trace', ''))
FROM stray WHERE j.id = stray.id
RETURNING j.queue`

// HandBackParams are HandBackShardJobs's parameters.
type HandBackParams struct {
	// Leases, Epochs and Queues are aligned: each shard lease this process
	// holds, its epoch and its shard's queue.
	Leases []string
	Epochs []int64
	Queues []string
	// Owner is this process (the leases' owner).
	Owner string
	// At is the time of the errors entry.
	At time.Time
	// When says when the hand-back happens, for the errors entry ("at its
	// takeover", "after a lease round").
	When string
	// Working are the ids of the jobs this process's goroutines run.
	Working []int64
	// OwnAfter: a running job of Owner's own that it does not work, attempted
	// more than OwnAfter before At, is handed back too.
	OwnAfter time.Duration
}

// HandBackShardJobs hands back, for each shard lease it is given, the running
// jobs of that shard's queue that another client attempted: their attempts are
// fenced (the lease's epoch moved on, or it was never theirs), and River alone
// would leave them running for an hour. It also hands back the owner's own
// running jobs that it is not working (p.Working lists those it runs) and
// attempted more than p.OwnAfter ago: attempts whose outcome River's completer
// could not record (the database restarted under them). The statement is fenced
// by the leases themselves, so a holder that lost a lease hands back nothing of
// that shard, and it skips rows locked by a transaction still in flight (the
// next round takes them). It returns the queue of each job handed back. The
// worker runtime calls it at a takeover, in the transaction that acquires the
// lease, and after every lease round.
func HandBackShardJobs(ctx context.Context, db pg.DBTX, p *HandBackParams) ([]string, error) {
	rows, err := db.Query(ctx, handBackShardJobsSQL, p.Leases, p.Epochs, p.Queues, p.Owner, p.At, p.When,
		p.Working, p.OwnAfter.Seconds())
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// handBackOwnRunningSQL: see HandBackOwnRunning. $1 queues, $2 owner.
const handBackOwnRunningSQL = `UPDATE river_job SET state = 'available'
WHERE queue = ANY($1) AND state = 'running' AND attempted_by[array_length(attempted_by, 1)] = $2`

// HandBackOwnRunning returns to their queue the running jobs of queues last
// attempted by owner: whatever a stopping worker process still runs, in the
// shard queues it holds. It returns how many it handed back.
func HandBackOwnRunning(ctx context.Context, db pg.DBTX, queues []string, owner string) (int64, error) {
	tag, err := db.Exec(ctx, handBackOwnRunningSQL, queues, owner)
	return tag.RowsAffected(), err
}

// handBackEarlierSQL: see HandBackEarlierIncarnation. $1 the maintenance queue,
// $2 identity, $3 this owner, $4 the time for the errors entry.
const handBackEarlierSQL = `
UPDATE river_job j SET state = 'available',
       errors = array_append(j.errors, jsonb_build_object(
           'at', $4::timestamptz, 'attempt', j.attempt,
           'error', 'handed back by ' || $3 || ' at its start: the attempt of '
                    || j.attempted_by[array_length(j.attempted_by, 1)] || ', an earlier incarnation of its identity, ended with that process',
           'trace', ''))
WHERE j.state = 'running' AND j.queue = $1
  AND starts_with(j.attempted_by[array_length(j.attempted_by, 1)], $2 || '#')
  AND j.attempted_by[array_length(j.attempted_by, 1)] <> $3`

// ClearEarlierLeader deletes River's leadership when an earlier incarnation of
// identity holds it (a River client id is "<identity>#…": see
// workers.Options.Identity), so that River elects a leader at once instead of
// after the 15 s its lease lasts; owner, this incarnation's id, is kept.
func ClearEarlierLeader(ctx context.Context, db pg.DBTX, identity, owner string) error {
	_, err := db.Exec(ctx, `DELETE FROM river_leader
WHERE starts_with(leader_id, $1 || '#') AND leader_id <> $2`, identity, owner)
	return err
}

// HandBackEarlierIncarnation returns to the jobs.MaintenanceQueue, now instead of
// after River's rescue delay, the running jobs there that an earlier
// incarnation of identity attempted (owners identity#…, other than owner), with
// why in their errors at at. A worker process calls it when it took its
// identity over. It returns how many it handed back.
func HandBackEarlierIncarnation(ctx context.Context, db pg.DBTX, identity, owner string, at time.Time) (int64, error) {
	tag, err := db.Exec(ctx, handBackEarlierSQL, jobs.MaintenanceQueue, identity, owner, at)
	return tag.RowsAffected(), err
}

// --- Batched reconciles (workers/reconcile.go) ---

// DueWorkSQL returns, of shards $1 (their queues $2, aligned), those with
// work due: whether a waiting dirty key of the reconciler kinds $3 is due,
// and whether a job is available in the queue by compute_now(). One index
// probe or two per shard, in one statement, so an idle process asks once a
// poll interval for all its shards instead of polling each queue.
//
// Each probe is the first row in its index's order (compute_dirty_due;
// River's river_job_prioritized_fetching_index), not an EXISTS: PostgreSQL
// plans an EXISTS over many matching rows as a scan of the table that stops
// at the first match, which, behind a backlog whose first rows are done or
// dead (a drain in insert order), reads thousands of rows per shard at every
// poll (48 ms a poll, 0.5 ms now, while 20,000 jobs of one tenant drained:
// every pickup it wakes waited for it).
const DueWorkSQL = `SELECT s, d, j FROM (
    SELECT w.s,
           (SELECT true FROM compute_dirty d
            WHERE d.shard = w.s AND d.job_id IS NULL AND d.not_before <= compute_now() AND d.kind = ANY($3::text[])
            ORDER BY d.not_before LIMIT 1) IS NOT NULL AS d,
           (SELECT true FROM river_job j
            WHERE j.state = 'available' AND j.queue = w.q AND j.scheduled_at <= compute_now()
            ORDER BY j.priority, j.scheduled_at LIMIT 1) IS NOT NULL AS j
    FROM unnest($1::int[], $2::text[]) AS w(s, q)) due
WHERE d OR j`

// ReadClaimedSQL reads the dirty rows that point at job $2, of reconciler $1,
// in key order, optionally only key $3 ("" for all): key, gen, when it was
// first dirtied, and the causes of its dirties (traceparents, NULL when none;
// see migrations/core/0009_dirty_trace.sql).
const ReadClaimedSQL = `SELECT key, gen, dirtied_at, trace_claimed || trace_links FROM compute_dirty
WHERE kind = $1 AND job_id = $2 AND ($3 = '' OR key = $3) ORDER BY key`

// FinishBatchSQL ends a run of job $2 of reconciler $1 (the function
// compute_finish_batch, migrations/core/0008_batch_functions.sql): it deletes
// the rows of keys $3 whose gen is still the one the run read ($4, aligned):
// those keys are done; then, in a statement of its own (which sees a dirty
// committed meanwhile), returns the rows of those keys that are left (dirtied
// during the run) to waiting; and, unless $5 is NULL, completes the job in
// attempt $5 at $6. It returns how many rows it changed: len($3), plus one for
// the job, unless a row stopped pointing at the job.
const FinishBatchSQL = `SELECT compute_finish_batch($1, $2, $3::text[], $4::bigint[], $5::int, $6)`

// TakeDirtySQL takes, inside the transaction of a batch, for the holder of
// shard $1's lease ($2 name, $3 owner, $4 epoch; held FOR KEY SHARE until the
// transaction ends, so a takeover waits for it), the due, waiting keys of one
// reconciler: the kind of the oldest due key of kinds $5 (batch sizes $6,
// aligned), up to its batch size, oldest first, none of the keys the holder
// has in flight ($7 kinds, $8 keys, aligned). It returns kind, key, gen,
// when the key was first dirtied, its causes, and how many of them the
// finish clears (FinishTakenSQL); one row of NULLs when the lease is not
// held. The function compute_take_dirty (migrations/core/0011_take_dirty.sql)
// as compute_take_fair (migrations/tenancy/0002_tenant_work.sql), which, where
// tenants' keys wait, serves one group (no tenant, or one tenant within its
// limit) round-robin, the first after group $9, and returns the keys' tenant.
const TakeDirtySQL = `SELECT kind, key, gen, dirtied_at, causes, links, tenant
FROM compute_take_fair($1, $2, $3, $4, $5::text[], $6::int[], $7::text[], $8::text[], $9::text)`

// FinishTakenSQL ends a batch that took keys $2 of reconciler $1
// (TakeDirtySQL): it deletes the rows whose gen is still the one read ($3,
// aligned), and keeps waiting the others (dirtied during the run), without
// the $4 causes it read (aligned). It returns how many rows it deleted or
// kept: len($2) unless a row stopped waiting. The function
// compute_finish_taken (migrations/core/0011_take_dirty.sql).
const FinishTakenSQL = `SELECT compute_finish_taken($1, $2::text[], $3::bigint[], $4::int[])`

// FailKeySQL gives key $3 of reconciler $2, whose reconcile failed on its own in
// batch job $1 (NULL for a batch that took its keys, TakeDirtySQL), a River job of its own (kind ReconcileKind, args $5) in queue $4,
// retryable at $7 with its first attempt's error $6 (attempted by $9 at $8), and
// points the key's row at it, not before compute_now() + $10 s (a dirty due
// sooner takes the key back). It does nothing if the row is no longer the
// batch's. The job's metadata names the key's tenant, if it has one.
var FailKeySQL = fmt.Sprintf(`
WITH j AS (
    INSERT INTO river_job (args, kind, max_attempts, priority, queue, scheduled_at, state,
                           attempt, attempted_at, attempted_by, errors, tags, metadata)
    SELECT $5::jsonb, '%s', %d, %d, $4::text, $7::timestamptz, 'retryable'::river_job_state,
           1, $8::timestamptz, ARRAY[$9::text],
           ARRAY[jsonb_build_object('at', $8::timestamptz, 'attempt', 1, 'error', $6::text, 'trace', '')],
           ARRAY[$2::text]::varchar(255)[],
           CASE WHEN tenant IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('tenant', tenant) END
    FROM compute_dirty WHERE kind = $2 AND key = $3 AND job_id IS NOT DISTINCT FROM $1::bigint
    RETURNING id
)
UPDATE compute_dirty d SET job_id = j.id, not_before = compute_now() + make_interval(secs => $10::float8)
FROM j WHERE d.kind = $2 AND d.key = $3`, ReconcileKind, river.MaxAttemptsDefault, river.PriorityDefault)

// --- Outbox (workers/outboxworker) ---

// outboxDispatchWaitingSQL: see OutboxDispatchWaitingTx. $1 queue, $2 kind, $3
// dispatcher.
const outboxDispatchWaitingSQL = `SELECT EXISTS (SELECT 1 FROM river_job
WHERE state = 'available' AND queue = $1 AND kind = $2 AND args->>'dispatcher' = $3)`

// OutboxDispatchWaitingTx reports, in tx, whether an OutboxDispatch job of
// dispatcher is waiting to start in the jobs.MaintenanceQueue: a dispatcher's Notify
// inserts another only when none is.
func OutboxDispatchWaitingTx(ctx context.Context, tx pgx.Tx, dispatcher string) (bool, error) {
	var waiting bool
	err := tx.QueryRow(ctx, outboxDispatchWaitingSQL, jobs.MaintenanceQueue, jobs.OutboxDispatchKind, dispatcher).Scan(&waiting)
	return waiting, err
}

// --- Capacity (workers/capacityworker) ---

// OverdueHoldsSQL finds the holds whose expiry job is gone: $1 grace (s), $2
// limit. It returns (pool_id, id) of each hold overdue by more than the grace,
// in a stable order, locked FOR SHARE SKIP LOCKED. A hold whose expiry job is
// still live is left out without touching that job's row: the sweep must not
// wait on a job row an expiry's fenced transaction holds while it holds the
// hold's row that transaction is about to write (that cycle deadlocked).
var OverdueHoldsSQL = `
SELECT r.pool_id, r.id FROM capacity_reservations r
 WHERE r.state = 'hold' AND r.expires_at <= compute_now() - make_interval(secs => $1)
   AND NOT EXISTS (
       SELECT 1 FROM river_job j
        WHERE j.kind = '` + jobs.CapacityHoldExpiryKind + `' AND j.state IN ` + jobs.LiveStatesSQL + `
          AND j.args @> jsonb_build_object('reservation_id', r.id))
 ORDER BY r.expires_at, r.id LIMIT $2
   FOR SHARE OF r SKIP LOCKED`

// --- Shard queues and metrics (workers) ---

// countWaitingInShardQueuesSQL: see CountWaitingInShardQueues.
var countWaitingInShardQueuesSQL = `SELECT queue, sum(n)::int FROM (
    SELECT queue, count(*) AS n FROM river_job WHERE state = 'available' AND queue LIKE '` +
	strings.ReplaceAll(jobs.ShardQueuePrefix, "_", `\_`) + `%' GROUP BY 1
    UNION ALL
    SELECT '` + jobs.ShardQueuePrefix + `' || shard, count(*) FROM compute_dirty
    WHERE job_id IS NULL AND not_before <= compute_now() GROUP BY shard
) w GROUP BY 1`

// CountWaitingInShardQueues counts, for each shard queue (a queue named
// jobs.ShardQueuePrefix…) that has any, its available jobs and its shard's due dirty
// keys not yet claimed: the work waiting for the shard's holder.
func CountWaitingInShardQueues(ctx context.Context, db pg.DBTX) (map[string]int, error) {
	rows, err := db.Query(ctx, countWaitingInShardQueuesSQL)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var q string
		var n int
		if err := rows.Scan(&q, &n); err != nil {
			return nil, err
		}
		out[q] = n
	}
	return out, rows.Err()
}

// oldestRunningSQL: see OldestRunning.
const oldestRunningSQL = `SELECT queue, kind, count(*), extract(epoch FROM compute_now() - min(attempted_at))::float8
		FROM river_job WHERE state = 'running' GROUP BY 1, 2`

// RunningAge is the running jobs of one queue and kind: how many, and how long
// the oldest of them has run by compute_now().
type RunningAge struct {
	Queue, Kind string
	Jobs        int
	Oldest      time.Duration
}

// OldestRunning groups the running jobs by queue and kind, with the age of each
// group's oldest attempt (what the metrics of jobs running past their expected
// time read).
func OldestRunning(ctx context.Context, db pg.DBTX) ([]RunningAge, error) {
	rows, err := db.Query(ctx, oldestRunningSQL)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (RunningAge, error) {
		var a RunningAge
		var secs *float64
		err := row.Scan(&a.Queue, &a.Kind, &a.Jobs, &secs)
		if secs != nil {
			a.Oldest = time.Duration(*secs * float64(time.Second))
		}
		return a, err
	})
}

// --- Workflows (workers/workflowworker) ---

// CompleteJobSQL completes running job $1 at $2 (River's clock: now) with
// $3 merged into its metadata, as River's JobCompleteTx does, in a statement
// a batch can carry: the caller's fence holds the row FOR UPDATE. It returns
// the id; no row means the job was not running.
const CompleteJobSQL = `UPDATE river_job SET state = 'completed', finalized_at = $2::timestamptz,
       metadata = CASE WHEN $3::jsonb = '{}'::jsonb THEN metadata ELSE metadata || $3::jsonb END
WHERE id = $1 AND state = 'running'
RETURNING id`

// HandOverWorkflowSQL gives workflow $1, at seq $2 and run by the running
// job $3 (inline steps, whose step at that seq failed), to a new step job for
// the same seq: retryable at $4 (River's clock: the step's backoff), with its
// failed attempt counted as River counts one (attempt 1, the error $5 in its
// errors, at $6), max attempts $7 and cause $8, naming job $3's tenant; and
// completes job $3 at $6. It
// returns the new job's id; no row means the job no longer runs the workflow.
var HandOverWorkflowSQL = fmt.Sprintf(`
WITH w AS (
    UPDATE compute_workflows SET job_id = nextval('river_job_id_seq'), updated_at = compute_now()
    WHERE id = $1 AND seq = $2 AND job_id = $3
    RETURNING id, kind, step, seq, job_id
), j AS (
    INSERT INTO river_job (id, args, kind, max_attempts, priority, queue, scheduled_at, state, tags, metadata, attempt, attempted_at, errors)
    SELECT w.job_id, jsonb_build_object('workflow_id', w.id, 'workflow', w.kind, 'step', w.step, 'seq', w.seq),
           '%s', $7::int, %d, old.queue, $4::timestamptz, 'retryable', '{}',
           CASE WHEN $8::text IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('%s', $8::text) END
           || CASE WHEN old.metadata ? 'tenant' THEN jsonb_build_object('tenant', old.metadata -> 'tenant') ELSE '{}'::jsonb END,
           1, $6::timestamptz,
           ARRAY[jsonb_build_object('at', $6::timestamptz, 'attempt', 1, 'error', $5::text, 'trace', '')]
    FROM w, river_job old WHERE old.id = $3
    RETURNING id
), done AS (
    UPDATE river_job SET state = 'completed', finalized_at = $6::timestamptz
    WHERE id = $3 AND state = 'running' AND EXISTS (SELECT 1 FROM w)
)
SELECT w.job_id FROM w`, jobs.WorkflowStepKind, river.PriorityDefault, jobs.TraceparentKey)
