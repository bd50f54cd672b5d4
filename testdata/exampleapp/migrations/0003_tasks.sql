-- One row per run of an example task's fenced transaction: a task that ran
-- exactly once has exactly one row, whatever killed or restarted its workers.
CREATE TABLE example_task_runs (
    id      bigserial PRIMARY KEY,
    task_id text NOT NULL,
    job_id  bigint NOT NULL,
    worker  text NOT NULL,
    ran_at  timestamptz NOT NULL DEFAULT compute_now()
);
CREATE INDEX example_task_runs_task ON example_task_runs (task_id);
