-- outbox/0002_pruned: the retention horizon, so that a reader resuming from a
-- position whose events retention has deleted is told, instead of silently
-- receiving only what is left.
--
-- through_txid, through_seq is the last event retention (domain/outbox.Prune)
-- has deleted, in (txid, seq) order; ('0', 0) until it deletes one. Prune
-- deletes a prefix of the log and moves the horizon forward in the same
-- transaction, never back, so every event at or before the horizon is gone and
-- every committed event after it is still stored. A cursor has lost events iff
-- the horizon is after it. pruned counts the events deleted so far.
--
-- The row is the lock that orders retention against an operator's sink reset:
-- Prune takes it FOR UPDATE before its delete (which, under read committed,
-- then sees any reset that committed meanwhile); a reset to a cursor takes it
-- FOR SHARE and is refused when the horizon is after the cursor. So no reset is
-- accepted whose events are then deleted.
--
-- Events deleted before this migration ran are not known: the horizon starts at
-- the beginning of the log.
CREATE TABLE compute_events_pruned (
    id           boolean PRIMARY KEY DEFAULT true CHECK (id),
    through_txid xid8 NOT NULL DEFAULT '0',
    through_seq  bigint NOT NULL DEFAULT 0 CHECK (through_seq >= 0),
    pruned       bigint NOT NULL DEFAULT 0 CHECK (pruned >= 0),
    updated_at   timestamptz NOT NULL DEFAULT compute_now()
);

INSERT INTO compute_events_pruned DEFAULT VALUES;
