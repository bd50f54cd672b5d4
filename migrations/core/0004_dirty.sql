-- The dirty-key bookkeeping of reconcilers (seed 000's work queue, on River).
--
-- A row means "this key needs a reconcile". Dirty() upserts it in the caller's
-- transaction: gen goes up and the earlier not_before wins. job_id is the key's
-- one live River job (pending or running); a new job is inserted only when there
-- is none. The reconcile deletes the row only WHERE gen = the gen it read, so a key
-- dirtied while it is reconciled survives, and the run schedules a follow-up job:
-- no wake-up is lost and two reconciles of one key never run at once.
CREATE TABLE compute_dirty (
    kind       text NOT NULL,
    key        text NOT NULL,
    shard      integer NOT NULL,
    gen        bigint NOT NULL DEFAULT 1,
    not_before timestamptz NOT NULL,
    job_id     bigint NOT NULL,
    dirtied_at timestamptz NOT NULL DEFAULT compute_now(),
    PRIMARY KEY (kind, key)
);

CREATE INDEX compute_dirty_job ON compute_dirty (job_id);
