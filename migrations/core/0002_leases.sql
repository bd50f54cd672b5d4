-- Leases: a row per named lease, acquired by one guarded upsert whose epoch goes up
-- whenever the owner changes, and renewed by its holder (domain/lease). A fenced
-- transaction starts with SELECT … FOR KEY SHARE on its lease row. (name, epoch) is
-- a key, so a takeover, which changes the epoch, takes the row's strongest lock and
-- waits for every fenced transaction of the previous holder to end; every later
-- one finds nothing and aborts with FENCED. A renewal changes only expires_at, a
-- non-key column, so it never waits for (or starves behind) the holder's own
-- fenced transactions, as it would under FOR SHARE.
CREATE TABLE compute_leases (
    name       text PRIMARY KEY CHECK (name <> ''),
    owner      text NOT NULL CHECK (owner <> ''),
    epoch      bigint NOT NULL DEFAULT 1 CHECK (epoch > 0),
    expires_at timestamptz NOT NULL,
    acquired_at timestamptz NOT NULL DEFAULT compute_now(),
    UNIQUE (name, epoch)
);

CREATE INDEX compute_leases_owner ON compute_leases (owner);
