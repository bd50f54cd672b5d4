-- quorum/0002_batch_items: a batch's proposed changes, in order. The applier of
-- the batch's kind receives them by position.
CREATE TABLE quorum_batch_items (
    batch_id bigint NOT NULL REFERENCES quorum_batches (id),
    position integer NOT NULL CHECK (position >= 0),
    payload  jsonb NOT NULL,
    PRIMARY KEY (batch_id, position)
);
