-- Tenants' work (the tenancy module): what each kind of work records of its
-- tenant, and how the shard holder takes it: tenants' work round-robin, each
-- tenant at most its max_running units at once, a suspended tenant's held.
-- Work that names no tenant is taken as before (the functions below fall back
-- to the statements they replace when no tenant's work is waiting).

-- A dirty key's tenant (NULL: none). A key keeps the tenant it was first
-- dirtied with unless a later dirty names one.
ALTER TABLE compute_dirty ADD COLUMN tenant text;

-- The waiting keys of each tenant of a shard ('' for none), oldest first: the
-- skip scan over the tenants with due keys, and each tenant's batch.
CREATE INDEX compute_dirty_tenant_due ON compute_dirty (shard, (coalesce(tenant, '')), not_before) WHERE job_id IS NULL;

-- River jobs name their tenant in their metadata ({"tenant": …}). The
-- available jobs of each tenant of a queue ('' for none), in River's order;
-- and the running jobs of each tenant (compute_tenant_running).
CREATE INDEX compute_river_job_tenant_available ON river_job (queue, (coalesce(metadata ->> 'tenant', '')), priority, scheduled_at, id)
    WHERE state = 'available';
CREATE INDEX compute_river_job_tenant_running ON river_job ((metadata ->> 'tenant'))
    WHERE state = 'running' AND metadata ? 'tenant';

-- compute_mark_dirty gains tenant: the key's tenant (compute_tenant_use checks
-- it first: a deleted tenant's dirty raises BC010). Dropped and created again
-- (not overloaded), as in core/0009, so every earlier call still resolves.
DROP FUNCTION compute_mark_dirty(text, text, double precision, bigint, text);

CREATE FUNCTION compute_mark_dirty(kind text, key text, delay_seconds double precision DEFAULT 0,
                                   key_hash bigint DEFAULT NULL, trace_parent text DEFAULT NULL,
                                   tenant text DEFAULT NULL) RETURNS void
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
    IF tenant IS NOT NULL THEN
        PERFORM compute_tenant_use(tenant);
    END IF;

    INSERT INTO compute_dirty AS d (kind, key, shard, gen, not_before, job_id, trace_links, tenant)
    VALUES (compute_mark_dirty.kind, compute_mark_dirty.key,
            (coalesce(key_hash, compute_key_hash(compute_mark_dirty.key)) % (SELECT shard_count FROM compute_settings))::int, 1,
            compute_now() + make_interval(secs => delay_seconds), NULL,
            CASE WHEN tp IS NOT NULL THEN ARRAY[tp] END, compute_mark_dirty.tenant)
    ON CONFLICT ON CONSTRAINT compute_dirty_pkey DO UPDATE
       SET gen = d.gen + 1,
           not_before = LEAST(d.not_before, EXCLUDED.not_before),
           tenant = coalesce(EXCLUDED.tenant, d.tenant),
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

-- compute_take_fair is compute_take_dirty (core/0011) for a shard where
-- tenants' keys wait: the batch serves one group, the keys of no tenant ('')
-- or of one tenant, taken round-robin: the first group, in name order after
-- after_group (the group this shard's holder served last), that has a due key of
-- kinds and, for a tenant, is not suspended and gets one of its run slots
-- (compute_tenant_slot, held until the batch's transaction ends). When no
-- tenant's key waits it is compute_take_dirty's statements, as they are:
-- copied, not called, since a call of compute_take_dirty from here cost the
-- take 5.5 to 7.6 % more than compute_take_dirty alone, against 3 % for the
-- copy. It returns compute_take_dirty's columns and the keys' tenant.
--
-- Whether a tenant's key waits is read as the first of them by the index of
-- tenants' keys (compute_dirty_tenant_due), not as an EXISTS: PostgreSQL plans
-- that EXISTS as a scan of the table that stops at the first match, which,
-- where no tenant's key waits, reads every row of the table at every take
-- (7.3 ms a take beside 100,000 waiting keys, against 0.5 ms). A group's
-- keys are read by its name alone (not "grp IS NULL OR …", whose plan, once
-- a session keeps one for both cases, reads through the other tenants'
-- backlog in the shard to find them).
CREATE FUNCTION compute_take_fair(shard int, lease text, owner text, epoch bigint, kinds text[], sizes int[],
                                  skip_kinds text[], skip_keys text[], after_group text)
    RETURNS TABLE (kind text, key text, gen bigint, dirtied_at timestamptz, causes text[], links int, tenant text)
    LANGUAGE plpgsql
    AS $body$
#variable_conflict use_variable
DECLARE
    first_kind text;
    size       int;
    picked     text[];
    grp        text;
    names      text[];
    g          text;
    st         text;
    lim        int;
BEGIN
    PERFORM 1 FROM compute_leases l
    WHERE l.name = lease AND l.owner = compute_take_fair.owner AND l.epoch = compute_take_fair.epoch
      AND l.expires_at > compute_now()
    FOR KEY SHARE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT NULL::text, NULL::text, NULL::bigint, NULL::timestamptz, NULL::text[], NULL::int, NULL::text;
        RETURN;
    END IF;

    IF (SELECT coalesce(d.tenant, '') FROM compute_dirty d
        WHERE d.shard = compute_take_fair.shard AND d.job_id IS NULL AND coalesce(d.tenant, '') > ''
        ORDER BY coalesce(d.tenant, '') LIMIT 1) IS NULL THEN
        -- No tenant's key waits: compute_take_dirty's statements, as they are.
        BEGIN -- a subtransaction: its row locks go with it
            SELECT d.kind INTO first_kind FROM compute_dirty d
            WHERE d.shard = compute_take_fair.shard AND d.job_id IS NULL AND d.not_before <= compute_now()
              AND d.kind = ANY(kinds)
              AND NOT EXISTS (SELECT 1 FROM unnest(skip_kinds, skip_keys) AS s(kind, key)
                              WHERE s.kind = d.kind AND s.key = d.key)
            ORDER BY d.not_before
            LIMIT 1
            FOR SHARE SKIP LOCKED;
            IF first_kind IS NOT NULL THEN
                SELECT greatest(b.size, 1) INTO size FROM unnest(kinds, sizes) AS b(kind, size)
                WHERE b.kind = first_kind LIMIT 1;
                SELECT array_agg(p.key ORDER BY p.nb) INTO picked FROM (
                    SELECT d.key, d.not_before AS nb FROM compute_dirty d
                    WHERE d.shard = compute_take_fair.shard AND d.job_id IS NULL AND d.not_before <= compute_now()
                      AND d.kind = first_kind
                      AND NOT EXISTS (SELECT 1 FROM unnest(skip_kinds, skip_keys) AS s(kind, key)
                                      WHERE s.kind = d.kind AND s.key = d.key)
                    ORDER BY d.not_before
                    LIMIT size
                    FOR SHARE SKIP LOCKED) p;
            END IF;
            RAISE EXCEPTION USING ERRCODE = 'BC002'; -- roll the subtransaction back
        EXCEPTION WHEN SQLSTATE 'BC002' THEN
            NULL;
        END;
    ELSE
        -- The groups with a waiting key, in name order ('' first): a skip scan.
        WITH RECURSIVE t(name) AS (
            (SELECT coalesce(d.tenant, '') FROM compute_dirty d
             WHERE d.shard = compute_take_fair.shard AND d.job_id IS NULL
             ORDER BY coalesce(d.tenant, '') LIMIT 1)
            UNION ALL
            SELECT (SELECT coalesce(d.tenant, '') FROM compute_dirty d
                    WHERE d.shard = compute_take_fair.shard AND d.job_id IS NULL AND coalesce(d.tenant, '') > t.name
                    ORDER BY coalesce(d.tenant, '') LIMIT 1)
            FROM t WHERE t.name IS NOT NULL
        )
        SELECT array_agg(t.name ORDER BY (t.name <= coalesce(after_group, '')), t.name) INTO names
        FROM t WHERE t.name IS NOT NULL;
        FOREACH g IN ARRAY coalesce(names, '{}') LOOP
            -- a due key of kinds, not in flight
            CONTINUE WHEN NOT EXISTS (
                SELECT 1 FROM compute_dirty d
                WHERE d.shard = compute_take_fair.shard AND d.job_id IS NULL AND coalesce(d.tenant, '') = g
                  AND d.not_before <= compute_now() AND d.kind = ANY(kinds)
                  AND NOT EXISTS (SELECT 1 FROM unnest(skip_kinds, skip_keys) AS s(kind, key)
                                  WHERE s.kind = d.kind AND s.key = d.key));
            IF g <> '' THEN
                SELECT x.state, x.max_running INTO st, lim FROM compute_tenants x WHERE x.name = g;
                CONTINUE WHEN st = 'suspended';
                CONTINUE WHEN NOT compute_tenant_slot(g, coalesce(lim, 10));
            END IF;
            grp := g;
            EXIT;
        END LOOP;
        IF grp IS NULL THEN
            RETURN;
        END IF;

        -- The same statements, for the keys of group grp alone.
        BEGIN -- a subtransaction: its row locks go with it
            SELECT d.kind INTO first_kind FROM compute_dirty d
            WHERE d.shard = compute_take_fair.shard AND d.job_id IS NULL AND d.not_before <= compute_now()
              AND d.kind = ANY(kinds) AND coalesce(d.tenant, '') = grp
              AND NOT EXISTS (SELECT 1 FROM unnest(skip_kinds, skip_keys) AS s(kind, key)
                              WHERE s.kind = d.kind AND s.key = d.key)
            ORDER BY d.not_before
            LIMIT 1
            FOR SHARE SKIP LOCKED;
            IF first_kind IS NOT NULL THEN
                SELECT greatest(b.size, 1) INTO size FROM unnest(kinds, sizes) AS b(kind, size)
                WHERE b.kind = first_kind LIMIT 1;
                SELECT array_agg(p.key ORDER BY p.nb) INTO picked FROM (
                    SELECT d.key, d.not_before AS nb FROM compute_dirty d
                    WHERE d.shard = compute_take_fair.shard AND d.job_id IS NULL AND d.not_before <= compute_now()
                      AND d.kind = first_kind AND coalesce(d.tenant, '') = grp
                      AND NOT EXISTS (SELECT 1 FROM unnest(skip_kinds, skip_keys) AS s(kind, key)
                                      WHERE s.kind = d.kind AND s.key = d.key)
                    ORDER BY d.not_before
                    LIMIT size
                    FOR SHARE SKIP LOCKED) p;
            END IF;
            RAISE EXCEPTION USING ERRCODE = 'BC002'; -- roll the subtransaction back
        EXCEPTION WHEN SQLSTATE 'BC002' THEN
            NULL;
        END;
    END IF;
    IF picked IS NULL THEN
        RETURN;
    END IF;

    RETURN QUERY
    SELECT d.kind, d.key, d.gen, d.dirtied_at, d.trace_claimed || d.trace_links, coalesce(cardinality(d.trace_links), 0), d.tenant
    FROM unnest(picked) WITH ORDINALITY AS p(key, n)
    JOIN compute_dirty d ON d.kind = first_kind AND d.key = p.key
    WHERE d.job_id IS NULL
    ORDER BY p.n;
END
$body$;

-- compute_fetch_jobs is River's fetch (riverpgxv5's JobGetAvailable: up to
-- max_to_lock available jobs of queue q due by now_, of kinds (NULL: all), set
-- running, attempted at now_ by client) for a queue where tenants' jobs wait:
-- the jobs are taken round-robin across the groups (no tenant, then each
-- tenant in name order): the first of each group, then the second, … in
-- River's order within a group; a suspended tenant's are left; a tenant takes
-- at most max_running less its units running (compute_tenant_running), counted
-- under its gate (held until this statement's transaction ends), so fetches
-- and batches of every process together never run more.
--
-- A tenant's backlog has every shard queue's producer fetch at every poll,
-- so such a fetch reads little and seldom waits. A tenant whose River jobs
-- running already reach its limit is passed over on that count alone (a
-- lower bound of compute_tenant_running, read without pg_locks, which takes
-- every lock partition's lock). A tenant with a backlog in the queue (its
-- limit of jobs available there, or more) whose gate another fetch or batch
-- holds is left to that one (its jobs wait for a later fetch), so that the
-- fetches of other groups' jobs do not line up behind a busy tenant's gate;
-- one with fewer jobs there waits for its gate, so that its jobs, in queues
-- whose fetches run together, all start at once. A fetch with nothing to take
-- returns without the statement that takes jobs.
--
-- When no tenant's job is available it is River's statement, unchanged. That
-- none is, is read as the first of them by the index of tenants' jobs, not as
-- an EXISTS, which PostgreSQL plans as a scan of the table that stops at the
-- first match and, where none is, reads the table whole (16 ms a fetch beside
-- 100,000 available jobs of no tenant, against 0.6 ms).
CREATE FUNCTION compute_fetch_jobs(q text, max_to_lock int, now_ timestamptz, client text, max_attempted_by int,
                                   kinds text[])
    RETURNS SETOF river_job
    LANGUAGE plpgsql
    AS $body$
DECLARE
    names  text[] := '{}';
    allows int[] := '{}';
    g      text;
    st     text;
    lim    int;
    n      bigint;
BEGIN
    IF (SELECT coalesce(j.metadata ->> 'tenant', '') FROM river_job j
        WHERE j.state = 'available' AND j.queue = q AND coalesce(j.metadata ->> 'tenant', '') > ''
        ORDER BY 1 LIMIT 1) IS NULL THEN
        RETURN QUERY
        WITH locked_jobs AS (
            SELECT j.id FROM river_job j
            WHERE j.state = 'available' AND j.queue = q AND (kinds IS NULL OR j.kind = ANY(kinds))
              AND j.scheduled_at <= now_
            ORDER BY j.priority ASC, j.scheduled_at ASC, j.id ASC
            LIMIT max_to_lock
            FOR UPDATE SKIP LOCKED
        )
        UPDATE river_job SET state = 'running', attempt = river_job.attempt + 1, attempted_at = now_,
            attempted_by = array_append(
                CASE WHEN array_length(river_job.attempted_by, 1) >= max_attempted_by
                     THEN river_job.attempted_by[array_length(river_job.attempted_by, 1) + 2 - max_attempted_by:]
                     ELSE river_job.attempted_by END, client)
        FROM locked_jobs WHERE river_job.id = locked_jobs.id
        RETURNING river_job.*;
        RETURN;
    END IF;

    -- The tenants with an available job in q, in name order (a skip scan),
    -- and how many each may start.
    FOR g IN
        WITH RECURSIVE t(name) AS (
            (SELECT coalesce(j.metadata ->> 'tenant', '') FROM river_job j
             WHERE j.state = 'available' AND j.queue = q AND coalesce(j.metadata ->> 'tenant', '') > ''
             ORDER BY 1 LIMIT 1)
            UNION ALL
            SELECT (SELECT coalesce(j.metadata ->> 'tenant', '') FROM river_job j
                    WHERE j.state = 'available' AND j.queue = q AND coalesce(j.metadata ->> 'tenant', '') > t.name
                    ORDER BY 1 LIMIT 1)
            FROM t WHERE t.name IS NOT NULL
        )
        SELECT t.name FROM t WHERE t.name IS NOT NULL ORDER BY t.name
    LOOP
        st := NULL;
        lim := NULL;
        SELECT x.state, x.max_running INTO st, lim FROM compute_tenants x WHERE x.name = g;
        CONTINUE WHEN st = 'suspended';
        lim := coalesce(lim, 10);
        -- its River jobs running: a lower bound of compute_tenant_running,
        -- read without pg_locks
        n := (SELECT count(*) FROM river_job j
              WHERE j.state = 'running' AND j.metadata ? 'tenant' AND (j.metadata ->> 'tenant') = g);
        CONTINUE WHEN n >= lim;
        IF NOT pg_try_advisory_xact_lock(compute_tenant_key(g), -1) THEN
            -- held by another fetch or batch: a backlog here (its limit of
            -- jobs available in q, or more) is left to the holder; fewer jobs
            -- wait for the gate
            CONTINUE WHEN (SELECT count(*) FROM (SELECT FROM river_job j
                                                 WHERE j.state = 'available' AND j.queue = q
                                                   AND coalesce(j.metadata ->> 'tenant', '') = g
                                                 LIMIT lim) x) >= lim;
            PERFORM pg_advisory_xact_lock(compute_tenant_key(g), -1);
        END IF;
        n := lim - compute_tenant_running(g);
        IF n > 0 THEN
            names := names || g;
            allows := allows || least(n, max_to_lock)::int;
        END IF;
    END LOOP;

    -- Nothing to take (every tenant here at its limit or held, and no job of
    -- no tenant due): the fetch of a queue where a tenant's backlog waits
    -- behind its limit, at every poll.
    IF cardinality(names) = 0 AND (SELECT j.id FROM river_job j
                                   WHERE j.state = 'available' AND j.queue = q AND coalesce(j.metadata ->> 'tenant', '') = ''
                                     AND j.scheduled_at <= now_ AND (kinds IS NULL OR j.kind = ANY(kinds))
                                   ORDER BY j.priority, j.scheduled_at, j.id
                                   LIMIT 1) IS NULL THEN
        RETURN;
    END IF;

    RETURN QUERY
    WITH cand AS (
        SELECT c.id, c.priority, c.scheduled_at,
               row_number() OVER (PARTITION BY c.g ORDER BY c.priority, c.scheduled_at, c.id) AS rn
        FROM (
            (SELECT '' AS g, j.id, j.priority, j.scheduled_at FROM river_job j
             WHERE j.state = 'available' AND j.queue = q AND coalesce(j.metadata ->> 'tenant', '') = ''
               AND j.scheduled_at <= now_ AND (kinds IS NULL OR j.kind = ANY(kinds))
             ORDER BY j.priority, j.scheduled_at, j.id
             LIMIT max_to_lock)
            UNION ALL
            SELECT a.name, x.id, x.priority, x.scheduled_at
            FROM unnest(names, allows) AS a(name, n)
            CROSS JOIN LATERAL (
                SELECT j.id, j.priority, j.scheduled_at FROM river_job j
                WHERE j.state = 'available' AND j.queue = q AND coalesce(j.metadata ->> 'tenant', '') = a.name
                  AND j.scheduled_at <= now_ AND (kinds IS NULL OR j.kind = ANY(kinds))
                ORDER BY j.priority, j.scheduled_at, j.id
                LIMIT a.n) x
        ) c
    ), pick AS (
        SELECT j.id FROM river_job j
        JOIN (SELECT cand.id FROM cand ORDER BY cand.rn, cand.priority, cand.scheduled_at, cand.id LIMIT max_to_lock) p
          ON p.id = j.id
        WHERE j.state = 'available'
        FOR UPDATE OF j SKIP LOCKED
    )
    UPDATE river_job SET state = 'running', attempt = river_job.attempt + 1, attempted_at = now_,
        attempted_by = array_append(
            CASE WHEN array_length(river_job.attempted_by, 1) >= max_attempted_by
                 THEN river_job.attempted_by[array_length(river_job.attempted_by, 1) + 2 - max_attempted_by:]
                 ELSE river_job.attempted_by END, client)
    FROM pick WHERE river_job.id = pick.id
    RETURNING river_job.*;
END
$body$;
