-- A workflow's tenant (the tenancy module): named at its start
-- (workers.WithTenant), inherited by its children, and recorded on the River
-- job of each of its steps ({"tenant": …} in the metadata), so its steps are
-- held while the tenant is suspended and count against the tenant's limit
-- (compute_fetch_jobs, migrations/tenancy/0002_tenant_work.sql). NULL: none.
ALTER TABLE compute_workflows ADD COLUMN tenant text;
CREATE INDEX compute_workflows_tenant ON compute_workflows (tenant, status) WHERE tenant IS NOT NULL;

-- compute_workflow_advance as in workflow/0004, the next step's job naming the
-- instance's tenant.
CREATE OR REPLACE FUNCTION compute_workflow_advance(a_id text, a_seq bigint, a_status text, a_step text, a_state jsonb,
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
        RETURNING x.id, x.kind, x.step, x.seq, x.job_id, x.tenant
    ), j AS (
        INSERT INTO river_job (id, args, kind, max_attempts, priority, queue, scheduled_at, state, tags, metadata)
        SELECT w.job_id, jsonb_build_object('workflow_id', w.id, 'workflow', w.kind, 'step', w.step, 'seq', w.seq),
               'workflow_step', a_max_attempts, 1, a_queue, a_run_at, a_job_state, '{}',
               CASE WHEN a_cause IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('traceparent', a_cause) END
               || CASE WHEN w.tenant IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('tenant', w.tenant) END
        FROM w WHERE a_job AND w.job_id IS NOT NULL
        RETURNING river_job.id
    )
    SELECT w.seq, w.job_id FROM w;
END
$body$;

-- compute_workflow_start as in workflow/0004, with the tenant a_tenant (NULL:
-- the parent's, or none), checked first (compute_tenant_use: a deleted
-- tenant's start raises BC010). Dropped and created again, so a call with
-- eight arguments still resolves to one function.
DROP FUNCTION compute_workflow_start(text[], text[], jsonb[], bigint[], text, bigint, timestamptz, text);

CREATE FUNCTION compute_workflow_start(a_ids text[], a_kinds text[], a_inputs jsonb[], a_hashes bigint[],
                                       a_parent_id text, a_parent_seq bigint, a_run_at timestamptz, a_cause text,
                                       a_tenant text DEFAULT NULL)
    RETURNS TABLE (id text)
    LANGUAGE plpgsql
    AS $body$
DECLARE
    t text := a_tenant;
BEGIN
    IF t IS NULL AND a_parent_id IS NOT NULL THEN
        SELECT p.tenant INTO t FROM compute_workflows p WHERE p.id = a_parent_id;
    END IF;
    IF t IS NOT NULL THEN
        PERFORM compute_tenant_use(t);
    END IF;
    RETURN QUERY
    WITH i AS (
        SELECT * FROM unnest(a_ids, a_kinds, a_inputs, a_hashes) AS i(id, kind, input, hash)
    ), w AS (
        INSERT INTO compute_workflows AS w (id, kind, status, step, seq, job_id, input, parent_id, parent_seq, tenant)
        SELECT i.id, i.kind, 'running', k.steps[1], 1, nextval('river_job_id_seq'), i.input, a_parent_id, a_parent_seq, t
        FROM i JOIN compute_workflow_kinds k ON k.kind = i.kind
        ON CONFLICT ON CONSTRAINT compute_workflows_pkey DO NOTHING
        RETURNING w.id, w.kind, w.step, w.seq, w.job_id, w.tenant
    ), j AS (
        INSERT INTO river_job (id, args, kind, max_attempts, priority, queue, scheduled_at, state, tags, metadata)
        SELECT w.job_id, jsonb_build_object('workflow_id', w.id, 'workflow', w.kind, 'step', w.step, 'seq', w.seq),
               'workflow_step', 25, 1, 'shard_' || (i.hash % (SELECT s.shard_count FROM compute_settings s)),
               a_run_at, 'available', '{}',
               CASE WHEN a_cause IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('traceparent', a_cause) END
               || CASE WHEN w.tenant IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('tenant', w.tenant) END
        FROM w JOIN i ON i.id = w.id
        RETURNING river_job.id
    )
    SELECT w.id FROM w;
END
$body$;
