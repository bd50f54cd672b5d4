-- capacity/0002_quotas: a tenant's quota in a pool, and its usage. used counts the
-- tenant's live bookings (hold or confirmed devices) in the pool. Reserve charges
-- it first and release refunds it first (the first lock of the capacity lock
-- order), and the CHECK makes an overdraft impossible whatever the code does.
CREATE TABLE capacity_quota_usage (
    tenant      text NOT NULL CHECK (tenant <> '' AND length(tenant) <= 200),
    pool_id     text NOT NULL REFERENCES capacity_pools (id),
    quota_limit integer NOT NULL CHECK (quota_limit >= 0),
    used        integer NOT NULL DEFAULT 0,
    updated_at  timestamptz NOT NULL DEFAULT compute_now(),
    PRIMARY KEY (tenant, pool_id),
    CONSTRAINT capacity_quota_within_limit CHECK (used >= 0 AND used <= quota_limit)
);
