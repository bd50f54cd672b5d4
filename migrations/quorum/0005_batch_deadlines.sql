-- quorum/0005_batch_deadlines: every open batch has a River job scheduled for its
-- deadline that expires it (checking compute_now(), so it also works under the
-- sim clock). expire_job_id names that job; the index finds open batches by
-- deadline for operators and sweeps.
ALTER TABLE quorum_batches ADD COLUMN expire_job_id bigint;
CREATE INDEX quorum_batches_open_deadline ON quorum_batches (deadline) WHERE state = 'open';
