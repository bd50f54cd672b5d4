-- Liveness from the heartbeat: a worker incarnation declares how long it may be
-- silent before it is taken for dead (its heartbeat interval times the beats it
-- may miss). Once its seen_at is older than that by compute_now(), any standby,
-- of any identity, takes its leases at once with a new epoch instead of waiting
-- out their TTL (domain/lease, acquireSQL). Fencing keeps that safe when the
-- silent process is only paused or cut off: its next fenced transaction finds
-- the new epoch and commits nothing.
--
-- dead_after is NULL for a row written by a binary before this migration: its
-- leases are taken at expiry only, as that binary expects.
ALTER TABLE compute_workers ADD COLUMN dead_after interval CHECK (dead_after > interval '0');

-- Every change of hands of a lease, counted by why the new owner could take it
-- (doctor's "takeovers" check):
--   restart         a later incarnation of the same worker identity took it
--   heartbeat_lost  the holder's heartbeat had stopped for its dead_after
--   lease_expired   the holding had expired unrenewed
--   released        the holder had released it, or had stopped gracefully
-- A first acquisition, and a holder taking back its own expired holding, are
-- not takeovers. The row of a reason is written in the transaction of the
-- takeover, so the count and the new epoch commit together.
CREATE TABLE compute_lease_takeovers (
    reason     text PRIMARY KEY CHECK (reason IN ('restart', 'heartbeat_lost', 'lease_expired', 'released')),
    count      bigint NOT NULL CHECK (count > 0),
    last_at    timestamptz NOT NULL,
    last_lease text NOT NULL,
    last_from  text NOT NULL,
    last_to    text NOT NULL
);
