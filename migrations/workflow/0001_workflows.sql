-- Durable workflows (domain/workflow): one row per workflow instance, one row
-- per committed step in its history, and its inbox of signals. A workflow's
-- steps run as River jobs of kind workflow_step in the shard queue its id
-- picks; the instance row's seq is the compare-and-set every step's fenced
-- transaction checks, and job_id is the one River job that may advance it.

-- The workflow kinds of the binaries that migrated or started a worker: what
-- StartTx and SignalTx check a kind and a signal name against, and the steps
-- a worker's versioning check compares with the unfinished workflows.
CREATE TABLE compute_workflow_kinds (
    kind text PRIMARY KEY CHECK (kind ~ '^[a-z][a-z0-9_]{0,62}$'),
    steps text[] NOT NULL,
    signals text[] NOT NULL DEFAULT '{}',
    compensate text,
    recorded_at timestamptz NOT NULL DEFAULT compute_now()
);

CREATE TABLE compute_workflows (
    id text PRIMARY KEY CHECK (id ~ '^[A-Za-z0-9][A-Za-z0-9._:/@-]{0,254}$'),
    kind text NOT NULL,
    status text NOT NULL CHECK (status IN ('running', 'sleeping', 'waiting', 'cancelling', 'completed', 'failed', 'cancelled')),
    -- The step to run next; while waiting, the step the awaited event resumes.
    step text NOT NULL,
    seq bigint NOT NULL DEFAULT 1,
    -- The River job that may advance the instance (the only one of this seq).
    job_id bigint,
    input jsonb NOT NULL,
    -- NULL until the first step runs (the definition's Init makes it).
    state jsonb,
    result jsonb,
    error text,
    -- What a waiting instance waits for: {"signal": name, "timeout_step": s}
    -- or {"children": "all"|"any", "timeout_step": s}.
    wait jsonb,
    -- When a sleep ends or an await times out, on compute_now().
    wake_at timestamptz,
    parent_id text,
    parent_seq bigint,
    attempt int NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT compute_now(),
    updated_at timestamptz NOT NULL DEFAULT compute_now(),
    finished_at timestamptz,
    CHECK (octet_length(input::text) <= 1048576),
    CHECK (state IS NULL OR octet_length(state::text) <= 1048576),
    CHECK ((finished_at IS NOT NULL) = (status IN ('completed', 'failed', 'cancelled')))
);

CREATE INDEX compute_workflows_kind_status ON compute_workflows (kind, status, created_at);
CREATE INDEX compute_workflows_status ON compute_workflows (status, created_at);
CREATE INDEX compute_workflows_parent ON compute_workflows (parent_id, parent_seq) WHERE parent_id IS NOT NULL;
CREATE INDEX compute_workflows_wake ON compute_workflows (wake_at) WHERE status IN ('sleeping', 'waiting');
CREATE INDEX compute_workflows_finished ON compute_workflows (finished_at) WHERE finished_at IS NOT NULL;

CREATE TABLE compute_workflow_history (
    workflow_id text NOT NULL REFERENCES compute_workflows (id) ON DELETE CASCADE,
    seq bigint NOT NULL,
    step text NOT NULL,
    -- What the step led to: goto, sleep, await, children, completed, failed,
    -- cancelled, retried.
    outcome text NOT NULL,
    next_step text,
    attempt int NOT NULL DEFAULT 0,
    job_id bigint,
    lease_epoch bigint,
    started_at timestamptz NOT NULL DEFAULT compute_now(),
    committed_at timestamptz NOT NULL DEFAULT compute_now(),
    error text,
    PRIMARY KEY (workflow_id, seq)
);

CREATE TABLE compute_workflow_signals (
    id bigserial PRIMARY KEY,
    workflow_id text NOT NULL REFERENCES compute_workflows (id) ON DELETE CASCADE,
    name text NOT NULL,
    payload jsonb,
    dedup_key text,
    sent_at timestamptz NOT NULL DEFAULT compute_now(),
    consumed_at timestamptz,
    consumed_seq bigint,
    CHECK (payload IS NULL OR octet_length(payload::text) <= 1048576)
);

CREATE UNIQUE INDEX compute_workflow_signals_dedup ON compute_workflow_signals (workflow_id, dedup_key) WHERE dedup_key IS NOT NULL;
CREATE INDEX compute_workflow_signals_inbox ON compute_workflow_signals (workflow_id, name, id) WHERE consumed_at IS NULL;
