-- Worker identities: one row per worker identity (a host name and a slot, or what
-- the operator configures), naming its current incarnation (a counter that goes up
-- at every start) and the process that runs it. The leases of an incarnation are
-- owned by '<identity>#<incarnation>'; the next incarnation of the same identity
-- takes them over at once, with a new epoch, instead of waiting out their TTL. A
-- live incarnation heartbeats seen_at; one that finds its incarnation replaced
-- stops (domain/lease, identity.go).
CREATE TABLE compute_workers (
    identity    text PRIMARY KEY CHECK (identity ~ '^[A-Za-z0-9._:@/-]{1,200}$'),
    incarnation bigint NOT NULL CHECK (incarnation > 0),
    host        text NOT NULL,
    pid         integer NOT NULL,
    -- The Linux boot id and the process's start time in clock ticks since boot:
    -- with the pid they name one process on one host, so a restart on the same
    -- host can tell at once whether the previous incarnation is still running.
    boot_id     text NOT NULL DEFAULT '',
    proc_start  bigint NOT NULL DEFAULT 0,
    started_at  timestamptz NOT NULL DEFAULT compute_now(),
    seen_at     timestamptz NOT NULL DEFAULT compute_now(),
    stopped_at  timestamptz
);
