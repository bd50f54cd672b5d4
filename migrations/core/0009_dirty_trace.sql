-- The trace context of the callers that dirtied a key (platform/tracing): the
-- reconcile that follows is a span caused by them (its parent the first
-- caller's span, a link to each), so one trace shows the application's request
-- and the reconcile it caused, and coalesced dirties show every caller.
--
-- A cause is only a W3C traceparent ("00-<trace id>-<span id>-<flags>", 55
-- characters): never a payload, a key or a secret.
--
--   trace_links    the causes of the dirties since the key was last claimed, in
--                  order, each once, at most 32 (tracing.MaxCauses): later ones
--                  are dropped. NULL when no caller had a sampled span, which is
--                  every call with tracing off.
--   trace_claimed  the claim moves trace_links here (and empties trace_links), so
--                  the run of the claiming job reads them, and a dirty after the
--                  claim starts a fresh list for the next run. A run reads
--                  trace_claimed || trace_links (a dirty between the claim and
--                  the run's read is in its gen too). A key failing alone keeps
--                  them for its own job.
ALTER TABLE compute_dirty ADD COLUMN trace_links text[], ADD COLUMN trace_claimed text[];

-- compute_mark_dirty gains trace_parent: the caller's cause (jobs.DirtyTx passes
-- tracing.Cause of its context, or NULL). When it is NULL, the transaction's
-- setting bettercompute.traceparent is the cause (jobs.TraceTx sets it, or
-- SELECT set_config('bettercompute.traceparent', <traceparent>, true)), so a
-- trigger that calls compute_mark_dirty records the cause of the application
-- transaction that fired it. A cause that is not 55 characters starting with
-- "00-" is ignored: tracing never fails a dirty.
--
-- Dropped and created again (not overloaded) so that a call with 2, 3 or 4
-- arguments, positional or named, still resolves to one function.
DROP FUNCTION compute_mark_dirty(text, text, double precision, bigint);

CREATE FUNCTION compute_mark_dirty(kind text, key text, delay_seconds double precision DEFAULT 0,
                                   key_hash bigint DEFAULT NULL, trace_parent text DEFAULT NULL) RETURNS void
    LANGUAGE plpgsql
    AS $body$
DECLARE
    jid   bigint;
    early boolean;
    st    text;
    jkind text;
    tp    text := coalesce(trace_parent, nullif(current_setting('bettercompute.traceparent', true), ''));
BEGIN
    IF kind IS NULL OR kind !~ '^[a-z][a-z0-9_]{0,62}$' THEN
        RAISE EXCEPTION 'compute_mark_dirty: reconciler kind % : want [a-z][a-z0-9_]{0,62}', coalesce(quote_literal(kind), 'NULL')
            USING ERRCODE = '22023';
    END IF;
    IF key IS NULL OR octet_length(key) < 1 OR octet_length(key) > 512 THEN
        RAISE EXCEPTION 'compute_mark_dirty: key of % must be 1 to 512 bytes, got %', kind, coalesce(octet_length(key), 0)
            USING ERRCODE = '22023';
    END IF;
    IF key_hash IS NOT NULL AND (key_hash < 0 OR key_hash > 4294967295) THEN
        RAISE EXCEPTION 'compute_mark_dirty: key_hash % is not a 32-bit FNV-1a hash', key_hash USING ERRCODE = '22023';
    END IF;
    -- (NaN sorts above every number in PostgreSQL, so the upper bound refuses it too.)
    IF delay_seconds IS NULL OR NOT (delay_seconds >= 0 AND delay_seconds <= 3155760000) THEN
        RAISE EXCEPTION 'compute_mark_dirty: delay_seconds must be 0 to 3155760000 (100 years), got %', coalesce(delay_seconds::text, 'NULL')
            USING ERRCODE = '22023';
    END IF;
    IF tp IS NOT NULL AND (length(tp) <> 55 OR left(tp, 3) <> '00-') THEN
        tp := NULL; -- not a traceparent: ignored
    END IF;

    INSERT INTO compute_dirty AS d (kind, key, shard, gen, not_before, job_id, trace_links)
    VALUES (compute_mark_dirty.kind, compute_mark_dirty.key,
            (coalesce(key_hash, compute_key_hash(compute_mark_dirty.key)) % (SELECT shard_count FROM compute_settings))::int, 1,
            compute_now() + make_interval(secs => delay_seconds), NULL,
            CASE WHEN tp IS NOT NULL THEN ARRAY[tp] END)
    ON CONFLICT ON CONSTRAINT compute_dirty_pkey DO UPDATE
       SET gen = d.gen + 1,
           not_before = LEAST(d.not_before, EXCLUDED.not_before),
           -- each cause once, at most 32 (tracing.MaxCauses)
           trace_links = CASE WHEN EXCLUDED.trace_links IS NULL OR coalesce(cardinality(d.trace_links), 0) >= 32
                                   OR EXCLUDED.trace_links[1] = ANY(d.trace_links)
                              THEN d.trace_links
                              ELSE d.trace_links || EXCLUDED.trace_links END
    RETURNING d.job_id,
              -- an update that moved not_before earlier (compute_now() is stable
              -- within the statement)
              (xmax <> 0 AND d.not_before = compute_now() + make_interval(secs => delay_seconds))
    INTO jid, early;

    IF jid IS NULL THEN
        RETURN; -- waiting for its shard's holder: nothing else to do
    END IF;
    -- The key has a job. A live one runs it (a running one deletes the row only at
    -- the gen it read, so this dirty is not lost). A job that will never run again
    -- (cancelled, discarded, deleted by an operator) lets go of the key; so does a
    -- failing key's own job still waiting out its backoff when this dirty is
    -- earlier (that job, if it starts, finds the key no longer its own).
    SELECT j.state::text, j.kind INTO st, jkind FROM river_job j WHERE j.id = jid;
    IF st IS NULL OR st NOT IN ('available', 'pending', 'running', 'scheduled', 'retryable')
       OR (early AND jkind = 'reconcile' AND st IN ('available', 'scheduled', 'retryable')) THEN
        UPDATE compute_dirty d SET job_id = NULL WHERE d.kind = compute_mark_dirty.kind AND d.key = compute_mark_dirty.key AND d.job_id = jid;
    END IF;
END
$body$;

-- compute_claim_dirty as in core/0008, except that a claimed row's trace_links
-- move to trace_claimed (see above).
CREATE OR REPLACE FUNCTION compute_claim_dirty(shard int, lease text, owner text, epoch bigint, kinds text[], sizes int[],
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
    UPDATE compute_dirty d SET job_id = b.id, trace_claimed = d.trace_links, trace_links = NULL
    FROM grouped g JOIN batch b ON b.kind = g.kind AND b.chunk = g.chunk
    WHERE d.kind = g.kind AND d.key = g.key AND EXISTS (SELECT 1 FROM job WHERE job.id = b.id)
    RETURNING b.id, d.kind, d.key, d.gen;
END
$body$;
