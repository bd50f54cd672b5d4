-- Backfills (workers/backfill): one row per backfill that was ever started, with
-- the progress its batches record in their own transactions.
--
--   (no row) ──start──▶ running ──a batch finds no rows──▶ done
--   running ──pause──▶ paused ──resume──▶ running
--   running, paused ──cancel──▶ cancelled
--   done, cancelled ──start──▶ running (a new run: counters start again)
--
-- 'pending' is a row that exists but was never started (start creates the row
-- and starts it in one transaction, so the CLI reports a backfill without a row
-- as pending too).
--
-- epoch goes up at every start, resume, pause and cancel. A batch job carries the
-- epoch and the batch number it was enqueued for, and runs only if it finds the
-- row running with that epoch and exactly that many batches committed (its
-- transaction locks the row FOR UPDATE first): a stale or duplicate job completes
-- without touching anything.
CREATE TABLE compute_backfills (
    name            text PRIMARY KEY CHECK (name ~ '^[a-z][a-z0-9_]{0,62}$'),
    state           text NOT NULL DEFAULT 'pending'
                    CHECK (state IN ('pending', 'running', 'paused', 'cancelled', 'done')),
    epoch           bigint NOT NULL DEFAULT 0 CHECK (epoch >= 0),
    -- Progress of the current run: committed batches (the last one of a finished
    -- run found no rows) and the rows they handled.
    batches         bigint NOT NULL DEFAULT 0 CHECK (batches >= 0),
    rows_done       bigint NOT NULL DEFAULT 0 CHECK (rows_done >= 0),
    last_batch_at   timestamptz,
    last_batch_rows integer,
    last_batch_ms   integer,
    -- rows_done plus the rows left, as the backfill's Estimate said at estimated_at.
    rows_estimate   bigint,
    estimated_at    timestamptz,
    -- Rows per second, smoothed over the last batches; rate_at is when the current
    -- stretch of running began (start, resume, or the previous batch).
    rate            double precision,
    rate_at         timestamptz,
    -- The batch job that carries the run on (River's river_job.id).
    job_id          bigint,
    -- Failed batch attempts of this run, and the last one's error (1,000 characters).
    errors          bigint NOT NULL DEFAULT 0,
    last_error      text,
    last_error_at   timestamptz,
    started_at      timestamptz,
    finished_at     timestamptz,
    created_at      timestamptz NOT NULL DEFAULT compute_now(),
    updated_at      timestamptz NOT NULL DEFAULT compute_now()
);
