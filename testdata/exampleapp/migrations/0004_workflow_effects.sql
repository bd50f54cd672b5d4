-- The example order workflow's domain writes: one row per transactional step
-- of a workflow, written in the step's fenced transaction. n counts the
-- commits, so a step that committed twice (a kill -9 between its commit and
-- the next step, a paused process that woke) shows as n = 2.
CREATE TABLE example_workflow_effects (
    workflow_id text NOT NULL,
    step        text NOT NULL,
    n           int NOT NULL DEFAULT 1,
    -- The pid of the worker process whose commit wrote the row last, and when
    -- (the database's wall clock: tests compare it with a pause).
    worker      text NOT NULL,
    written_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (workflow_id, step)
);
