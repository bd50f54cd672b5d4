-- The dev demo (better-compute dev only): counters an application changes, and a
-- reconciler that copies each counter's value to reconciled.
CREATE TABLE demo_counters (
    id            text PRIMARY KEY,
    value         bigint NOT NULL DEFAULT 0,
    reconciled    bigint NOT NULL DEFAULT 0,
    reconciled_at timestamptz,
    updated_at    timestamptz NOT NULL DEFAULT compute_now()
);

INSERT INTO demo_counters (id) SELECT 'counter-' || lpad(g::text, 3, '0') FROM generate_series(1, 50) g;
