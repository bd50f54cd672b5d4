-- backfill/0002_batch_size: batches are sized by time, not by a fixed row count.
--
-- batch_size is the number of rows the next batch of the current run asks for, as
-- the backfill's sizing chose it from the last batch's time (at most the
-- backfill's BatchSize); NULL until the run's first batch commits (that one asks
-- for min(BatchSize, 1000)). A batch records it in the same transaction as its
-- rows and its progress, so a job that takes over after a crash goes on with the
-- size the last committed batch chose. start resets it; resume keeps it.
ALTER TABLE compute_backfills
    ADD COLUMN batch_size integer CHECK (batch_size > 0);
