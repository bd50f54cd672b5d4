-- The example application's own table: items whose quantity the application
-- changes, and whose reconciled copy a reconciler keeps up to date.
CREATE TABLE example_items (
    id             text PRIMARY KEY,
    qty            bigint NOT NULL DEFAULT 0,
    version        bigint NOT NULL DEFAULT 0,
    reconciled_qty bigint,
    reconciled_version bigint,
    updated_at     timestamptz NOT NULL DEFAULT compute_now()
);
