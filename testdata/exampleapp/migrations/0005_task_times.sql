-- When each example task's fenced transaction ran, by the database's wall
-- clock: started_at is read first in the transaction, after its fence (with
-- EXAMPLE_TASK_SLEEP set; without it, when the run is recorded), and
-- finished_at when the run is recorded, just before the commit. Tests compare
-- the intervals of committed runs: how many of a tenant's tasks were in their
-- transactions at once. NULL for a run recorded before this migration.
ALTER TABLE example_task_runs
    ADD COLUMN started_at  timestamptz,
    ADD COLUMN finished_at timestamptz;
