-- A workflow step's move as a PL/pgSQL function (jobs.AdvanceWorkflowSQL calls
-- it): the server plans its statement once per connection and keeps the plan,
-- where the same statement sent as an unnamed statement (the only kind the
-- pool sends, for PgBouncer) was parsed and planned again at every step, and
-- its planning cost more than its execution.
--
-- compute_workflow_advance moves workflow a_id, locked by the caller's
-- transaction at seq a_seq, to its next state, and inserts the River job of
-- its next step when a_job says so (kind workflow_step, priority 1, its
-- metadata {"traceparent": a_cause} or empty): a_status, a_step, a_state (NULL
-- keeps it), a_result, a_error, a_wait, a_wake_at (on compute_now(); NULL for
-- none), a_queue, a_run_at (River's scheduled_at), a_job_state, a_max_attempts,
-- and a_keep, without a job, the running job that stays the instance's (an
-- inline step; NULL otherwise). It returns the new seq and job id (NULL without
-- a job); no row means the seq moved.
CREATE FUNCTION compute_workflow_advance(a_id text, a_seq bigint, a_status text, a_step text, a_state jsonb,
                                         a_result jsonb, a_error text, a_wait jsonb, a_wake_at timestamptz,
                                         a_job boolean, a_queue text, a_run_at timestamptz,
                                         a_job_state river_job_state, a_max_attempts int, a_cause text,
                                         a_keep bigint)
    RETURNS TABLE (seq bigint, job_id bigint)
    LANGUAGE plpgsql
    AS $body$
BEGIN
    RETURN QUERY
    WITH w AS (
        UPDATE compute_workflows AS x SET status = a_status, step = a_step, seq = x.seq + 1,
               job_id = CASE WHEN a_job THEN nextval('river_job_id_seq') ELSE a_keep END,
               state = COALESCE(a_state, x.state), result = a_result, error = a_error, wait = a_wait,
               wake_at = a_wake_at,
               attempt = 0, updated_at = compute_now(),
               finished_at = CASE WHEN a_status IN ('completed', 'failed', 'cancelled') THEN compute_now() END
        WHERE x.id = a_id AND x.seq = a_seq
        RETURNING x.id, x.kind, x.step, x.seq, x.job_id
    ), j AS (
        INSERT INTO river_job (id, args, kind, max_attempts, priority, queue, scheduled_at, state, tags, metadata)
        SELECT w.job_id, jsonb_build_object('workflow_id', w.id, 'workflow', w.kind, 'step', w.step, 'seq', w.seq),
               'workflow_step', a_max_attempts, 1, a_queue, a_run_at, a_job_state, '{}',
               CASE WHEN a_cause IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('traceparent', a_cause) END
        FROM w WHERE a_job AND w.job_id IS NOT NULL
        RETURNING river_job.id
    )
    SELECT w.seq, w.job_id FROM w;
END
$body$;

-- compute_workflow_start inserts workflow instances and the River job of each
-- one's first step (kind workflow_step, 25 attempts, priority 1, in the shard
-- queue shard_<hash % shard_count>, available at a_run_at, its metadata
-- {"traceparent": a_cause} or empty): a_ids, a_kinds, a_inputs, a_hashes (the
-- FNV-1a hashes of the ids), a_parent_id and a_parent_seq. A kind not in
-- compute_workflow_kinds inserts nothing; an id that exists inserts nothing.
-- It returns the ids inserted. (jobs.StartWorkflowsSQL calls it.)
CREATE FUNCTION compute_workflow_start(a_ids text[], a_kinds text[], a_inputs jsonb[], a_hashes bigint[],
                                       a_parent_id text, a_parent_seq bigint, a_run_at timestamptz, a_cause text)
    RETURNS TABLE (id text)
    LANGUAGE plpgsql
    AS $body$
BEGIN
    RETURN QUERY
    WITH i AS (
        SELECT * FROM unnest(a_ids, a_kinds, a_inputs, a_hashes) AS i(id, kind, input, hash)
    ), w AS (
        INSERT INTO compute_workflows AS w (id, kind, status, step, seq, job_id, input, parent_id, parent_seq)
        SELECT i.id, i.kind, 'running', k.steps[1], 1, nextval('river_job_id_seq'), i.input, a_parent_id, a_parent_seq
        FROM i JOIN compute_workflow_kinds k ON k.kind = i.kind
        ON CONFLICT ON CONSTRAINT compute_workflows_pkey DO NOTHING
        RETURNING w.id, w.kind, w.step, w.seq, w.job_id
    ), j AS (
        INSERT INTO river_job (id, args, kind, max_attempts, priority, queue, scheduled_at, state, tags, metadata)
        SELECT w.job_id, jsonb_build_object('workflow_id', w.id, 'workflow', w.kind, 'step', w.step, 'seq', w.seq),
               'workflow_step', 25, 1, 'shard_' || (i.hash % (SELECT s.shard_count FROM compute_settings s)),
               a_run_at, 'available', '{}',
               CASE WHEN a_cause IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('traceparent', a_cause) END
        FROM w JOIN i ON i.id = w.id
        RETURNING river_job.id
    )
    SELECT w.id FROM w;
END
$body$;
