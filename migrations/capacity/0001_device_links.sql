-- capacity/0001_device_links: what bookings are made against. A pool holds nodes;
-- a node (active, draining or down) holds devices; device links group devices of
-- one pool that can be booked together (a pair over NVLink, a group on one
-- switch). A device may belong to several links.
--
-- Ids are the application's own names (a hostname, a serial number). A device's
-- pool is its node's pool: the composite foreign key keeps the copy honest, and
-- bookings reference (device, node, pool) the same way.
--
-- A device also carries node_active, a copy of (its node's state = 'active')
-- written by the transaction that changes the node's state. A reservation locks
-- the devices it books; locking a row that was updated since the statement's
-- snapshot makes PostgreSQL re-check the WHERE on the new version, so a drain
-- that committed a moment ago is never missed (a lock on the node itself would
-- not be re-checked for a non-key update, and would make drains wait).
--
-- spread orders a pool's devices node by node in an order unrelated to their
-- names (a hash of the node): a reservation's first, non-waiting pass starts at
-- a random point of it, so concurrent reservations land on different nodes
-- instead of all queueing on the first one, while one reservation's devices
-- still tend to share a node.

CREATE TABLE capacity_pools (
    id         text PRIMARY KEY CHECK (id <> '' AND length(id) <= 200),
    created_at timestamptz NOT NULL DEFAULT compute_now()
);

CREATE TABLE capacity_nodes (
    id         text PRIMARY KEY CHECK (id <> '' AND length(id) <= 200),
    pool_id    text NOT NULL REFERENCES capacity_pools (id),
    state      text NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'draining', 'down')),
    created_at timestamptz NOT NULL DEFAULT compute_now(),
    updated_at timestamptz NOT NULL DEFAULT compute_now(),
    UNIQUE (id, pool_id)
);
CREATE INDEX capacity_nodes_pool ON capacity_nodes (pool_id, id);

CREATE TABLE capacity_devices (
    id          text PRIMARY KEY CHECK (id <> '' AND length(id) <= 200),
    node_id     text NOT NULL,
    pool_id     text NOT NULL,
    kind        text NOT NULL DEFAULT '',
    node_active boolean NOT NULL DEFAULT true,
    spread      integer NOT NULL GENERATED ALWAYS AS (hashtext(node_id) & 2147483647) STORED,
    created_at  timestamptz NOT NULL DEFAULT compute_now(),
    FOREIGN KEY (node_id, pool_id) REFERENCES capacity_nodes (id, pool_id),
    UNIQUE (id, pool_id),
    UNIQUE (id, node_id, pool_id)
);
CREATE INDEX capacity_devices_pool ON capacity_devices (pool_id, id);
CREATE INDEX capacity_devices_spread ON capacity_devices (pool_id, spread, id);
CREATE INDEX capacity_devices_node ON capacity_devices (node_id, id);

CREATE TABLE capacity_links (
    id         text PRIMARY KEY CHECK (id <> '' AND length(id) <= 200),
    pool_id    text NOT NULL REFERENCES capacity_pools (id),
    created_at timestamptz NOT NULL DEFAULT compute_now(),
    UNIQUE (id, pool_id)
);
CREATE INDEX capacity_links_pool ON capacity_links (pool_id, id);

-- A link's members are devices of the link's own pool.
CREATE TABLE capacity_device_links (
    link_id   text NOT NULL,
    device_id text NOT NULL,
    pool_id   text NOT NULL,
    PRIMARY KEY (link_id, device_id),
    FOREIGN KEY (link_id, pool_id) REFERENCES capacity_links (id, pool_id),
    FOREIGN KEY (device_id, pool_id) REFERENCES capacity_devices (id, pool_id)
);
CREATE INDEX capacity_device_links_device ON capacity_device_links (device_id);
