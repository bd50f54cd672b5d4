-- quorum/0007_vote_reasons: a voter may say why it approves or rejects; the
-- reason is kept with the vote for whoever reviews the batch later.
ALTER TABLE quorum_votes
    ADD COLUMN reason text NOT NULL DEFAULT '' CHECK (length(reason) <= 2000);
