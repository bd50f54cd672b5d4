-- One clock. Every statement of ours reads time through compute_now(), never the
-- server clock function directly; column defaults use it too. This file is the
-- only place that may name the server clock: a test fails on it anywhere else.
--
-- In production compute_now() is the server's clock. Tests and the simulator switch
-- it, database-wide, to a sim clock that only moves forward. The switch replaces the
-- function's body, so the system clock costs nothing: its body inlines.

CREATE TABLE compute_sim_clock (
    id boolean PRIMARY KEY DEFAULT true CHECK (id),
    at timestamptz NOT NULL
);

CREATE FUNCTION compute_now() RETURNS timestamptz
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $body$ SELECT now() $body$;

-- compute_clock_mode(): 'system', 'sim', 'custom' (someone replaced the body), or
-- 'missing' (no compute_now() on the search path).
CREATE FUNCTION compute_clock_mode() RETURNS text
    LANGUAGE sql STABLE
    AS $body$
    SELECT CASE
        WHEN p.prosrc IS NULL THEN 'missing'
        WHEN btrim(p.prosrc) = 'SELECT now()' THEN 'system'
        WHEN btrim(p.prosrc) = 'SELECT at FROM compute_sim_clock WHERE id' THEN 'sim'
        ELSE 'custom'
    END
    FROM (SELECT (SELECT prosrc FROM pg_proc WHERE oid = to_regprocedure('compute_now()')) AS prosrc) p
$body$;

-- compute_use_sim_clock(at): compute_now() returns at from now on, until moved or
-- switched back. Switching on may pick any instant; moving (compute_set_sim_clock)
-- only goes forward.
CREATE FUNCTION compute_use_sim_clock(start_at timestamptz) RETURNS void
    LANGUAGE plpgsql
    AS $body$
BEGIN
    INSERT INTO compute_sim_clock (id, at) VALUES (true, start_at)
        ON CONFLICT (id) DO UPDATE SET at = EXCLUDED.at;
    EXECUTE $f$CREATE OR REPLACE FUNCTION compute_now() RETURNS timestamptz
        LANGUAGE sql STABLE PARALLEL SAFE
        AS $b$ SELECT at FROM compute_sim_clock WHERE id $b$$f$;
END
$body$;

-- compute_set_sim_clock(at): move the sim clock to at. Moving back raises
-- SQLSTATE 22023 (INVALID_ARGUMENT); without the sim clock on, 55000.
CREATE FUNCTION compute_set_sim_clock(to_at timestamptz) RETURNS timestamptz
    LANGUAGE plpgsql
    AS $body$
DECLARE
    cur timestamptz;
BEGIN
    IF compute_clock_mode() <> 'sim' THEN
        RAISE EXCEPTION 'the sim clock is not on (mode %)', compute_clock_mode() USING ERRCODE = '55000';
    END IF;
    SELECT at INTO cur FROM compute_sim_clock WHERE id FOR UPDATE;
    IF to_at < cur THEN
        RAISE EXCEPTION 'the sim clock only moves forward: % is before %', to_at, cur USING ERRCODE = '22023';
    END IF;
    UPDATE compute_sim_clock SET at = to_at WHERE id;
    RETURN to_at;
END
$body$;

-- compute_use_system_clock(): compute_now() is the server's clock again.
CREATE FUNCTION compute_use_system_clock() RETURNS void
    LANGUAGE plpgsql
    AS $body$
BEGIN
    EXECUTE $f$CREATE OR REPLACE FUNCTION compute_now() RETURNS timestamptz
        LANGUAGE sql STABLE PARALLEL SAFE
        AS $b$ SELECT now() $b$$f$;
END
$body$;

-- compute_clock_skew(): the sim or custom clock's distance from the server clock,
-- for doctor. Zero in system mode.
CREATE FUNCTION compute_clock_skew() RETURNS interval
    LANGUAGE sql STABLE
    AS $body$ SELECT compute_now() - now() $body$;
