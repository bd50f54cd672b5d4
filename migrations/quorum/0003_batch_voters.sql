-- quorum/0003_batch_voters: who may vote on a batch, fixed when it is proposed.
CREATE TABLE quorum_batch_voters (
    batch_id bigint NOT NULL REFERENCES quorum_batches (id),
    voter    text NOT NULL CHECK (voter <> '' AND length(voter) <= 200),
    PRIMARY KEY (batch_id, voter)
);
