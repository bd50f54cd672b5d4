-- capacity/0006_reserve_functions: the common path of a reservation, and the
-- counter updates of every capacity writer, as PL/pgSQL functions.
--
-- The pool sends only unnamed statements (for PgBouncer), so every statement is
-- parsed and planned again at every call; a reservation used to send five of
-- them (savepoint aside) and its release four, each planned anew. A PL/pgSQL
-- function is planned once per connection and keeps its plans (any connection
-- plans it on first use: no session state a pooler could lose; a change of the
-- tables or of compute_now() invalidates them), as outbox/0003_append does.
-- The SQL is the same as before, in the same lock order:
--
--   quota_usage → pools → nodes → devices → node_resources → pool_capacity_rollup
--
-- and the exclusion constraint capacity_bookings_no_overlap is untouched: a
-- booking lost to a concurrent reservation is still a 23P01 (or a device found
-- taken), which the caller answers by retrying device by device.

-- capacity_reserve_fast: the first attempt of capacity.ReserveTx for a
-- reservation that is not linked, in one statement. In lock order: it charges
-- the tenant's quota, inserts the reservation (its foreign key takes the pool's
-- key-share lock), and books the first in_devices free devices that no other
-- transaction holds (SKIP LOCKED), from spread in_spread on in the pool's
-- (spread, id) order. It does not touch the counters: the caller applies them
-- with capacity_apply_counts once the expiry job is enqueued, so the rollup row
-- is locked for as short a time as possible.
--
-- o_outcome is 'booked', or, having changed nothing, 'no_quota' (the tenant has
-- no quota in the pool) or 'quota' (it would be exceeded; o_limit and o_used say
-- by how much). When it finds fewer free devices that nobody holds than asked,
-- it fails with SQLSTATE BC001, and when a device was booked by a transaction
-- that committed after its snapshot with 23P01: the caller, which runs it in a
-- savepoint, rolls back and books device by device. The devices come back
-- sorted by id, each with its node and its node's rollup stripe.
CREATE FUNCTION capacity_reserve_fast(
    in_pool text, in_tenant text, in_start timestamptz, in_end timestamptz,
    in_devices integer, in_ttl_secs float8, in_spread integer,
    OUT o_outcome text, OUT o_limit integer, OUT o_used integer,
    OUT o_id bigint, OUT o_start timestamptz, OUT o_end timestamptz,
    OUT o_expires_at timestamptz, OUT o_created_at timestamptz, OUT o_shards integer,
    OUT o_devices text[], OUT o_nodes text[], OUT o_stripes integer[])
    LANGUAGE plpgsql
    AS $body$
BEGIN
    -- 1. quota_usage: charge first.
    UPDATE capacity_quota_usage q SET used = q.used + in_devices, updated_at = compute_now()
     WHERE q.tenant = in_tenant AND q.pool_id = in_pool AND q.used + in_devices <= q.quota_limit;
    IF NOT FOUND THEN
        SELECT q.quota_limit, q.used INTO o_limit, o_used
          FROM capacity_quota_usage q WHERE q.tenant = in_tenant AND q.pool_id = in_pool;
        o_outcome := CASE WHEN FOUND THEN 'quota' ELSE 'no_quota' END;
        RETURN;
    END IF;

    -- 2. pools (key share, through the foreign key): the reservation.
    INSERT INTO capacity_reservations AS r (pool_id, tenant, during, device_count, expires_at)
    VALUES (in_pool, in_tenant, tstzrange(in_start, in_end), in_devices,
            compute_now() + make_interval(secs => in_ttl_secs))
    RETURNING r.id, lower(r.during), upper(r.during), r.expires_at, r.created_at
         INTO o_id, o_start, o_end, o_expires_at, o_created_at;
    SELECT s.shard_count INTO o_shards FROM compute_settings s;

    -- 3. devices: the first free ones nobody holds, locked, and their bookings.
    WITH c AS (
        SELECT d.id, d.node_id
          FROM capacity_devices d
         WHERE d.pool_id = in_pool AND (d.spread, d.id) >= (in_spread, '')
           AND d.node_active AND NOT EXISTS (
               SELECT 1 FROM capacity_bookings b
                WHERE b.device_id = d.id AND b.state IN ('hold', 'confirmed')
                  AND b.during && tstzrange(in_start, in_end))
         ORDER BY d.spread, d.id
         LIMIT in_devices
           FOR NO KEY UPDATE SKIP LOCKED
    ), ins AS (
        INSERT INTO capacity_bookings (reservation_id, device_id, node_id, pool_id, tenant, during, state)
        SELECT o_id, c.id, c.node_id, in_pool, in_tenant, tstzrange(in_start, in_end), 'hold' FROM c
        RETURNING device_id, node_id
    )
    SELECT array_agg(ins.device_id ORDER BY ins.device_id COLLATE "C"),
           array_agg(ins.node_id ORDER BY ins.device_id COLLATE "C"),
           array_agg(capacity_stripe(ins.node_id)::integer ORDER BY ins.device_id COLLATE "C")
      INTO o_devices, o_nodes, o_stripes
      FROM ins;
    IF coalesce(cardinality(o_devices), 0) < in_devices THEN
        RAISE EXCEPTION 'capacity_reserve_fast: fewer than % free devices of pool % that no other transaction holds', in_devices, in_pool
            USING ERRCODE = 'BC001';
    END IF;
    o_outcome := 'booked';
END
$body$;

-- capacity_apply_counts: the counter updates of a capacity writer, in lock
-- order, each of a row that must exist (SQLSTATE XX000 otherwise): the quota
-- refunds (in_refunds[i] devices to tenant in_tenants[i] in pool in_pool, rows
-- the caller has locked), then node_resources (holds and confirmed of node
-- in_nodes[i] change by in_holds[i] and in_confirmed[i]), then the pool's rollup
-- stripes (stripe in_stripes[i] by in_stripe_holds[i], in_stripe_confirmed[i]).
-- The arrays come in lock order: tenants, nodes and stripes each sorted.
CREATE FUNCTION capacity_apply_counts(
    in_pool text, in_tenants text[], in_refunds integer[],
    in_nodes text[], in_holds integer[], in_confirmed integer[],
    in_stripes integer[], in_stripe_holds integer[], in_stripe_confirmed integer[])
    RETURNS void
    LANGUAGE plpgsql
    AS $body$
BEGIN
    FOR i IN 1 .. coalesce(cardinality(in_tenants), 0) LOOP
        UPDATE capacity_quota_usage SET used = used - in_refunds[i], updated_at = compute_now()
         WHERE tenant = in_tenants[i] AND pool_id = in_pool;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'capacity_apply_counts: no quota row for tenant % in pool %', in_tenants[i], in_pool
                USING ERRCODE = 'XX000';
        END IF;
    END LOOP;
    FOR i IN 1 .. coalesce(cardinality(in_nodes), 0) LOOP
        UPDATE capacity_node_resources
           SET holds = holds + in_holds[i], confirmed = confirmed + in_confirmed[i], updated_at = compute_now()
         WHERE node_id = in_nodes[i];
        IF NOT FOUND THEN
            RAISE EXCEPTION 'capacity_apply_counts: no resources row for node %', in_nodes[i]
                USING ERRCODE = 'XX000';
        END IF;
    END LOOP;
    FOR i IN 1 .. coalesce(cardinality(in_stripes), 0) LOOP
        UPDATE capacity_pool_capacity_rollup
           SET holds = holds + in_stripe_holds[i], confirmed = confirmed + in_stripe_confirmed[i], updated_at = compute_now()
         WHERE pool_id = in_pool AND stripe = in_stripes[i];
        IF NOT FOUND THEN
            RAISE EXCEPTION 'capacity_apply_counts: no rollup row for stripe % of pool %', in_stripes[i], in_pool
                USING ERRCODE = 'XX000';
        END IF;
    END LOOP;
END
$body$;

-- capacity_release: capacity.ReleaseTx in one statement, in lock order: it locks
-- the tenant's quota row while it reads the reservation (as it was, with its
-- devices), ends it if it is still live (an UPDATE guarded by its state), ends
-- its bookings, then refunds the quota and updates node_resources and the rollup
-- (capacity_apply_counts). o_outcome is 'released' (o_version and o_ended_at are
-- the reservation's new version and end), or, having changed nothing,
-- 'not_found', 'not_live' (o_state says what it is) or 'changed' (ended
-- concurrently between the read and the guarded update).
CREATE FUNCTION capacity_release(
    in_id bigint,
    OUT o_outcome text,
    OUT o_id bigint, OUT o_pool text, OUT o_tenant text, OUT o_start timestamptz, OUT o_end timestamptz,
    OUT o_state text, OUT o_device_count integer, OUT o_link text, OUT o_devices text[],
    OUT o_expires_at timestamptz, OUT o_version bigint, OUT o_extensions integer,
    OUT o_created_at timestamptz, OUT o_confirmed_at timestamptz, OUT o_ended_at timestamptz)
    LANGUAGE plpgsql
    AS $body$
DECLARE
    n_nodes text[];
    n_holds integer[];
    n_confirmed integer[];
    s_stripes integer[];
    s_holds integer[];
    s_confirmed integer[];
    ended integer;
    new_version bigint;
    new_ended_at timestamptz;
BEGIN
    -- 1. quota_usage: locked while the reservation is read.
    SELECT r.id, r.pool_id, r.tenant, lower(r.during), upper(r.during), r.state,
           r.device_count, coalesce(r.link_id, ''),
           ARRAY(SELECT b.device_id FROM capacity_bookings b WHERE b.reservation_id = r.id ORDER BY b.device_id),
           r.expires_at, r.version, r.extensions, r.created_at, r.confirmed_at, r.ended_at
      INTO o_id, o_pool, o_tenant, o_start, o_end, o_state, o_device_count, o_link, o_devices,
           o_expires_at, o_version, o_extensions, o_created_at, o_confirmed_at, o_ended_at
      FROM capacity_reservations r
      JOIN capacity_quota_usage q ON q.tenant = r.tenant AND q.pool_id = r.pool_id
     WHERE r.id = in_id
       FOR NO KEY UPDATE OF q;
    IF NOT FOUND THEN
        o_outcome := 'not_found';
        RETURN;
    END IF;
    IF o_state NOT IN ('hold', 'confirmed') THEN
        o_outcome := 'not_live';
        RETURN;
    END IF;

    -- 2. the reservation, guarded: still live.
    UPDATE capacity_reservations r SET state = 'released', ended_at = compute_now(), version = r.version + 1
     WHERE r.id = in_id AND r.state IN ('hold', 'confirmed')
    RETURNING r.version, r.ended_at INTO new_version, new_ended_at;
    IF NOT FOUND THEN
        o_outcome := 'changed';
        RETURN;
    END IF;
    o_version := new_version;
    o_ended_at := new_ended_at;

    -- 3. its bookings, with each one's state before the update, for the counters.
    WITH u AS (
        UPDATE capacity_bookings b SET state = 'released'
          FROM capacity_bookings o
         WHERE o.id = b.id AND b.reservation_id = in_id AND b.state IN ('hold', 'confirmed')
        RETURNING b.node_id, o.state AS was
    ), per_node AS (
        SELECT u.node_id, count(*) FILTER (WHERE u.was = 'hold')::integer AS holds,
               count(*) FILTER (WHERE u.was = 'confirmed')::integer AS confirmed
          FROM u GROUP BY u.node_id
    ), per_stripe AS (
        SELECT capacity_stripe(p.node_id)::integer AS stripe, sum(p.holds)::integer AS holds,
               sum(p.confirmed)::integer AS confirmed
          FROM per_node p GROUP BY 1
    )
    SELECT (SELECT coalesce(sum(p.holds + p.confirmed), 0)::integer FROM per_node p),
           (SELECT array_agg(p.node_id ORDER BY p.node_id COLLATE "C") FROM per_node p),
           (SELECT array_agg(-p.holds ORDER BY p.node_id COLLATE "C") FROM per_node p),
           (SELECT array_agg(-p.confirmed ORDER BY p.node_id COLLATE "C") FROM per_node p),
           (SELECT array_agg(s.stripe ORDER BY s.stripe) FROM per_stripe s),
           (SELECT array_agg(-s.holds ORDER BY s.stripe) FROM per_stripe s),
           (SELECT array_agg(-s.confirmed ORDER BY s.stripe) FROM per_stripe s)
      INTO ended, n_nodes, n_holds, n_confirmed, s_stripes, s_holds, s_confirmed;

    -- 4. the refund (its row is locked), node_resources, the rollup.
    IF ended > 0 THEN
        PERFORM capacity_apply_counts(o_pool, ARRAY[o_tenant], ARRAY[ended],
                                      n_nodes, n_holds, n_confirmed, s_stripes, s_holds, s_confirmed);
    END IF;
    o_state := 'released';
    o_outcome := 'released';
END
$body$;
