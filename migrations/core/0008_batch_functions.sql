-- The reconcile claim and finish as PL/pgSQL functions: the server plans their
-- statements once per connection and keeps the plans, where the same SQL sent
-- as an unnamed statement (the only kind the pool sends, for PgBouncer) is
-- parsed and planned again at every call: the claim's planning cost more than
-- its execution. Their statements are jobs.ClaimDirtySQL's and the Finish*SQL's
-- (see jobs/riverjob.go for what each does); the Go side calls these.

-- compute_claim_dirty: up to lim due, waiting keys of the reconciler kinds
-- kinds (batch sizes sizes, aligned) of shard, for the holder of lease
-- (owner, epoch; checked in the statement, FOR KEY SHARE), oldest not-before
-- first, skipping rows locked by a transaction in flight; one River job of
-- kind job_kind (max_attempts, priority) per batch, running under owner in
-- queue at at; the keys' rows point at it. Returns each key's job, kind, key
-- and gen.
CREATE FUNCTION compute_claim_dirty(shard int, lease text, owner text, epoch bigint, kinds text[], sizes int[],
                                    lim int, at timestamptz, queue text, job_kind text, max_attempts int,
                                    priority int)
    RETURNS TABLE (job_id bigint, kind text, key text, gen bigint)
    LANGUAGE plpgsql
    AS $body$
#variable_conflict use_variable
BEGIN
    RETURN QUERY
    WITH fence AS (
        SELECT 1 FROM compute_leases l
        WHERE l.name = lease AND l.owner = compute_claim_dirty.owner AND l.epoch = compute_claim_dirty.epoch
          AND l.expires_at > compute_now()
        FOR KEY SHARE
    ), pick AS (
        SELECT d.kind, d.key FROM compute_dirty d
        WHERE d.shard = compute_claim_dirty.shard AND d.job_id IS NULL AND d.not_before <= compute_now()
          AND d.kind = ANY(kinds) AND EXISTS (SELECT 1 FROM fence)
        ORDER BY d.not_before
        LIMIT lim
        FOR UPDATE SKIP LOCKED
    ), grouped AS (
        SELECT p.kind, p.key, (row_number() OVER (PARTITION BY p.kind ORDER BY p.key) - 1) / greatest(b.size, 1) AS chunk
        FROM pick p JOIN unnest(kinds, sizes) AS b(kind, size) ON b.kind = p.kind
    ), batch AS MATERIALIZED (
        SELECT g.kind, g.chunk, array_agg(g.key ORDER BY g.key) AS keys, nextval('river_job_id_seq') AS id
        FROM grouped g GROUP BY g.kind, g.chunk
    ), job AS (
        INSERT INTO river_job (id, args, kind, max_attempts, priority, queue, scheduled_at, state,
                               attempt, attempted_at, attempted_by, tags, metadata)
        SELECT b.id, jsonb_build_object('reconciler', b.kind, 'keys', to_jsonb(b.keys)), job_kind,
               compute_claim_dirty.max_attempts, compute_claim_dirty.priority, compute_claim_dirty.queue, at,
               'running'::river_job_state, 1, at, ARRAY[compute_claim_dirty.owner], ARRAY[b.kind]::varchar(255)[], '{}'
        FROM batch b
        RETURNING river_job.id
    )
    UPDATE compute_dirty d SET job_id = b.id
    FROM grouped g JOIN batch b ON b.kind = g.kind AND b.chunk = g.chunk
    WHERE d.kind = g.kind AND d.key = g.key AND EXISTS (SELECT 1 FROM job WHERE job.id = b.id)
    RETURNING b.id, d.kind, d.key, d.gen;
END
$body$;

-- compute_finish_batch: after a run of job job of reconciler kind, deletes the
-- rows of keys whose gen is still the one the run read (gens, aligned), returns
-- the others of those keys to waiting (a statement of its own: it sees a dirty
-- committed during the run), and, unless attempt is NULL, completes the job in
-- that attempt at at. Returns the rows and the job it changed: one per key,
-- plus one for the job, unless a row stopped pointing at the job.
CREATE FUNCTION compute_finish_batch(kind text, job bigint, keys text[], gens bigint[], attempt int,
                                     at timestamptz) RETURNS bigint
    LANGUAGE plpgsql
    AS $body$
#variable_conflict use_variable
DECLARE
    deleted  bigint := 0;
    released bigint := 0;
    done     bigint := 0;
BEGIN
    IF cardinality(keys) > 0 THEN
        DELETE FROM compute_dirty d
        USING unnest(keys, gens) AS f(key, gen)
        WHERE d.kind = compute_finish_batch.kind AND d.job_id = job AND d.key = f.key AND d.gen = f.gen;
        GET DIAGNOSTICS deleted = ROW_COUNT;
        UPDATE compute_dirty d SET job_id = NULL
        WHERE d.kind = compute_finish_batch.kind AND d.job_id = job AND d.key = ANY(keys);
        GET DIAGNOSTICS released = ROW_COUNT;
    END IF;
    IF attempt IS NOT NULL THEN
        UPDATE river_job j SET state = 'completed', finalized_at = at
        WHERE j.id = job AND j.attempt = compute_finish_batch.attempt AND j.state = 'running';
        GET DIAGNOSTICS done = ROW_COUNT;
    END IF;
    RETURN deleted + released + done;
END
$body$;

-- compute_fence: the two fences of a fenced job's transaction (workers.FenceTx)
-- in one statement: the lease (name, owner, epoch, unexpired) FOR KEY SHARE,
-- then the job's row in its attempt, running, FOR UPDATE. Returns 0 when both
-- hold, 1 when the lease does not (the job's row is then not locked), 2 when
-- the job is not running that attempt.
CREATE FUNCTION compute_fence(lease text, owner text, epoch bigint, job bigint, attempt int) RETURNS int
    LANGUAGE plpgsql
    AS $body$
#variable_conflict use_variable
BEGIN
    PERFORM 1 FROM compute_leases l
    WHERE l.name = lease AND l.owner = compute_fence.owner AND l.epoch = compute_fence.epoch
      AND l.expires_at > compute_now()
    FOR KEY SHARE;
    IF NOT FOUND THEN
        RETURN 1;
    END IF;
    PERFORM 1 FROM river_job j WHERE j.id = job AND j.attempt = compute_fence.attempt AND j.state = 'running'
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 2;
    END IF;
    RETURN 0;
END
$body$;
