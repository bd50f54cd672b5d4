-- capacity/0007_book_groups: a reservation's devices, their bookings and the
-- counters they charge in one statement, with no savepoint per device.
--
-- Until now a reservation booked device by device when its first attempt lost
-- a device, each booking in a savepoint of its own so that an exclusion
-- violation (23P01) could be caught, and applied the counters in a later
-- statement: bookings and counters were written by subtransactions at several
-- depths. Here an overlap is caught without an error and without a savepoint:
-- under the device's row lock, INSERT … ON CONFLICT ON CONSTRAINT
-- capacity_bookings_no_overlap DO NOTHING turns a booking that another
-- transaction committed since the candidates were read into no row (it waits
-- for a conflicting insert still in progress, then inserts or not). The
-- exclusion constraint is untouched and still holds whatever the code does.
--
-- capacity.ReserveTx now calls capacity_reserve_begin (quota, reservation),
-- enqueues the expiry job, then capacity_book_group for one group of devices
-- (the pool, or one link) at a time, each group in a savepoint: a group that
-- cannot supply every device raises BC001, and rolling its savepoint back
-- gives up its bookings and its device locks before the next group or the
-- waiting pass. Lock order as before:
--
--   quota_usage → pools → nodes → devices → node_resources → pool_capacity_rollup
--
-- capacity_reserve_fast (0006) stays for binaries of the previous release
-- during a rolling upgrade; nothing of this release calls it.

-- capacity_reserve_begin: the first step of a reservation. In lock order it
-- charges the tenant's quota and inserts the reservation (its foreign key takes
-- the pool's key-share lock). o_outcome is 'begun', or, having changed nothing,
-- 'no_quota' (the tenant has no quota in the pool) or 'quota' (it would be
-- exceeded; o_limit and o_used say by how much).
CREATE FUNCTION capacity_reserve_begin(
    in_pool text, in_tenant text, in_start timestamptz, in_end timestamptz,
    in_devices integer, in_ttl_secs float8,
    OUT o_outcome text, OUT o_limit integer, OUT o_used integer,
    OUT o_id bigint, OUT o_start timestamptz, OUT o_end timestamptz,
    OUT o_expires_at timestamptz, OUT o_created_at timestamptz, OUT o_shards integer)
    LANGUAGE plpgsql
    AS $body$
BEGIN
    UPDATE capacity_quota_usage q SET used = q.used + in_devices, updated_at = compute_now()
     WHERE q.tenant = in_tenant AND q.pool_id = in_pool AND q.used + in_devices <= q.quota_limit;
    IF NOT FOUND THEN
        SELECT q.quota_limit, q.used INTO o_limit, o_used
          FROM capacity_quota_usage q WHERE q.tenant = in_tenant AND q.pool_id = in_pool;
        o_outcome := CASE WHEN FOUND THEN 'quota' ELSE 'no_quota' END;
        RETURN;
    END IF;
    INSERT INTO capacity_reservations AS r (pool_id, tenant, during, device_count, expires_at)
    VALUES (in_pool, in_tenant, tstzrange(in_start, in_end), in_devices,
            compute_now() + make_interval(secs => in_ttl_secs))
    RETURNING r.id, lower(r.during), upper(r.during), r.expires_at, r.created_at
         INTO o_id, o_start, o_end, o_expires_at, o_created_at;
    SELECT s.shard_count INTO o_shards FROM compute_settings s;
    o_outcome := 'begun';
END
$body$;

-- capacity_book_group books in_devices free devices of pool in_pool for
-- reservation in_res, all from one group (the whole pool when in_link is '',
-- else link in_link's devices), and applies the counters they charge
-- (node_resources, then the rollup stripes) and, for a link, the reservation's
-- link_id: everything in one statement, so by one subtransaction. o_devices are
-- the booked devices in byte order; o_retries counts the devices it locked and
-- found booked by a transaction that committed after its snapshot.
--
-- Without in_wait it never waits for a lock: it takes the free devices nobody
-- holds (SKIP LOCKED) in the pool's (spread, id) order, first those of spread
-- in_spread or more, then the others, moving past a device it lost. With
-- in_wait it waits for the devices other transactions hold, in id order,
-- holding only devices of lower ids, so these waits never form a cycle.
--
-- When the group cannot supply every device it raises SQLSTATE BC001 (its
-- DETAIL is 'retries=N'): the caller runs it in a savepoint and rolls that
-- back, which gives up the bookings and the device locks it took.
CREATE FUNCTION capacity_book_group(
    in_res bigint, in_pool text, in_tenant text, in_start timestamptz, in_end timestamptz,
    in_devices integer, in_link text, in_wait boolean, in_spread integer,
    OUT o_devices text[], OUT o_retries integer)
    LANGUAGE plpgsql
    AS $body$
DECLARE
    v_during tstzrange := tstzrange(in_start, in_end);
    got text[] := '{}';
    got_nodes text[] := '{}';
    new_devices text[];
    new_nodes text[];
    candidates integer;
    lo integer;
    hi integer;
    cur_spread integer;
    cur_id text;
    n_nodes text[];
    n_holds integer[];
    n_zero integer[];
    s_stripes integer[];
    s_holds integer[];
    s_zero integer[];
BEGIN
    o_retries := 0;
    IF NOT in_wait THEN
        FOR pass_round IN 1 .. 2 LOOP
            -- round 1: spreads from in_spread on; round 2: those before it.
            IF pass_round = 1 THEN
                lo := in_spread; hi := 2147483647;
            ELSE
                lo := 0; hi := in_spread - 1;
            END IF;
            cur_spread := -1; cur_id := '';
            WHILE cardinality(got) < in_devices LOOP
                WITH c AS (
                    SELECT d.id, d.node_id, d.spread
                      FROM capacity_devices d
                     WHERE d.pool_id = in_pool AND d.spread BETWEEN lo AND hi
                       AND (d.spread, d.id) > (cur_spread, cur_id)
                       AND d.node_active AND NOT EXISTS (
                           SELECT 1 FROM capacity_bookings b
                            WHERE b.device_id = d.id AND b.state IN ('hold', 'confirmed') AND b.during && v_during)
                       AND (in_link = '' OR EXISTS (
                           SELECT 1 FROM capacity_device_links l WHERE l.link_id = in_link AND l.device_id = d.id))
                     ORDER BY d.spread, d.id
                     LIMIT in_devices - cardinality(got)
                       FOR NO KEY UPDATE SKIP LOCKED
                ), ins AS (
                    INSERT INTO capacity_bookings (reservation_id, device_id, node_id, pool_id, tenant, during, state)
                    SELECT in_res, c.id, c.node_id, in_pool, in_tenant, v_during, 'hold' FROM c
                        ON CONFLICT ON CONSTRAINT capacity_bookings_no_overlap DO NOTHING
                    RETURNING device_id, node_id
                ), tail AS (
                    SELECT c.spread, c.id FROM c ORDER BY c.spread DESC, c.id DESC LIMIT 1
                )
                SELECT (SELECT count(*) FROM c), (SELECT array_agg(ins.device_id) FROM ins),
                       (SELECT array_agg(ins.node_id) FROM ins), tail.spread, tail.id
                  INTO candidates, new_devices, new_nodes, cur_spread, cur_id
                  FROM (SELECT 1) one LEFT JOIN tail ON true;
                EXIT WHEN candidates = 0;
                got := got || coalesce(new_devices, '{}');
                got_nodes := got_nodes || coalesce(new_nodes, '{}');
                o_retries := o_retries + candidates - coalesce(cardinality(new_devices), 0);
            END LOOP;
        END LOOP;
    ELSE
        cur_id := '';
        WHILE cardinality(got) < in_devices LOOP
            WITH c AS (
                SELECT d.id, d.node_id
                  FROM capacity_devices d
                 WHERE d.pool_id = in_pool AND d.id > cur_id
                   AND d.node_active AND NOT EXISTS (
                       SELECT 1 FROM capacity_bookings b
                        WHERE b.device_id = d.id AND b.state IN ('hold', 'confirmed') AND b.during && v_during)
                   AND (in_link = '' OR EXISTS (
                       SELECT 1 FROM capacity_device_links l WHERE l.link_id = in_link AND l.device_id = d.id))
                 ORDER BY d.id
                 LIMIT in_devices - cardinality(got)
                   FOR NO KEY UPDATE
            ), ins AS (
                INSERT INTO capacity_bookings (reservation_id, device_id, node_id, pool_id, tenant, during, state)
                SELECT in_res, c.id, c.node_id, in_pool, in_tenant, v_during, 'hold' FROM c
                    ON CONFLICT ON CONSTRAINT capacity_bookings_no_overlap DO NOTHING
                RETURNING device_id, node_id
            )
            SELECT (SELECT count(*) FROM c), (SELECT array_agg(ins.device_id) FROM ins),
                   (SELECT array_agg(ins.node_id) FROM ins), (SELECT max(c.id) FROM c)
              INTO candidates, new_devices, new_nodes, cur_id;
            EXIT WHEN candidates = 0;
            got := got || coalesce(new_devices, '{}');
            got_nodes := got_nodes || coalesce(new_nodes, '{}');
            o_retries := o_retries + candidates - coalesce(cardinality(new_devices), 0);
        END LOOP;
    END IF;
    IF cardinality(got) < in_devices THEN
        RAISE EXCEPTION 'capacity_book_group: fewer than % free devices of pool % (group %)', in_devices, in_pool, in_link
            USING ERRCODE = 'BC001', DETAIL = 'retries=' || o_retries;
    END IF;

    -- node_resources, then the rollup stripes, each in key order.
    SELECT array_agg(p.node_id ORDER BY p.node_id COLLATE "C"), array_agg(p.n ORDER BY p.node_id COLLATE "C"),
           array_agg(0 ORDER BY p.node_id COLLATE "C")
      INTO n_nodes, n_holds, n_zero
      FROM (SELECT u.node_id, count(*)::integer AS n FROM unnest(got_nodes) AS u(node_id) GROUP BY u.node_id) p;
    SELECT array_agg(s.stripe ORDER BY s.stripe), array_agg(s.n ORDER BY s.stripe), array_agg(0 ORDER BY s.stripe)
      INTO s_stripes, s_holds, s_zero
      FROM (SELECT capacity_stripe(u.node_id)::integer AS stripe, count(*)::integer AS n
              FROM unnest(got_nodes) AS u(node_id) GROUP BY 1) s;
    PERFORM capacity_apply_counts(in_pool, NULL, NULL, n_nodes, n_holds, n_zero, s_stripes, s_holds, s_zero);
    IF in_link <> '' THEN
        UPDATE capacity_reservations SET link_id = in_link WHERE id = in_res;
    END IF;
    SELECT array_agg(g ORDER BY g COLLATE "C") INTO o_devices FROM unnest(got) AS g;
END
$body$;
