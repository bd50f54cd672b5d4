-- What each reconcile saw, so tests can prove no wake-up was lost and no two
-- reconciles of one key overlapped.
CREATE TABLE example_reconcile_log (
    id          bigserial PRIMARY KEY,
    item_id     text NOT NULL,
    seen_version bigint NOT NULL,
    worker      text NOT NULL,
    started_at  timestamptz NOT NULL,
    finished_at timestamptz NOT NULL
);
