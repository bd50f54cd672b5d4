-- dev's outbox demo: orders, and the application-owned outbox table that a
-- table dispatcher delivers (one confirmation per order, in order per
-- customer). Each order is placed in one transaction that also appends an event
-- to the event log, which a log sink prints and the SSE stream shows.
CREATE TABLE demo_outbox_orders (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    customer   text NOT NULL,
    amount     integer NOT NULL,
    created_at timestamptz NOT NULL DEFAULT compute_now()
);

CREATE TABLE demo_outbox_confirmations (
    seq             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id              uuid NOT NULL UNIQUE DEFAULT gen_random_uuid(),
    customer        text NOT NULL,
    order_id        bigint NOT NULL,
    amount          integer NOT NULL,
    attempts        integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT compute_now(),
    claimed_until   timestamptz,
    last_error      text
);

-- The two indexes that keep a claim proportional to its batch: the primary key
-- on the sequence column, and this partial index on the ordering column.
CREATE INDEX demo_outbox_confirmations_busy ON demo_outbox_confirmations (customer)
    WHERE claimed_until IS NOT NULL OR attempts > 0;
