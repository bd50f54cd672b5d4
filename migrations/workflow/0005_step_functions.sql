-- A transactional step's two statements of ours as PL/pgSQL functions, whose
-- plans the server keeps per connection (as 0004 did for the move): before,
-- the step's lock read and its history insert were statements of their own,
-- parsed and planned again at every step.
--
-- compute_workflow_lock is the first statement of a step's transaction: both
-- fences (compute_fence: the shard lease FOR KEY SHARE, the step job's row in
-- its attempt FOR UPDATE), then workflow a_id's row FOR NO KEY UPDATE, read as
-- domain/workflow reads an instance (its columns, then compute_now()). A fence
-- that does not hold raises SQLSTATE BCF01 (the lease is no longer held at
-- a_epoch) or BCF02 (the job no longer runs attempt a_attempt), which the
-- caller turns into FENCED; the transaction is then aborted, as it would be
-- anyway. No row means the workflow is gone (pruned).
CREATE FUNCTION compute_workflow_lock(a_lease text, a_owner text, a_epoch bigint, a_job bigint, a_attempt int,
                                      a_id text)
    RETURNS TABLE (id text, kind text, status text, step text, seq bigint, job_id bigint, input jsonb,
                   state jsonb, result jsonb, error text, wait jsonb, wake_at timestamptz, parent_id text,
                   parent_seq bigint, created_at timestamptz, updated_at timestamptz,
                   finished_at timestamptz, now timestamptz)
    LANGUAGE plpgsql
    AS $body$
DECLARE
    fenced int;
BEGIN
    fenced := compute_fence(a_lease, a_owner, a_epoch, a_job, a_attempt);
    IF fenced = 1 THEN
        RAISE EXCEPTION 'lease % is no longer held by % at epoch %', a_lease, a_owner, a_epoch USING ERRCODE = 'BCF01';
    ELSIF fenced = 2 THEN
        RAISE EXCEPTION 'job % no longer runs attempt %', a_job, a_attempt USING ERRCODE = 'BCF02';
    END IF;
    RETURN QUERY
    SELECT w.id, w.kind, w.status, w.step, w.seq, w.job_id, w.input, w.state, w.result,
           coalesce(w.error, ''), w.wait, w.wake_at, coalesce(w.parent_id, ''), coalesce(w.parent_seq, 0),
           w.created_at, w.updated_at, w.finished_at, compute_now()
    FROM compute_workflows w WHERE w.id = a_id
    FOR NO KEY UPDATE;
END
$body$;

-- compute_workflow_step is compute_workflow_advance (its first sixteen
-- arguments, and its answer) and, when the move advanced the instance and
-- h_outcome is not NULL, the history row of the step that moved it, in one
-- statement: the step h_ran that committed at a_seq, h_outcome, h_next (NULL
-- for none), h_attempt, h_job and h_epoch (NULL for none), h_started and
-- h_committed (NULL: compute_now()), and a_error as its error.
CREATE FUNCTION compute_workflow_step(a_id text, a_seq bigint, a_status text, a_step text, a_state jsonb,
                                      a_result jsonb, a_error text, a_wait jsonb, a_wake_at timestamptz,
                                      a_job boolean, a_queue text, a_run_at timestamptz,
                                      a_job_state river_job_state, a_max_attempts int, a_cause text,
                                      a_keep bigint, h_ran text, h_outcome text, h_next text, h_attempt int,
                                      h_job bigint, h_epoch bigint, h_started timestamptz,
                                      h_committed timestamptz)
    RETURNS TABLE (seq bigint, job_id bigint)
    LANGUAGE plpgsql
    AS $body$
BEGIN
    RETURN QUERY
    SELECT a.seq, a.job_id FROM compute_workflow_advance(a_id, a_seq, a_status, a_step, a_state, a_result, a_error,
        a_wait, a_wake_at, a_job, a_queue, a_run_at, a_job_state, a_max_attempts, a_cause, a_keep) AS a;
    IF FOUND AND h_outcome IS NOT NULL THEN
        INSERT INTO compute_workflow_history
            (workflow_id, seq, step, outcome, next_step, attempt, job_id, lease_epoch, started_at, committed_at, error)
        VALUES (a_id, a_seq, h_ran, h_outcome, h_next, h_attempt, h_job, h_epoch,
                coalesce(h_started, compute_now()), coalesce(h_committed, compute_now()), a_error);
    END IF;
END
$body$;
