-- compute_advance_sim_clock(by): move the sim clock forward by an interval in one
-- statement, under the sim clock row's lock, so concurrent advances add up instead
-- of racing (one computing from a time the other already moved past). A negative
-- interval raises 22023 (INVALID_ARGUMENT); without the sim clock on, 55000.
CREATE FUNCTION compute_advance_sim_clock(by_interval interval) RETURNS timestamptz
    LANGUAGE plpgsql
    AS $body$
DECLARE
    moved timestamptz;
BEGIN
    IF compute_clock_mode() <> 'sim' THEN
        RAISE EXCEPTION 'the sim clock is not on (mode %)', compute_clock_mode() USING ERRCODE = '55000';
    END IF;
    IF by_interval < interval '0' THEN
        RAISE EXCEPTION 'the sim clock only moves forward: cannot advance by %', by_interval USING ERRCODE = '22023';
    END IF;
    UPDATE compute_sim_clock SET at = at + by_interval WHERE id RETURNING at INTO moved;
    RETURN moved;
END
$body$;
