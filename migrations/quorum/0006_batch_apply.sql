-- quorum/0006_batch_apply: a committed batch is applied by the applier
-- registered for its kind, in a fenced River job enqueued by the committing vote's
-- transaction (apply_job_id). Applying marks the batch applied in the same
-- transaction, so a batch is applied exactly once:
--
--   committed ──apply job (fenced)──▶ applied
ALTER TABLE quorum_batches
    ADD COLUMN apply_job_id bigint,
    ADD COLUMN applied_at   timestamptz,
    DROP CONSTRAINT quorum_batches_state_check,
    ADD CONSTRAINT quorum_batches_state_check
        CHECK (state IN ('open', 'committed', 'rejected', 'expired', 'applied')),
    ADD CONSTRAINT quorum_batches_applied_check CHECK ((state = 'applied') = (applied_at IS NOT NULL));
