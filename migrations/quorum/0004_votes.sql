-- quorum/0004_votes: one vote per eligible voter. The primary key refuses a
-- second vote and the foreign key a vote from someone who is not a voter of the
-- batch, whatever the code does; the domain checks both first and answers with
-- a clear code.
CREATE TABLE quorum_votes (
    batch_id bigint NOT NULL,
    voter    text NOT NULL,
    approve  boolean NOT NULL,
    cast_at  timestamptz NOT NULL DEFAULT compute_now(),
    PRIMARY KEY (batch_id, voter),
    FOREIGN KEY (batch_id, voter) REFERENCES quorum_batch_voters (batch_id, voter)
);
