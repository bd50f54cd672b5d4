-- Leases: a row per named lease, acquired or renewed by one guarded UPDATE whose
-- epoch goes up whenever the owner changes (domain/lease). A fenced transaction
-- starts with SELECT … FOR SHARE on its lease row, so a takeover (which updates the
-- row) waits for every fenced transaction of the previous owner to end, and every
-- later one of the previous owner finds nothing and aborts with FENCED.
CREATE TABLE compute_leases (
    name       text PRIMARY KEY CHECK (name <> ''),
    owner      text NOT NULL CHECK (owner <> ''),
    epoch      bigint NOT NULL DEFAULT 1 CHECK (epoch > 0),
    expires_at timestamptz NOT NULL,
    acquired_at timestamptz NOT NULL DEFAULT compute_now()
);

CREATE INDEX compute_leases_owner ON compute_leases (owner);
