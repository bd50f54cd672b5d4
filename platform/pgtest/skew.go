package pgtest

import (
	"fmt"
	"net/url"
	"testing"
	"time"
)

// SkewedClock makes connections through the returned URL see a database whose
// clock is offset ahead of d's own (compute_now() plus offset) while its clock
// mode still reads as the system clock: what a host sees when its clock and the
// server's disagree. A schema of d placed first on the URL's search path
// defines them. set moves the offset; the test's other connections (d.Pool, d.URL)
// are unaffected.
func (d *DB) SkewedClock(tb testing.TB, offset time.Duration) (skewedURL string, set func(time.Duration)) {
	tb.Helper()
	d.MustExec(tb, `CREATE SCHEMA skew;
		CREATE TABLE skew.offset_by (d interval NOT NULL);
		INSERT INTO skew.offset_by VALUES (interval '0');
		CREATE FUNCTION skew.compute_now() RETURNS timestamptz LANGUAGE sql STABLE
			AS $$ SELECT public.compute_now() + (SELECT d FROM skew.offset_by) $$;
		CREATE FUNCTION skew.compute_clock_mode() RETURNS text LANGUAGE sql STABLE AS $$ SELECT 'system' $$`)
	set = func(offset time.Duration) {
		d.MustExec(tb, `UPDATE skew.offset_by SET d = make_interval(secs => $1)`, offset.Seconds())
	}
	set(offset)
	u, err := url.Parse(d.URL)
	if err != nil {
		tb.Fatalf("pgtest: %v", fmt.Errorf("the database's URL: %w", err))
	}
	q := u.Query()
	q.Set("search_path", "skew,public")
	u.RawQuery = q.Encode()
	return u.String(), set
}
