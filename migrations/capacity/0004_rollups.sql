-- capacity/0004_rollups: per-node resources and the per-pool capacity rollup,
-- kept in step by every capacity operation in the same transaction, so reading a
-- pool's or a node's numbers never counts bookings. They always equal a recount
-- (the torture test checks it after every phase).
--
--   devices          devices on the node / in the pool
--   holds, confirmed live bookings (one per device) in each live state
--   nodes, active_nodes, active_devices (pool only): bookable capacity
--
-- The pool's rollup is striped over 8 rows: a node's counts always go to stripe
-- capacity_stripe(node id), so concurrent changes on different nodes do not all
-- queue on one row; the pool's numbers are the sums over its stripes. A
-- transaction that changes several stripes of a pool locks them in stripe order.
--
-- Lock order: these are the last two steps of quota_usage → pools → nodes →
-- devices → node_resources → pool_capacity_rollup.

-- capacity_stripe(node): the rollup stripe of a node's counts. The same hash as
-- capacity_devices.spread, so spread % 8 is the stripe of the device's node.
CREATE FUNCTION capacity_stripe(node_id text) RETURNS smallint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $body$ SELECT ((hashtext(node_id) & 2147483647) % 8)::smallint $body$;

CREATE TABLE capacity_node_resources (
    node_id    text PRIMARY KEY REFERENCES capacity_nodes (id),
    pool_id    text NOT NULL REFERENCES capacity_pools (id),
    devices    integer NOT NULL DEFAULT 0 CHECK (devices >= 0),
    holds      integer NOT NULL DEFAULT 0 CHECK (holds >= 0),
    confirmed  integer NOT NULL DEFAULT 0 CHECK (confirmed >= 0),
    updated_at timestamptz NOT NULL DEFAULT compute_now()
);

CREATE TABLE capacity_pool_capacity_rollup (
    pool_id        text NOT NULL REFERENCES capacity_pools (id),
    stripe         smallint NOT NULL CHECK (stripe BETWEEN 0 AND 7),
    nodes          integer NOT NULL DEFAULT 0 CHECK (nodes >= 0),
    active_nodes   integer NOT NULL DEFAULT 0 CHECK (active_nodes >= 0 AND active_nodes <= nodes),
    devices        integer NOT NULL DEFAULT 0 CHECK (devices >= 0),
    active_devices integer NOT NULL DEFAULT 0 CHECK (active_devices >= 0 AND active_devices <= devices),
    holds          integer NOT NULL DEFAULT 0 CHECK (holds >= 0),
    confirmed      integer NOT NULL DEFAULT 0 CHECK (confirmed >= 0),
    updated_at     timestamptz NOT NULL DEFAULT compute_now(),
    PRIMARY KEY (pool_id, stripe)
);

-- Rows for what already exists (nothing, on a fresh install: the module's
-- migrations ship together), counted once.
INSERT INTO capacity_node_resources (node_id, pool_id, devices, holds, confirmed)
SELECT n.id, n.pool_id,
       (SELECT count(*) FROM capacity_devices d WHERE d.node_id = n.id),
       (SELECT count(*) FROM capacity_bookings b WHERE b.node_id = n.id AND b.state = 'hold'),
       (SELECT count(*) FROM capacity_bookings b WHERE b.node_id = n.id AND b.state = 'confirmed')
FROM capacity_nodes n;

INSERT INTO capacity_pool_capacity_rollup (pool_id, stripe, nodes, active_nodes, devices, active_devices, holds, confirmed)
SELECT p.id, s.stripe,
       count(n.id),
       count(n.id) FILTER (WHERE n.state = 'active'),
       coalesce(sum(r.devices), 0),
       coalesce(sum(r.devices) FILTER (WHERE n.state = 'active'), 0),
       coalesce(sum(r.holds), 0),
       coalesce(sum(r.confirmed), 0)
FROM capacity_pools p
CROSS JOIN generate_series(0, 7) AS s(stripe)
LEFT JOIN capacity_nodes n ON n.pool_id = p.id AND capacity_stripe(n.id) = s.stripe
LEFT JOIN capacity_node_resources r ON r.node_id = n.id
GROUP BY p.id, s.stripe;
