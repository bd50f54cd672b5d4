-- Release 1: the items table.
CREATE TABLE inventory_items (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name       text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT compute_now()
);
