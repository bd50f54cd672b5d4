package jobs

// Every statement of the module that reads or writes River's river_job table
// (or casts to its river_job_state type) is in this file, or, when only the
// worker engine runs it, in workers/internal/riverjob/riverjob.go; each is
// built from named constants and River's exported defaults
// (river.MaxAttemptsDefault, river.PriorityDefault), never from literals, so
// that the riverjob_test.go beside it can check them all against River's
// schema and defaults.
//
// One convention: a statement that its caller composes with its own (queued in
// a batch, extended with a WHERE, scanned into the caller's types) is exported
// as a constant named …SQL, its parameters in its doc; a statement whose result
// is plain (a count, a flag, an id, queue names) is run by a function here,
// which takes the querier explicitly and ends in Tx when it is only correct in
// the caller's transaction.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/riverqueue/river"

	"github.com/bettercompute/bettercompute/platform/pg"
)

// LiveStatesSQL are the River states of a job that will still run, as an SQL
// list: LiveStates, for the statements here and the engine's (riverjob).
const LiveStatesSQL = `('available', 'pending', 'running', 'scheduled', 'retryable')`

// jobStateSQL reads a job's state as text: $1 id.
const jobStateSQL = `SELECT state::text FROM river_job WHERE id = $1`

// --- Fences (domain/workflow, workers) ---

// FenceSQL is both fences of a fenced job's transaction in one statement (the
// function compute_fence, migrations/core/0008_batch_functions.sql): the lease
// ($1 name, $2 owner, $3 epoch, unexpired) FOR KEY SHARE, then the job's own
// row ($4 id) with its attempt ($5), running, FOR UPDATE. It returns
// FenceHeld, FenceLeaseLost (the job's row is not locked) or FenceJobStale
// (the job was handed back, rescued or cancelled).
const FenceSQL = `SELECT compute_fence($1, $2, $3, $4, $5::int)`

// FenceSQL's results.
const (
	FenceHeld      = 0
	FenceLeaseLost = 1
	FenceJobStale  = 2
)

// The SQLSTATEs a function that fences as FenceSQL does raises when a fence
// does not hold (compute_workflow_lock, migrations/workflow/0005): its
// transaction is aborted, and FenceRaised gives the FenceSQL result it stands
// for.
const (
	fenceLeaseLostState = "BCF01"
	fenceJobStaleState  = "BCF02"
)

// FenceRaised is the FenceSQL result that err, from a statement that fences
// and raises (see fenceLeaseLostState), stands for: FenceLeaseLost or
// FenceJobStale and nil, or FenceHeld and err itself.
func FenceRaised(err error) (int, error) {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case fenceLeaseLostState:
			return FenceLeaseLost, nil
		case fenceJobStaleState:
			return FenceJobStale, nil
		}
	}
	return FenceHeld, err
}

// --- Batched reconciles (migrations/core, workers/reconcile.go) ---

// ClaimDirtySQL claims, for the holder of shard $1's lease ($2 name, $3 owner,
// $4 epoch, checked in the statement: a takeover waits for it), up to $7 due,
// waiting dirty keys of the reconciler kinds $5 (with their batch sizes $6,
// aligned), oldest not-before first, skipping rows locked by a transaction in
// flight. It inserts one River job of kind ReconcileBatchKind per batch (per
// kind, at most its batch size of keys), running under $3 in queue $9 at $8 (as
// River's own fetch marks a job), and points the keys' rows at it. It returns
// each key's job id, kind, key and gen. The statement is the function
// compute_claim_dirty (migrations/core/0008_batch_functions.sql), whose plan
// the server keeps per connection.
var ClaimDirtySQL = fmt.Sprintf(`SELECT job_id, kind, key, gen
FROM compute_claim_dirty($1, $2, $3, $4, $5::text[], $6::int[], $7, $8, $9, '%s', %d, %d)`,
	ReconcileBatchKind, river.MaxAttemptsDefault, river.PriorityDefault)

// --- Queue metrics (cmd/better-compute, workers/metrics.go) ---

// countUnfinishedSQL: see CountUnfinished.
const countUnfinishedSQL = `SELECT queue, state::text, count(*) FROM river_job
		WHERE state IN ('available', 'scheduled', 'retryable', 'running', 'pending') GROUP BY 1, 2`

// QueueCount is the number of jobs of one queue in one state.
type QueueCount struct {
	Queue string
	State string
	Jobs  int64
}

// CountUnfinished counts the jobs not yet finished (available, scheduled,
// retryable, running, pending) by queue and state, in no order.
func CountUnfinished(ctx context.Context, db pg.DBTX) ([]QueueCount, error) {
	rows, err := db.Query(ctx, countUnfinishedSQL)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (QueueCount, error) {
		var c QueueCount
		err := row.Scan(&c.Queue, &c.State, &c.Jobs)
		return c, err
	})
}

// --- Backfills (workers/backfillworker) ---

// BackfillProgressSQL reads the backfills with their batch job as River has it
// now, one row per backfill with the columns of backfill.Progress; the caller
// appends its WHERE or ORDER BY (b is compute_backfills).
const BackfillProgressSQL = `
SELECT b.name, b.state, b.epoch, b.batches, b.rows_done, b.last_batch_at, b.last_batch_rows,
       b.last_batch_ms, b.rows_estimate, b.estimated_at, b.rate, b.rate_at, b.job_id, b.errors,
       b.last_error, b.last_error_at, b.started_at, b.finished_at, b.created_at, b.updated_at,
       j.state::text AS job_state, j.attempt AS job_attempt, j.max_attempts AS job_max_attempts,
       j.scheduled_at AS job_scheduled_at, compute_now() AS now
FROM compute_backfills b LEFT JOIN river_job j ON j.id = b.job_id`

// BackfillLockSQL locks the row of backfill $1 FOR UPDATE (not its job's) and
// returns its state, epoch, batches, job id and that job's state as text (NULL
// when the job is gone).
const BackfillLockSQL = `
SELECT b.state, b.epoch, b.batches, b.job_id,
       (SELECT j.state::text FROM river_job j WHERE j.id = b.job_id)
FROM compute_backfills b WHERE b.name = $1 FOR UPDATE OF b`

// cancelWaitingSQL: see CancelWaitingTx. $1 id, $2 finalized_at and the time
// of the errors entry, $3 why.
const cancelWaitingSQL = `
WITH j AS (
    SELECT id FROM river_job
    WHERE id = $1 AND state IN ('available', 'scheduled', 'retryable', 'pending')
    FOR UPDATE SKIP LOCKED
)
UPDATE river_job r SET state = 'cancelled', finalized_at = $2,
    errors = array_append(r.errors, jsonb_build_object('at', $2::timestamptz, 'attempt', r.attempt, 'error', $3::text, 'trace', ''))
FROM j WHERE r.id = j.id`

// CancelWaitingTx cancels, in tx, the job id if it is waiting to run, with why
// in its errors at at. It skips a job whose row is locked (being fetched, or
// running): a backfill holding its own row must not wait for its job's, which
// its batch transaction locks first. It returns how many it cancelled (0 or 1).
func CancelWaitingTx(ctx context.Context, tx pgx.Tx, id int64, at time.Time, why string) (int64, error) {
	tag, err := tx.Exec(ctx, cancelWaitingSQL, id, at, why)
	return tag.RowsAffected(), err
}

// insertBackfillSQL: see InsertBackfillTx. $1 args, $2 kind, $3 max_attempts,
// $4 queue, $5 scheduled_at, $6 state, $7 tags.
var insertBackfillSQL = fmt.Sprintf(`
INSERT INTO river_job (args, kind, max_attempts, priority, queue, scheduled_at, state, tags, metadata)
VALUES ($1::jsonb, $2, $3, %d, $4, $5, $6::river_job_state, $7::varchar(255)[], '{}')
RETURNING id`, river.PriorityDefault)

// InsertBackfillTx inserts the backfill job args in tx into queue (the shard
// queue of BackfillShardKey), tagged BackfillTag, with River's default priority
// and attempts (its backoff spreads them over about three weeks), to run after
// delay, and returns its id. A job due further out than ScheduledAfter is
// 'scheduled' (River makes it available when due); a nearer one is 'available'
// with its scheduled_at in the future, as River's own retries are, so the fetch
// picks it up on time. If tx rolls back, so does the job.
func InsertBackfillTx(ctx context.Context, tx pgx.Tx, args BackfillBatch, queue string, delay time.Duration) (int64, error) {
	enc, err := json.Marshal(args)
	if err != nil {
		return 0, err
	}
	state := "available"
	if delay > ScheduledAfter {
		state = "scheduled"
	}
	var id int64
	err = tx.QueryRow(ctx, insertBackfillSQL, string(enc), args.Kind(), river.MaxAttemptsDefault, queue,
		time.Now().Add(delay), state, []string{backfillTag}).Scan(&id)
	return id, err
}

// --- Outbox (domain/outbox, workers/outboxworker) ---

// DueSinksSQL returns the name and last recorded job of the sinks among $1
// that are not paused, have a visible event after their cursor, and have no
// live delivery job: the ones whose next delivery must be started. One
// statement, an index probe per sink.
const DueSinksSQL = `
SELECT s.name, s.job_id FROM compute_sinks s
WHERE s.name = ANY($1::text[]) AND NOT s.paused
  AND NOT EXISTS (SELECT 1 FROM river_job j WHERE j.id = s.job_id AND j.state IN ` + LiveStatesSQL + `)
  AND EXISTS (SELECT 1 FROM compute_events e
              WHERE e.txid < pg_snapshot_xmin(pg_current_snapshot())
                AND (e.txid, e.seq) > (s.cursor_txid, s.cursor_seq))`

// handBackStaleSinkJobsSQL: see HandBackStaleSinkJobs. $1 sink names, $2 kind,
// $3 the time for the errors entry, $4 startedBefore.
const handBackStaleSinkJobsSQL = `
UPDATE river_job j SET state = 'available',
       errors = array_append(j.errors, jsonb_build_object(
           'at', $3::timestamptz, 'attempt', j.attempt,
           'error', 'handed back: the sink lease ' || 'sink/' || s.name || ' expired while the job was running',
           'trace', ''))
FROM compute_sinks s
WHERE j.id = s.job_id AND s.name = ANY($1::text[]) AND j.kind = $2 AND j.state = 'running'
  AND j.attempted_at < $4::timestamptz
  AND NOT EXISTS (SELECT 1 FROM compute_leases l
                  WHERE l.name = 'sink/' || s.name AND l.expires_at > compute_now())`

// HandBackStaleSinkJobs returns to the queue the running delivery jobs (of
// kind) of sinks among names that started before startedBefore and whose sink
// lease nobody holds unexpired, with why in their errors at at: their process
// died (or paused past its lease), and River would otherwise wait an hour to
// rescue them. A paused process that wakes up is fenced: its lease epoch and
// job attempt are no longer current. It returns how many it handed back.
func HandBackStaleSinkJobs(ctx context.Context, db pg.DBTX, names []string, kind string, at, startedBefore time.Time) (int64, error) {
	tag, err := db.Exec(ctx, handBackStaleSinkJobsSQL, names, kind, at, startedBefore)
	return tag.RowsAffected(), err
}

// --- Doctor (cmd/better-compute) ---

// countRunningLongerSQL: see CountRunningLonger. $1 the age (s).
const countRunningLongerSQL = `SELECT count(*), min(attempted_at) FROM river_job
		WHERE state = 'running' AND attempted_at < compute_now() - make_interval(secs => $1)`

// CountRunningLonger counts the jobs running for longer than d by compute_now(),
// and returns when the oldest of them was attempted (nil when none is).
func CountRunningLonger(ctx context.Context, db pg.DBTX, d time.Duration) (int, *time.Time, error) {
	var n int
	var oldest *time.Time
	err := db.QueryRow(ctx, countRunningLongerSQL, d.Seconds()).Scan(&n, &oldest)
	return n, oldest, err
}

// countRunningSQL: see CountRunning.
const countRunningSQL = `SELECT count(*) FROM river_job WHERE state = 'running'`

// CountRunning counts the running jobs.
func CountRunning(ctx context.Context, db pg.DBTX) (int, error) {
	var n int
	err := db.QueryRow(ctx, countRunningSQL).Scan(&n)
	return n, err
}

// dueByQueueSQL: see DueByQueue.
const dueByQueueSQL = `SELECT queue, count(*), extract(epoch FROM compute_now() - min(scheduled_at))
		FROM river_job j WHERE state IN ('available', 'retryable') AND scheduled_at <= compute_now()
		AND NOT (metadata ? 'tenant' AND EXISTS (SELECT 1 FROM compute_tenants t
		                                        WHERE t.name = j.metadata->>'tenant' AND t.state = 'suspended'))
		GROUP BY 1 ORDER BY 2 DESC`

// QueueDepth is the jobs of one queue due by compute_now(): how many, and how
// long the oldest has been due.
type QueueDepth struct {
	Queue  string
	Jobs   int
	Oldest time.Duration
}

// DueByQueue returns the depth of each queue with jobs due (available or
// retryable, scheduled by compute_now()), the deepest first. A suspended
// tenant's jobs are not due: they are held by an operator's choice until it
// is resumed, and doctor's tenants check counts them.
func DueByQueue(ctx context.Context, db pg.DBTX) ([]QueueDepth, error) {
	rows, err := db.Query(ctx, dueByQueueSQL)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (QueueDepth, error) {
		var d QueueDepth
		var secs float64
		err := row.Scan(&d.Queue, &d.Jobs, &secs)
		d.Oldest = time.Duration(secs * float64(time.Second))
		return d, err
	})
}

// runningByAttempterSQL groups the running jobs of shard queues by queue and by
// the client that last attempted them; $1 is the cut-off before which an attempt
// is old.
const runningByAttempterSQL = `
SELECT queue, coalesce(attempted_by[array_length(attempted_by, 1)], ''),
       count(*), count(*) FILTER (WHERE attempted_at IS NULL OR attempted_at < $1), min(attempted_at)
FROM river_job
WHERE state = 'running' AND queue ~ '^` + ShardQueuePrefix + `[0-9]+$'
GROUP BY 1, 2`

// RunningGroup is the running jobs of one shard queue last attempted by one
// client ("" for none).
type RunningGroup struct {
	Queue  string
	Client string
	// Jobs is how many run; Old how many of them were attempted before the
	// cut-off (or never).
	Jobs, Old int
	// OldestAttempt is when the oldest of them was attempted.
	OldestAttempt *time.Time
}

// RunningByAttempter groups the running jobs of shard queues by queue and by
// the client that last attempted them, counting those attempted before
// oldBefore.
func RunningByAttempter(ctx context.Context, db pg.DBTX, oldBefore time.Time) ([]RunningGroup, error) {
	rows, err := db.Query(ctx, runningByAttempterSQL, oldBefore)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (RunningGroup, error) {
		var g RunningGroup
		err := row.Scan(&g.Queue, &g.Client, &g.Jobs, &g.Old, &g.OldestAttempt)
		return g, err
	})
}

// --- Workflows (domain/workflow, workers/workflowworker) ---

// TraceparentKey is the key of a job's metadata that holds its cause, a W3C
// traceparent: the one River's OpenTelemetry middleware (otelriver) reads.
const TraceparentKey = "traceparent"

// StartWorkflowsSQL inserts workflow instances and the River job of each one's
// first step, in one statement: $1 ids, $2 kinds, $3 inputs (jsonb), $4 the
// FNV-1a hashes of the ids (the shard), $5 parent id, $6 parent seq, $7 River's
// scheduled_at (the caller's clock, as River's own inserts), $8 the caller's
// cause (a traceparent or NULL: the jobs' metadata). A kind not
// in compute_workflow_kinds inserts nothing; an id that exists inserts
// nothing. It returns the ids inserted. The function compute_workflow_start
// (migrations/workflow/0006_tenant.sql), whose plan the server keeps per
// connection, $9 the tenant (NULL: the parent's, or none; a deleted one is
// BC010, CONFLICT): each job is WorkflowStepKind, river.MaxAttemptsDefault
// attempts at river.PriorityDefault, in its ShardQueuePrefix queue.
const StartWorkflowsSQL = `SELECT id FROM compute_workflow_start($1::text[], $2::text[], $3::jsonb[], $4::bigint[],
    $5::text, $6::bigint, $7::timestamptz, $8::text, $9::text)`

// StepWorkflowSQL moves a workflow instance, locked by the caller's
// transaction at seq $2, to its next state, inserts the River job of its next
// step when $10 says so, and writes the history row of the step that moved it
// when $18 names an outcome, in one statement: $1 id, $2 seq, $3 status, $4
// step, $5 state (NULL keeps it), $6 result, $7 error, $8 wait, $9 wake_at (on
// compute_now(); NULL for none), $10 whether a job follows, $11 its queue,
// $12 its River scheduled_at, $13 its River state, $14 its max attempts, $15
// the caller's cause (a traceparent or NULL: the job's metadata), $16 without
// a job, the running job that stays the instance's (an inline step: NULL
// otherwise); then the history row's $17 step run, $18 outcome (NULL: no
// row), $19 next step, $20 attempt, $21 job and $22 lease epoch (NULL for
// none), $23 started and $24 committed (NULL: compute_now()). It returns the
// new seq and job id (NULL without a job); no row means the seq moved (the
// caller's lock should make that impossible). The function
// compute_workflow_step (migrations/workflow/0005_step_functions.sql, over
// compute_workflow_advance of 0004), whose plan the server keeps per
// connection: the job it inserts is WorkflowStepKind at
// river.PriorityDefault, its cause under TraceparentKey.
const StepWorkflowSQL = `SELECT seq, job_id FROM compute_workflow_step($1::text, $2::bigint, $3::text, $4::text,
    $5::jsonb, $6::jsonb, $7::text, $8::jsonb, $9::timestamptz, $10::bool, $11::text, $12::timestamptz,
    $13::river_job_state, $14::int, $15::text, $16::bigint, $17::text, $18::text, $19::text, $20::int,
    $21::bigint, $22::bigint, $23::timestamptz, $24::timestamptz)`

// WakeWorkflowJobSQL makes the waiting job of workflow $1 available at $3
// (River's clock: now), when the workflow is waiting and (with $2 not NULL)
// waits for signal $2: a signal's wake-up. The caller's transaction must hold
// the instance row (FOR KEY SHARE at least) since a statement before this one,
// so that the wait and the job it reads are committed ones, and a wait that
// commits later waits for the caller's transaction (the barrier of
// migrations/workflow/0003_signal_barrier.sql) and wakes its job itself.
const WakeWorkflowJobSQL = `
UPDATE river_job j SET state = 'available', scheduled_at = $3::timestamptz
FROM compute_workflows w
WHERE w.id = $1 AND w.status = 'waiting' AND ($2::text IS NULL OR w.wait->>'signal' = $2::text)
  AND j.id = w.job_id AND j.state = 'scheduled'`

// WakeWorkflowParentSQL wakes the waiting job of the parent $1 of a child that
// just finished, when the parent awaits its children (started at its seq $2)
// and their awaited condition now holds: any finished, or all finished. The
// caller locked the parent's row first. $3 is River's clock (now).
const WakeWorkflowParentSQL = `
UPDATE river_job j SET state = 'available', scheduled_at = $3::timestamptz
FROM compute_workflows p
WHERE p.id = $1 AND p.status = 'waiting' AND p.wait ? 'children'
  AND (p.wait->>'children' = 'any'
       OR NOT EXISTS (SELECT 1 FROM compute_workflows c
                      WHERE c.parent_id = p.id AND c.parent_seq = $2 AND c.finished_at IS NULL))
  AND j.id = p.job_id AND j.state = 'scheduled'`

// WakeDueWorkflowsSQL makes available the waiting jobs of sleeping and
// waiting workflows whose wake_at has come on compute_now(): the sim clock
// moved forward, or River's wall-clock schedule and compute_now() disagree. A
// retryable job (its step failed and waits out its backoff) is left alone, as
// by the other wake-ups: they cut no backoff short.
// $1 is River's clock (now). It returns how many it woke.
const WakeDueWorkflowsSQL = `
UPDATE river_job j SET state = 'available', scheduled_at = $1::timestamptz
FROM compute_workflows w
WHERE w.status IN ('sleeping', 'waiting') AND w.wake_at <= compute_now()
  AND j.id = w.job_id AND j.state = 'scheduled'`

// CancelWorkflowJobsSQL cancels the waiting step jobs $1 of workflows that were
// cancelled (a running one is fenced by the instance's seq instead), with $2
// as the reason in its errors, at $3 (River's clock: now).
const CancelWorkflowJobsSQL = `
UPDATE river_job SET state = 'cancelled', finalized_at = $3::timestamptz,
       errors = array_append(errors, jsonb_build_object('at', $3::timestamptz, 'attempt', attempt, 'error', $2::text, 'trace', ''))
WHERE id = ANY($1::bigint[]) AND state IN ('available', 'scheduled', 'retryable', 'pending')`

// StuckWorkflowsSQL lists unfinished workflows whose step job is not live (an
// operator cancelled or deleted it, say): they never advance until retried.
// Up to 10, oldest first, with their total.
const StuckWorkflowsSQL = `
SELECT w.id, w.kind, w.step, coalesce(w.job_id, 0), coalesce(j.state::text, 'missing'), count(*) OVER ()
FROM compute_workflows w LEFT JOIN river_job j ON j.id = w.job_id
WHERE w.status IN ('running', 'sleeping', 'waiting', 'cancelling')
  AND (j.id IS NULL OR j.state NOT IN ` + LiveStatesSQL + `)
ORDER BY w.updated_at, w.id LIMIT 10`

// JobState returns job id's state, and false when there is no such job.
func JobState(ctx context.Context, db pg.DBTX, id int64) (string, bool, error) {
	var s string
	err := db.QueryRow(ctx, jobStateSQL, id).Scan(&s)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false, nil
	}
	return s, err == nil, err
}

// --- Tenants (domain/tenancy) ---

// CancelTenantWorkSQL cancels, at $2 with reason $3, tenant $1's River jobs
// that wait to run (not its workflow steps: workflow.CancelTx cancels those,
// with their compensation), and deletes its dirty keys: a deleted tenant's
// outstanding work. A running job finishes. It returns the jobs cancelled and
// the keys dropped.
const CancelTenantWorkSQL = `WITH j AS (
    UPDATE river_job r SET state = 'cancelled', finalized_at = $2,
        errors = array_append(r.errors, jsonb_build_object('at', $2::timestamptz, 'attempt', r.attempt, 'error', $3::text, 'trace', ''))
    WHERE r.state IN ('available', 'scheduled', 'retryable', 'pending') AND r.metadata ? 'tenant'
      AND (r.metadata ->> 'tenant') = $1 AND r.kind <> '` + WorkflowStepKind + `'
    RETURNING r.id
), d AS (
    DELETE FROM compute_dirty WHERE tenant = $1 RETURNING 1
)
SELECT (SELECT count(*) FROM j), (SELECT count(*) FROM d)`
