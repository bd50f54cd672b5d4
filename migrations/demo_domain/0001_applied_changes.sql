-- demo_domain/0001_applied_changes: what dev's demo applier does with a committed
-- quorum batch of kind demo_change: one row per item, written in the fenced apply
-- transaction (so each batch's items appear exactly once).
CREATE TABLE demo_domain_changes (
    batch_id   bigint NOT NULL,
    position   integer NOT NULL,
    payload    jsonb NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT compute_now(),
    PRIMARY KEY (batch_id, position)
);
