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
-- The rows a batch takes are read, not locked: a writer that dirties a key
-- while it is reconciled never waits for the reconcile (its upsert bumps gen;
-- the finish then keeps the row, waiting, and the key runs again). Two batches
-- of one process never take one key (the holder passes the keys it has in
-- flight, skip_kinds/skip_keys); two processes never both commit one, since
-- the lease row is held FOR KEY SHARE from the take to the commit and a
-- takeover changes its epoch (a key) and so waits for the batch to end.

-- compute_take_dirty: for the holder of lease (owner, epoch; unexpired, FOR
-- KEY SHARE until the transaction ends), the oldest due, waiting key of shard
-- of the reconciler kinds kinds (not one of the pairs skip_kinds/skip_keys),
-- then up to that kind's batch size (sizes, aligned with kinds) due, waiting
-- keys of that kind, oldest first. Returns kind, key, gen, when the key was
-- first dirtied, the causes of its dirties (trace_claimed || trace_links) and
-- how many of them are trace_links (for compute_finish_taken). Returns one
-- row with every column NULL when the lease is not held, and no row when no
-- key is due.
CREATE FUNCTION compute_take_dirty(shard int, lease text, owner text, epoch bigint, kinds text[], sizes int[],
                                   skip_kinds text[], skip_keys text[])
    RETURNS TABLE (kind text, key text, gen bigint, dirtied_at timestamptz, causes text[], links int)
    LANGUAGE plpgsql
    AS $body$
#variable_conflict use_variable
DECLARE
    first_kind text;
    size       int;
BEGIN
    PERFORM 1 FROM compute_leases l
    WHERE l.name = lease AND l.owner = compute_take_dirty.owner AND l.epoch = compute_take_dirty.epoch
      AND l.expires_at > compute_now()
    FOR KEY SHARE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT NULL::text, NULL::text, NULL::bigint, NULL::timestamptz, NULL::text[], NULL::int;
        RETURN;
    END IF;

    SELECT d.kind INTO first_kind FROM compute_dirty d
    WHERE d.shard = compute_take_dirty.shard AND d.job_id IS NULL AND d.not_before <= compute_now()
      AND d.kind = ANY(kinds)
      AND NOT EXISTS (SELECT 1 FROM unnest(skip_kinds, skip_keys) AS s(kind, key)
                      WHERE s.kind = d.kind AND s.key = d.key)
    ORDER BY d.not_before
    LIMIT 1;
    IF first_kind IS NULL THEN
        RETURN;
    END IF;
    SELECT greatest(b.size, 1) INTO size FROM unnest(kinds, sizes) AS b(kind, size) WHERE b.kind = first_kind LIMIT 1;

    RETURN QUERY
    SELECT d.kind, d.key, d.gen, d.dirtied_at, d.trace_claimed || d.trace_links, coalesce(cardinality(d.trace_links), 0)
    FROM compute_dirty d
    WHERE d.shard = compute_take_dirty.shard AND d.job_id IS NULL AND d.not_before <= compute_now()
      AND d.kind = first_kind
      AND NOT EXISTS (SELECT 1 FROM unnest(skip_kinds, skip_keys) AS s(kind, key)
                      WHERE s.kind = d.kind AND s.key = d.key)
    ORDER BY d.not_before
    LIMIT size;
END
$body$;

-- compute_finish_taken: the end of a batch that took keys (compute_take_dirty)
-- of reconciler kind: deletes the rows of keys whose gen is still the one the
-- batch read (gens, aligned): those keys are done; then, in a statement of
-- its own (which sees a dirty committed meanwhile), the rows of those keys
-- that are left (dirtied during the run) keep waiting, without the causes the
-- batch read (links, aligned: how many of trace_links it read; trace_claimed
-- it read whole). Returns how many rows it deleted or kept: len(keys), unless
-- a row stopped waiting (then the batch is stale and must roll back).
CREATE FUNCTION compute_finish_taken(kind text, keys text[], gens bigint[], links int[]) RETURNS bigint
    LANGUAGE plpgsql
    AS $body$
#variable_conflict use_variable
DECLARE
    deleted bigint := 0;
    kept    bigint := 0;
BEGIN
    DELETE FROM compute_dirty d
    USING unnest(keys, gens) AS f(key, gen)
    WHERE d.kind = compute_finish_taken.kind AND d.job_id IS NULL AND d.key = f.key AND d.gen = f.gen;
    GET DIAGNOSTICS deleted = ROW_COUNT;
    UPDATE compute_dirty d
    SET trace_claimed = NULL,
        trace_links = CASE WHEN coalesce(cardinality(d.trace_links), 0) > f.links
                           THEN d.trace_links[f.links + 1:] END
    FROM unnest(keys, links) AS f(key, links)
    WHERE d.kind = compute_finish_taken.kind AND d.job_id IS NULL AND d.key = f.key;
    GET DIAGNOSTICS kept = ROW_COUNT;
    RETURN deleted + kept;
END
$body$;
