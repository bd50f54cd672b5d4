-- A reconcile batch in one transaction. Until now a batch was two: the claim
-- (a River job inserted running, the keys' rows pointed at it) and the run
-- (the reconciles, the rows deleted, the job completed), so every batch wrote
-- a River job row twice and paid two commits. Now the shard holder's batch
-- takes its keys inside the transaction that reconciles them and deletes
-- their rows at the gen it read, and no River job is written. A key whose
-- reconcile fails still becomes a River job of its own (FailKeySQL), and a
-- batch job claimed by an older binary is still worked by River
-- (compute_claim_dirty and compute_finish_batch stay).
--
-- A batch keeps no lock on the rows it takes: a writer that dirties a key
-- while it is reconciled never waits for the reconcile (its upsert bumps gen;
-- the finish then keeps the row, waiting, and the key runs again), and a row a
-- writer holds is skipped at the take and at the finish. Two batches
-- of one process never take one key (the holder passes the keys it has in
-- flight, skip_kinds/skip_keys); two processes never both commit one, since
-- the lease row is held FOR KEY SHARE from the take to the commit and a
-- takeover changes its epoch (a key) and so waits for the batch to end.

-- compute_take_dirty: for the holder of lease (owner, epoch; unexpired, FOR
-- KEY SHARE until the transaction ends), the oldest due, waiting key of shard
-- of the reconciler kinds kinds (not one of the pairs skip_kinds/skip_keys),
-- then up to that kind's batch size (sizes, aligned with kinds) due, waiting
-- keys of that kind, oldest first. A row a writer's transaction holds (its
-- dirty in flight, whose gen is about to move) is skipped, as the claim
-- skipped it: the rows are picked FOR SHARE SKIP LOCKED in a subtransaction
-- that is then rolled back, so the batch keeps no lock on them and no writer
-- ever waits for it. Returns kind, key, gen, when the key was first dirtied,
-- the causes of its dirties (trace_claimed || trace_links) and how many of
-- them are trace_links (for compute_finish_taken). Returns one row with every
-- column NULL when the lease is not held, and no row when no key is due.
CREATE FUNCTION compute_take_dirty(shard int, lease text, owner text, epoch bigint, kinds text[], sizes int[],
                                   skip_kinds text[], skip_keys text[])
    RETURNS TABLE (kind text, key text, gen bigint, dirtied_at timestamptz, causes text[], links int)
    LANGUAGE plpgsql
    AS $body$
#variable_conflict use_variable
DECLARE
    first_kind text;
    size       int;
    picked     text[];
BEGIN
    PERFORM 1 FROM compute_leases l
    WHERE l.name = lease AND l.owner = compute_take_dirty.owner AND l.epoch = compute_take_dirty.epoch
      AND l.expires_at > compute_now()
    FOR KEY SHARE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT NULL::text, NULL::text, NULL::bigint, NULL::timestamptz, NULL::text[], NULL::int;
        RETURN;
    END IF;

    BEGIN -- a subtransaction: its row locks go with it
        SELECT d.kind INTO first_kind FROM compute_dirty d
        WHERE d.shard = compute_take_dirty.shard AND d.job_id IS NULL AND d.not_before <= compute_now()
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
                WHERE d.shard = compute_take_dirty.shard AND d.job_id IS NULL AND d.not_before <= compute_now()
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
    IF picked IS NULL THEN
        RETURN;
    END IF;

    RETURN QUERY
    SELECT d.kind, d.key, d.gen, d.dirtied_at, d.trace_claimed || d.trace_links, coalesce(cardinality(d.trace_links), 0)
    FROM unnest(picked) WITH ORDINALITY AS p(key, n)
    JOIN compute_dirty d ON d.kind = first_kind AND d.key = p.key
    WHERE d.job_id IS NULL
    ORDER BY p.n;
END
$body$;

-- compute_finish_taken: the end of a batch that took keys (compute_take_dirty)
-- of reconciler kind: deletes the rows of keys whose gen is still the one the
-- batch read (gens, aligned): those keys are done; then, in a statement of
-- its own (which sees a dirty committed meanwhile), the rows of those keys
-- that are left (dirtied during the run) keep waiting, without the causes the
-- batch read (links, aligned: how many of trace_links it read; trace_claimed
-- it read whole). A row a writer's transaction holds (its dirty in flight)
-- is skipped, not waited for: that dirty moves the gen, so the key keeps
-- waiting and runs again (a batch never waits for a writer). Returns how
-- many of the keys' rows it deleted or left waiting: len(keys), unless a row
-- stopped waiting (then the batch is stale and must roll back).
CREATE FUNCTION compute_finish_taken(kind text, keys text[], gens bigint[], links int[]) RETURNS bigint
    LANGUAGE plpgsql
    AS $body$
#variable_conflict use_variable
DECLARE
    deleted bigint := 0;
    waiting bigint := 0;
BEGIN
    DELETE FROM compute_dirty d
    WHERE (d.kind, d.key) IN (
        SELECT x.kind, x.key FROM compute_dirty x JOIN unnest(keys, gens) AS f(key, gen) ON x.key = f.key
        WHERE x.kind = compute_finish_taken.kind AND x.job_id IS NULL AND x.gen = f.gen
        FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS deleted = ROW_COUNT;
    UPDATE compute_dirty d
    SET trace_claimed = NULL,
        trace_links = CASE WHEN coalesce(cardinality(d.trace_links), 0) > f.links
                           THEN d.trace_links[f.links + 1:] END
    FROM unnest(keys, links) AS f(key, links)
    WHERE d.kind = compute_finish_taken.kind AND d.key = f.key AND (d.kind, d.key) IN (
        SELECT x.kind, x.key FROM compute_dirty x
        WHERE x.kind = compute_finish_taken.kind AND x.key = ANY(keys) AND x.job_id IS NULL
        FOR UPDATE SKIP LOCKED);
    SELECT count(*) INTO waiting FROM compute_dirty d
    WHERE d.kind = compute_finish_taken.kind AND d.key = ANY(keys) AND d.job_id IS NULL;
    RETURN deleted + waiting;
END
$body$;
