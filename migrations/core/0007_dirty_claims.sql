-- Dirty keys are claimed in batches straight from compute_dirty (seed 000's work
-- queue), not one River job per key.
--
-- job_id is now NULL while a key waits: the holder of its shard claims due keys
-- (job_id IS NULL AND not_before <= compute_now()) with FOR UPDATE SKIP LOCKED,
-- in batches, and points them at the one River job (kind reconcile_batch) that
-- carries the batch. A key whose reconcile failed on its own points at its own
-- River job (kind reconcile), retried with River's backoff. The run deletes a row
-- only WHERE gen is the gen it read and job_id is its job; any other row of its
-- job goes back to waiting (job_id = NULL). So: one live job per key (one at a
-- time), no lost wake-up, and a key dirtied a thousand times while it waits is
-- one row.
ALTER TABLE compute_dirty ALTER COLUMN job_id DROP NOT NULL;

-- The claim: due, waiting keys of one shard, oldest first. A run reads the rows of
-- its job; waiting rows (most of them, under load) are not in that index at all.
CREATE INDEX compute_dirty_due ON compute_dirty (shard, not_before) WHERE job_id IS NULL;
DROP INDEX compute_dirty_job;
CREATE INDEX compute_dirty_job ON compute_dirty (job_id) WHERE job_id IS NOT NULL;

-- compute_key_hash(key): FNV-1a, 32 bits, of key's UTF-8 bytes: the hash that
-- maps a key to its shard (jobs.KeyHash in Go, pinned by a test to the same values).
CREATE FUNCTION compute_key_hash(k text) RETURNS bigint
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
    AS $body$
DECLARE
    b bytea := convert_to(k, 'UTF8');
    h bigint := 2166136261;
BEGIN
    FOR i IN 0 .. length(b) - 1 LOOP
        h := ((h # get_byte(b, i)) * 16777619) & 4294967295;
    END LOOP;
    RETURN h;
END
$body$;

-- compute_mark_dirty(kind, key, delay_seconds): marks key of reconciler kind as
-- needing a reconcile, in the caller's transaction (it commits or rolls back with
-- it), not before compute_now() + delay_seconds; a key already waiting keeps one
-- row, and the earlier not-before wins. It is what jobs.DirtyTx calls, for
-- triggers, psql scripts and applications in any language. A bad kind, key or
-- delay raises SQLSTATE 22023 (INVALID_ARGUMENT) and writes nothing.
--
-- key_hash, optional, is compute_key_hash(key) computed by the caller (jobs.DirtyTx
-- does, in Go, which saves the loop over the key's bytes here). It only picks the
-- key's shard: whichever shard a key lands in, that shard's holder reconciles it.
CREATE FUNCTION compute_mark_dirty(kind text, key text, delay_seconds double precision DEFAULT 0,
                                   key_hash bigint DEFAULT NULL) RETURNS void
    LANGUAGE plpgsql
    AS $body$
DECLARE
    jid   bigint;
    early boolean;
    st    text;
    jkind text;
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

    INSERT INTO compute_dirty AS d (kind, key, shard, gen, not_before, job_id)
    VALUES (compute_mark_dirty.kind, compute_mark_dirty.key,
            (coalesce(key_hash, compute_key_hash(compute_mark_dirty.key)) % (SELECT shard_count FROM compute_settings))::int, 1,
            compute_now() + make_interval(secs => delay_seconds), NULL)
    ON CONFLICT ON CONSTRAINT compute_dirty_pkey DO UPDATE
       SET gen = d.gen + 1,
           not_before = LEAST(d.not_before, EXCLUDED.not_before)
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
