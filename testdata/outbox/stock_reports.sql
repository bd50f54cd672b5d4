-- An application-owned outbox table for the table dispatcher (seed 003, "Create
-- the table"), with the two indexes that keep a claim proportional to its batch.
-- Tests load it; docs/outbox.md shows it.
CREATE SCHEMA IF NOT EXISTS inventory;

CREATE TABLE IF NOT EXISTS inventory.items (
    id       uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    quantity integer NOT NULL DEFAULT 0
);

CREATE TABLE IF NOT EXISTS inventory.stock_reports (
    -- The sequence column: an identity numbers rows in insertion order, which is
    -- commit order per key when the writers of a key lock the same row (the
    -- item) before they insert. The primary key is the index on it.
    seq             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The receiver's idempotency key.
    id              uuid NOT NULL UNIQUE DEFAULT gen_random_uuid(),
    -- The ordering column: reports of one item are published in seq order.
    item_id         uuid NOT NULL,
    -- The effect's data.
    delta           integer NOT NULL,
    -- Maintained by the dispatcher; writers leave the defaults.
    attempts        integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT compute_now(),
    claimed_until   timestamptz,
    last_error      text
);

-- The partial index on the ordering column: the rows of keys that are claimed or
-- waiting for a retry. A claim probes it once per candidate row.
CREATE INDEX IF NOT EXISTS inventory_stock_reports_busy
    ON inventory.stock_reports (item_id)
    WHERE claimed_until IS NOT NULL OR attempts > 0;
