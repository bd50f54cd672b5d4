-- capacity/0005_extend_holds: a hold is extended one extension at a time.
--
-- version goes up with every change of a reservation (confirm, extend, release,
-- expiry). An extension names the version it read and its UPDATE is guarded by
-- it (WHERE version = $read), so of two concurrent extensions of one hold the
-- second finds the version moved and gets CONFLICT instead of overwriting the
-- first (a lost update). extensions counts the extensions granted.
ALTER TABLE capacity_reservations
    ADD COLUMN version          bigint NOT NULL DEFAULT 1 CHECK (version >= 1),
    ADD COLUMN extensions       integer NOT NULL DEFAULT 0 CHECK (extensions >= 0),
    ADD COLUMN last_extended_at timestamptz;
