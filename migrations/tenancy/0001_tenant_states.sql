-- Tenants (the tenancy module, domain/tenancy): the customers one deployment
-- serves. Work of every kind may name its tenant (workers.WithTenant); a
-- tenant's row appears the first time work names it.
--
--   active     its work runs, at most max_running units at once across every
--              process, taken round-robin with the other tenants' work
--   suspended  its work is accepted and held: nothing of it starts (queued
--              reconciles, fenced jobs, workflow steps wait); what runs
--              finishes; its reservations are refused; resume runs it all
--   deleted    its outstanding work was cancelled (workflows compensated); it
--              takes no new work (BC010, CONFLICT); the application's rows stay
--
--   active ⇄ suspended ──delete──▶ deleted (for good)
CREATE TABLE compute_tenants (
    name        text PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._:@-]{0,199}$'),
    state       text NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'suspended', 'deleted')),
    -- How many units of its work may run at once across every process: River
    -- jobs running (fenced jobs, workflow steps) plus reconcile batches in
    -- their transaction.
    max_running int NOT NULL DEFAULT 10 CHECK (max_running > 0),
    reason      text CHECK (reason IS NULL OR length(reason) <= 500),
    created_at  timestamptz NOT NULL DEFAULT compute_now(),
    changed_at  timestamptz NOT NULL DEFAULT compute_now()
);

CREATE INDEX compute_tenants_held ON compute_tenants (state) WHERE state <> 'active';

-- compute_tenant_key(name): the first key of the tenant's advisory locks (its
-- run slots (key, 0 … max_running-1) and its gate (key, -1)), non-negative, so
-- pg_locks shows it as classid.
CREATE FUNCTION compute_tenant_key(t text) RETURNS int
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT hashtext('bettercompute.tenant:' || t) & 2147483647 $$;

-- compute_tenant_use(t): the check every enqueue of t's work makes, in the
-- enqueuer's transaction: t's row (made if new) held FOR KEY SHARE until the
-- transaction ends, so a delete (which takes it FOR UPDATE) waits for the work
-- in flight and then cancels it; a deleted tenant's work raises BC010
-- (CONFLICT); a bad name 22023 (INVALID_ARGUMENT). A suspended tenant's work is
-- accepted and held.
CREATE FUNCTION compute_tenant_use(t text) RETURNS void
    LANGUAGE plpgsql
    AS $body$
DECLARE
    st text;
BEGIN
    IF t IS NULL OR t !~ '^[A-Za-z0-9][A-Za-z0-9._:@-]{0,199}$' THEN
        RAISE EXCEPTION 'tenant %: want 1 to 200 of [A-Za-z0-9._:@-], starting with a letter or digit', coalesce(quote_literal(t), 'NULL')
            USING ERRCODE = '22023';
    END IF;
    SELECT x.state INTO st FROM compute_tenants x WHERE x.name = t FOR KEY SHARE;
    IF NOT FOUND THEN
        INSERT INTO compute_tenants (name) VALUES (t) ON CONFLICT DO NOTHING;
        SELECT x.state INTO st FROM compute_tenants x WHERE x.name = t FOR KEY SHARE;
    END IF;
    IF st = 'deleted' THEN
        RAISE EXCEPTION 'tenant % is deleted: it takes no new work', t USING ERRCODE = 'BC010';
    END IF;
END
$body$;

-- compute_tenant_running(t): t's units running now, across every process:
-- its River jobs in state running (a killed process's count until they are
-- handed back) plus its run slots held (reconcile batches in their
-- transaction; a dead connection's go with it).
CREATE FUNCTION compute_tenant_running(t text) RETURNS bigint
    LANGUAGE sql STABLE
    AS $$
    SELECT (SELECT count(*) FROM river_job j
            WHERE j.state = 'running' AND j.metadata ? 'tenant' AND (j.metadata ->> 'tenant') = t)
         + (SELECT count(*) FROM pg_locks l
            WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
              AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
              AND l.classid = compute_tenant_key(t)::oid AND l.objid::bigint < 2147483648)
$$;

-- compute_tenant_slot(t, lim): takes one of t's lim run slots for the rest of
-- the caller's transaction, if t runs fewer than lim units counting it
-- (compute_tenant_running), and says whether it did. The count is made under
-- t's gate, which the fetch of t's River jobs holds too (compute_fetch_jobs),
-- and the gate is let go at once (a subtransaction rolled back): so two
-- processes never both take t's last unit, and no batch holds the gate.
CREATE FUNCTION compute_tenant_slot(t text, lim int) RETURNS boolean
    LANGUAGE plpgsql
    AS $body$
DECLARE
    k   int := compute_tenant_key(t);
    got boolean := false;
    ok  boolean := false;
BEGIN
    BEGIN -- the slot, kept unless the count says no
        FOR i IN 0 .. lim - 1 LOOP
            IF pg_try_advisory_xact_lock(k, i) THEN
                got := true;
                EXIT;
            END IF;
        END LOOP;
        IF got THEN
            BEGIN -- the gate, let go at once
                PERFORM pg_advisory_xact_lock(k, -1);
                ok := compute_tenant_running(t) <= lim;
                RAISE EXCEPTION USING ERRCODE = 'BC002';
            EXCEPTION WHEN SQLSTATE 'BC002' THEN
                NULL;
            END;
            IF NOT ok THEN
                RAISE EXCEPTION USING ERRCODE = 'BC003'; -- give the slot back
            END IF;
        END IF;
    EXCEPTION WHEN SQLSTATE 'BC003' THEN
        RETURN false;
    END;
    RETURN got AND ok;
END
$body$;

-- compute_tenant_reservable(t): the check a reservation of t makes first
-- (domain/capacity), in its transaction: a suspended or deleted tenant's
-- reservation raises BC010 (CONFLICT); its bookings stay. t's row, if any, is
-- held FOR SHARE until the transaction ends, so a suspend waits for the
-- reservations in flight and none commits after it. A tenant no work has
-- named may reserve.
CREATE FUNCTION compute_tenant_reservable(t text) RETURNS void
    LANGUAGE plpgsql
    AS $body$
DECLARE
    st text;
BEGIN
    SELECT x.state INTO st FROM compute_tenants x WHERE x.name = t FOR SHARE;
    IF st IN ('suspended', 'deleted') THEN
        RAISE EXCEPTION 'tenant % is %: its reservations are refused', t, st USING ERRCODE = 'BC010';
    END IF;
END
$body$;
