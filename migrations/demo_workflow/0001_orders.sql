-- demo_workflow/0001_orders: dev's workflow demo. Each order is one row here and
-- one durable workflow (kind demo_order, id order-<id>), started in the
-- transaction that inserts the row; the workflow's steps hold the order's
-- devices, wait for its payment, and confirm or release, writing the row's
-- status in their own transactions. Rows are the application's: the workflow
-- machinery keeps its own state in compute_workflows.
CREATE TABLE demo_workflow_orders (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    customer       text NOT NULL,
    devices        integer NOT NULL,
    start_at       timestamptz NOT NULL,
    end_at         timestamptz NOT NULL,
    status         text NOT NULL DEFAULT 'placed'
        CHECK (status IN ('placed', 'reserved', 'confirmed', 'released', 'rejected', 'cancelled', 'returned')),
    reservation_id bigint,
    paid_at        timestamptz,
    reason         text,
    created_at     timestamptz NOT NULL DEFAULT compute_now(),
    updated_at     timestamptz NOT NULL DEFAULT compute_now()
);

-- The confirmed orders whose rental is over, which dev's loop returns.
CREATE INDEX demo_workflow_orders_rented ON demo_workflow_orders (end_at) WHERE status = 'confirmed';
