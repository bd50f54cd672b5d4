-- capacity/0003_bookings: reservations and their bookings.
--
-- A reservation is one request: a tenant's N devices of a pool over a time range.
-- It starts as a hold that expires at expires_at unless confirmed; it ends
-- released (by its owner) or expired (by the hold-expiry job). Each of its devices
-- is a booking with the same range and state.
--
-- capacity_bookings_no_overlap is the capacity guarantee: two live bookings
-- (hold or confirmed) of one device over overlapping ranges cannot both commit,
-- whatever the code does. Ranges are bounded and non-empty.

CREATE TABLE capacity_reservations (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    pool_id      text NOT NULL REFERENCES capacity_pools (id),
    tenant       text NOT NULL,
    during       tstzrange NOT NULL
                 CHECK (NOT isempty(during) AND NOT lower_inf(during) AND NOT upper_inf(during)),
    state        text NOT NULL DEFAULT 'hold' CHECK (state IN ('hold', 'confirmed', 'released', 'expired')),
    device_count integer NOT NULL CHECK (device_count BETWEEN 1 AND 64),
    link_id      text, -- the link all devices were taken from, for a linked reservation
    expires_at   timestamptz NOT NULL, -- when the hold lapses (kept after confirmation, for the record)
    created_at   timestamptz NOT NULL DEFAULT compute_now(),
    confirmed_at timestamptz,
    ended_at     timestamptz,
    CHECK ((state IN ('released', 'expired')) = (ended_at IS NOT NULL)),
    CHECK ((confirmed_at IS NOT NULL) OR state <> 'confirmed')
);
-- The expiry job and its sweep find due holds by expiry.
CREATE INDEX capacity_reservations_due ON capacity_reservations (expires_at) WHERE state = 'hold';
CREATE INDEX capacity_reservations_tenant ON capacity_reservations (tenant, pool_id) WHERE state IN ('hold', 'confirmed');

CREATE TABLE capacity_bookings (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    reservation_id bigint NOT NULL REFERENCES capacity_reservations (id),
    device_id      text NOT NULL,
    node_id        text NOT NULL,
    pool_id        text NOT NULL,
    tenant         text NOT NULL,
    during         tstzrange NOT NULL,
    state          text NOT NULL CHECK (state IN ('hold', 'confirmed', 'released', 'expired')),
    created_at     timestamptz NOT NULL DEFAULT compute_now(),
    FOREIGN KEY (device_id, node_id, pool_id) REFERENCES capacity_devices (id, node_id, pool_id),
    UNIQUE (reservation_id, device_id),
    CONSTRAINT capacity_bookings_no_overlap
        EXCLUDE USING gist (device_id WITH =, during WITH &&) WHERE (state IN ('hold', 'confirmed'))
);
CREATE INDEX capacity_bookings_node_live ON capacity_bookings (node_id) WHERE state IN ('hold', 'confirmed');
