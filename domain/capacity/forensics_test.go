package capacity_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/domain/capacity"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

// forensics counts the torture test's violations and, at the first one,
// records what it takes to tell a bug of ours from one of PostgreSQL's, while
// the database is still as the violation left it: the disagreeing bookings
// with the xmin of their reservation and counter rows and each xid's
// pg_xact_status; every heap tuple of capacity_bookings that a committed
// transaction wrote and that no snapshot shows (pageinspect, with its
// infomask); the invariants re-run with index and bitmap scans off beside
// their normal plans; bt_index_check(…, heapallindexed) of every btree index
// of the capacity tables (amcheck); the open transactions. It records the
// disagreement again 3 and 10 seconds later, to show whether it lasts.
//
// The report goes to BETTER_COMPUTE_TORTURE_DIR (set by go tool task torture)
// as forensics-<database>.txt, and its first lines to the test log.
type forensics struct {
	db         *pgtest.DB
	dir        string
	violations atomic.Int64
	once       sync.Once
	again      []time.Duration // when to record the disagreement again, after the first
}

// newForensics prepares db for a report: the extensions it reads the heap and
// the indexes with, and an audit of every write of a reservation or a booking
// (torture_writes, filled by triggers, not by the code under test) with the
// top-level transaction that made it and the wall clock, so that the report
// can put the transactions that wrote a disagreeing reservation and its
// bookings in order.
func newForensics(t *testing.T, db *pgtest.DB) *forensics {
	// Superuser only (the embedded cluster's user is one): without them the
	// report says so and goes on.
	for _, ext := range []string{"pageinspect", "amcheck"} {
		if _, err := db.Exec(context.Background(), "CREATE EXTENSION IF NOT EXISTS "+ext); err != nil {
			t.Logf("forensics: no %s: %v", ext, err)
		}
	}
	db.MustExec(t, `CREATE TABLE torture_writes (tbl text, op text, row_id bigint, reservation_id bigint, state text, during tstzrange,
	                top_xid bigint DEFAULT txid_current(), at_sim timestamptz DEFAULT compute_now(), at_wall timestamptz DEFAULT clock_timestamp())`)
	db.MustExec(t, `CREATE FUNCTION torture_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO torture_writes (tbl, op, row_id, reservation_id, state, during)
    VALUES (TG_TABLE_NAME, TG_OP, NEW.id, coalesce((to_jsonb(NEW)->>'reservation_id')::bigint, NEW.id), NEW.state, NEW.during);
    RETURN NEW;
END $$`)
	for _, table := range []string{"capacity_reservations", "capacity_bookings"} {
		db.MustExec(t, `CREATE TRIGGER torture_write AFTER INSERT OR UPDATE ON `+table+` FOR EACH ROW EXECUTE FUNCTION torture_write()`)
	}
	return &forensics{db: db, dir: os.Getenv("BETTER_COMPUTE_TORTURE_DIR"), again: []time.Duration{3 * time.Second, 10 * time.Second}}
}

// violation fails the test and, the first time, records the report.
func (f *forensics) violation(t *testing.T, format string, args ...any) {
	t.Helper()
	t.Errorf(format, args...)
	f.violations.Add(1)
	f.once.Do(func() { f.record(t, fmt.Sprintf(format, args...)) })
}

// checkInvariants is the package's checkInvariants, counting violations.
func (f *forensics) checkInvariants(t *testing.T, when string) {
	t.Helper()
	for _, name := range sortedKeys(invariantQueries) {
		if n := f.db.MustCount(t, invariantQueries[name]); n != 0 {
			f.violation(t, "%s: %d %s", when, n, name)
		}
	}
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// xstatSQL is pg_temp.xstat(xid): the xid's pg_xact_status, its epoch taken
// from the current snapshot (right unless the xid counter wrapped since).
const xstatSQL = `CREATE FUNCTION pg_temp.xstat(x xid) RETURNS text LANGUAGE sql AS $$
SELECT CASE WHEN x::text::bigint < 3 THEN 'special' ELSE coalesce(pg_xact_status(
    (((pg_snapshot_xmax(pg_current_snapshot())::text::bigint >> 32) << 32) | x::text::bigint)::text::xid8), 'null') END
$$`

// disagreementSQL names, as CTEs every report query starts with, what
// disagrees: bad_reservations (their bookings disagree with them),
// overlapping (live bookings that overlap another of their device) and
// suspects (both kinds of booking, with their reservation and device).
const disagreementSQL = `
WITH bad_reservations AS (
    SELECT r.id FROM capacity_reservations r
     WHERE r.device_count <> (SELECT count(*) FROM capacity_bookings b WHERE b.reservation_id = r.id)
        OR EXISTS (SELECT 1 FROM capacity_bookings b WHERE b.reservation_id = r.id AND (b.state <> r.state OR b.during <> r.during))
), overlapping AS (
    SELECT a.id, a.reservation_id, a.device_id FROM capacity_bookings a JOIN capacity_bookings b
      ON a.device_id = b.device_id AND a.id <> b.id AND a.during && b.during
     WHERE a.state IN ('hold', 'confirmed') AND b.state IN ('hold', 'confirmed')
), suspects AS (
    SELECT o.id, o.reservation_id, o.device_id FROM overlapping o
    UNION
    SELECT b.id, b.reservation_id, b.device_id FROM capacity_bookings b JOIN bad_reservations x ON x.id = b.reservation_id
)`

// suspectsSQL lists the suspect bookings with the xmin and status of their
// rows and of the counter rows they charge.
const suspectsSQL = disagreementSQL + `
SELECT format('booking %s of reservation %s: device %s %s %s ctid=%s xmin=%s(%s) xmax=%s | reservation %s n=%s ctid=%s xmin=%s(%s) xmax=%s | quota used=%s xmin=%s(%s) | node %s holds=%s xmin=%s(%s) | stripe %s holds=%s xmin=%s(%s)',
       b.id, b.reservation_id, b.device_id, b.during, b.state, b.ctid, b.xmin, pg_temp.xstat(b.xmin), b.xmax,
       r.state, r.device_count, r.ctid, r.xmin, pg_temp.xstat(r.xmin), r.xmax,
       q.used, q.xmin, pg_temp.xstat(q.xmin),
       n.node_id, n.holds, n.xmin, pg_temp.xstat(n.xmin),
       s.stripe, s.holds, s.xmin, pg_temp.xstat(s.xmin))
  FROM capacity_bookings b JOIN suspects ids ON ids.id = b.id
  JOIN capacity_reservations r ON r.id = b.reservation_id
  LEFT JOIN capacity_quota_usage q ON q.tenant = b.tenant AND q.pool_id = b.pool_id
  LEFT JOIN capacity_node_resources n ON n.node_id = b.node_id
  LEFT JOIN capacity_pool_capacity_rollup s ON s.pool_id = b.pool_id AND s.stripe = capacity_stripe(b.node_id)
 ORDER BY b.device_id, b.id`

// badReservationsSQL lists the reservations whose bookings disagree with
// them, with the bookings a snapshot shows.
const badReservationsSQL = disagreementSQL + `
SELECT format('reservation %s %s n=%s tenant=%s ctid=%s xmin=%s(%s) xmax=%s created_at=%s: visible bookings %s',
       r.id, r.state, r.device_count, r.tenant, r.ctid, r.xmin, pg_temp.xstat(r.xmin), r.xmax, r.created_at,
       coalesce((SELECT string_agg(b.id || '/' || b.device_id || '/' || b.state || '/xmin=' || b.xmin, ' ')
                   FROM capacity_bookings b WHERE b.reservation_id = r.id), '-'))
  FROM capacity_reservations r JOIN bad_reservations x ON x.id = r.id
 ORDER BY r.id`

// writesSQL lists, from the audit, every write of a reservation that
// disagrees with its bookings or has a booking in an overlap, and of its
// bookings: which top-level transaction made it, when, and what it wrote.
const writesSQL = disagreementSQL + `
SELECT format('%s %s %s %s of reservation %s: %s %s by top-level xid %s(%s) at sim %s, wall %s',
       w.at_wall, w.tbl, w.op, w.row_id, w.reservation_id, w.state, w.during, w.top_xid,
       coalesce(pg_xact_status(w.top_xid::text::xid8), 'null'), w.at_sim, w.at_wall)
  FROM torture_writes w
 WHERE w.reservation_id IN (SELECT id FROM bad_reservations UNION SELECT reservation_id FROM overlapping)
 ORDER BY w.at_wall`

// gistVersusSeqSQL lists, for every device with a suspect booking, its live
// bookings as the exclusion constraint's gist index finds them (an index scan
// forced, as the constraint's check reads it: the query names the index's
// expressions and predicate, which no other query does, see capacity/0008) and
// as a sequential scan finds them: a booking only the second finds is missing
// from the index, or its item is marked dead.
const gistVersusSeqSQL = disagreementSQL + `
SELECT format('device %s: gist index [%s] | sequential scan [%s]', d.device_id, pg_temp.livegist(d.device_id), pg_temp.liveseq(d.device_id))
  FROM (SELECT DISTINCT device_id FROM suspects) d ORDER BY d.device_id`

// hiddenTuplesSQL lists the heap tuples of capacity_bookings that a committed
// transaction inserted, that nothing deleted (no xmax, or a lock only, or one
// that aborted), and that this snapshot does not show: rows that should be
// visible and are not.
const hiddenTuplesSQL = `
WITH pages AS (
    SELECT generate_series(0, (pg_relation_size('capacity_bookings') / current_setting('block_size')::int)::int - 1) AS blk
), items AS (
    SELECT p.blk, h.lp, h.t_xmin, h.t_xmax, h.t_ctid, h.t_infomask, h.t_infomask2, h.t_data
      FROM pages p, heap_page_items(get_raw_page('capacity_bookings', p.blk)) h
     WHERE h.lp_flags = 1
), flagged AS (
    SELECT i.*, f.raw_flags, f.combined_flags
      FROM items i, heap_tuple_infomask_flags(i.t_infomask, i.t_infomask2) f
)
SELECT format('hidden tuple (%s,%s) xmin=%s(%s) xmax=%s(%s) t_ctid=%s infomask=%s %s data=%s',
       f.blk, f.lp, f.t_xmin, pg_temp.xstat(f.t_xmin), f.t_xmax,
       CASE WHEN 'HEAP_XMAX_IS_MULTI' = ANY (f.raw_flags) THEN 'multi' ELSE pg_temp.xstat(f.t_xmax) END,
       f.t_ctid, f.raw_flags, f.combined_flags, encode(f.t_data, 'hex'))
  FROM flagged f
 WHERE pg_temp.xstat(f.t_xmin) = 'committed'
   AND (f.t_xmax = '0' OR 'HEAP_XMAX_LOCK_ONLY' = ANY (f.raw_flags) OR 'HEAP_XMAX_INVALID' = ANY (f.raw_flags)
        OR ('HEAP_XMAX_IS_MULTI' <> ALL (f.raw_flags) AND pg_temp.xstat(f.t_xmax) = 'aborted'))
   AND NOT EXISTS (SELECT 1 FROM capacity_bookings b WHERE b.ctid = format('(%s,%s)', f.blk, f.lp)::tid)
 ORDER BY f.blk, f.lp`

// record writes the report (the first violation's).
func (f *forensics) record(t *testing.T, why string) {
	ctx := context.Background()
	detected := time.Now()
	var b strings.Builder
	fmt.Fprintf(&b, "torture forensics for database %s\nfirst violation at %s: %s\n", f.db.Name, time.Now().Format(time.RFC3339Nano), why)
	conn, err := f.db.Acquire(ctx)
	if err != nil {
		t.Logf("forensics: %v", err)
		return
	}
	defer conn.Release()
	c := conn.Conn()
	lines := func(title, q string, args ...any) {
		fmt.Fprintf(&b, "\n## %s\n", title)
		rows, err := c.Query(ctx, q, args...)
		if err == nil {
			var ls []string
			if ls, err = pgx.CollectRows(rows, pgx.RowTo[string]); err == nil {
				if len(ls) == 0 {
					b.WriteString("(none)\n")
				}
				for _, l := range ls {
					b.WriteString(l + "\n")
				}
				return
			}
		}
		fmt.Fprintf(&b, "error: %v\n", err)
	}
	for _, q := range []string{xstatSQL, helperFunctionsSQL} {
		if _, err := c.Exec(ctx, q); err != nil {
			fmt.Fprintf(&b, "error creating the report's functions: %v\n", err)
		}
	}
	disagreement := func(when string) {
		lines(when+": server", `SELECT format('%s, snapshot %s, data_directory %s, WAL at %s (pg_waldump -p <data_directory>/pg_wal shows each record with its xid)',
		       version(), pg_current_snapshot(), current_setting('data_directory'), pg_current_wal_lsn())`)
		lines(when+": disagreeing bookings", suspectsSQL)
		lines(when+": reservations whose bookings disagree", badReservationsSQL)
		lines(when+": committed, undeleted booking tuples no snapshot shows (pageinspect)", hiddenTuplesSQL)
		lines(when+": invariants, normal plans and with index and bitmap scans off", invariantsBothWaysSQL())
		lines(when+": live bookings of each disagreeing device, through the exclusion constraint's gist index (forced) and by a sequential scan", gistVersusSeqSQL)
		lines(when+": every write of the disagreeing reservations and their bookings (torture_writes, by wall clock)", writesSQL)
	}
	disagreement("at detection")
	lines("btree indexes of the capacity tables (amcheck bt_index_check, heapallindexed)", `
SELECT format('%s: %s', c.relname, pg_temp.btcheck(c.oid))
  FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_class r ON r.oid = i.indrelid JOIN pg_am a ON a.oid = c.relam
 WHERE a.amname = 'btree' AND r.relname LIKE 'capacity\_%' ORDER BY c.relname`)
	lines("open transactions", `
SELECT format('pid %s xid=%s xmin=%s %s xact_start=%s wait=%s q=%s', pid, backend_xid, backend_xmin, state, xact_start,
              wait_event_type || ':' || wait_event, left(query, 200))
  FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_xid IS NOT NULL`)
	f.write(t, b.String())
	head := b.String()
	if len(head) > 4000 {
		head = head[:4000] + "…"
	}
	t.Logf("forensics:\n%s", head)
	for _, after := range f.again {
		time.Sleep(time.Until(detected.Add(after)))
		b.Reset()
		disagreement(fmt.Sprintf("%s later", after))
		f.write(t, b.String())
	}
}

// invariantsBothWaysSQL counts every invariant's violations with the planner's
// choice and again with index and bitmap scans off (a sequential scan of every
// table reads every tuple), in one statement per pair.
func invariantsBothWaysSQL() string {
	var parts []string
	for _, name := range sortedKeys(invariantQueries) {
		parts = append(parts, fmt.Sprintf(`SELECT format('%%s: %%s (sequential scans: %%s)', %s, (%s), pg_temp.seqcount(%s))`,
			quoteSQL(name), invariantQueries[name], quoteSQL(invariantQueries[name])))
	}
	return strings.Join(parts, "\nUNION ALL\n")
}

func quoteSQL(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// liveBookingsSQL lists bookings b, each as id@ctid state range; livegist and
// liveseq add the WHERE that reads them through the gist index or the heap.
const liveBookingsSQL = `SELECT coalesce(string_agg(b.id || '@' || b.ctid || ' ' || b.state || ' ' || b.during, ', ' ORDER BY b.id), '')
  FROM capacity_bookings b`

// helperFunctionsSQL are the report's session helpers: seqcount runs a count
// with index and bitmap scans off (SET LOCAL in the function's own scope),
// btcheck runs bt_index_check and returns its error as text.
const helperFunctionsSQL = `
CREATE FUNCTION pg_temp.seqcount(q text) RETURNS bigint LANGUAGE plpgsql
    SET enable_indexscan = off SET enable_bitmapscan = off SET enable_indexonlyscan = off AS $$
DECLARE n bigint;
BEGIN
    EXECUTE q INTO n;
    RETURN n;
END $$;
CREATE FUNCTION pg_temp.livegist(dev text) RETURNS text LANGUAGE sql
    SET enable_seqscan = off SET enable_bitmapscan = off AS $$
` + liveBookingsSQL + `
 WHERE (b.device_id || '') = dev AND (b.during * '(,)'::tstzrange) && '(,)'::tstzrange AND (b.state || '') IN ('hold', 'confirmed')
$$;
CREATE FUNCTION pg_temp.liveseq(dev text) RETURNS text LANGUAGE sql
    SET enable_indexscan = off SET enable_bitmapscan = off SET enable_indexonlyscan = off AS $$
` + liveBookingsSQL + ` WHERE b.device_id = dev AND b.during && tstzrange(NULL, NULL) AND b.state IN ('hold', 'confirmed')
$$;
CREATE FUNCTION pg_temp.btcheck(i oid) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    PERFORM bt_index_check(i::regclass, true);
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN 'FAILED: ' || SQLERRM;
END $$`

// write appends s to the report file, if there is a directory for it.
func (f *forensics) write(t *testing.T, s string) {
	if f.dir == "" {
		t.Logf("forensics:\n%s", s)
		return
	}
	path := filepath.Join(f.dir, "forensics-"+f.db.Name+".txt")
	file, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err == nil {
		_, err = file.WriteString(s)
		if cerr := file.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		t.Logf("forensics: %v", err)
		return
	}
	t.Logf("forensics: written to %s", path)
}

// TestForensicsReport breaks the invariants on purpose (two overlapping live
// bookings of one device, written with the exclusion constraint dropped, and a
// reservation that claims more devices than it has) and checks that the report
// names them, has every section, and ran every query without error.
func TestForensicsReport(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	makePool(t, db, poolSpec{ID: "p", Nodes: 1, PerNode: 2, Tenants: map[string]int{"a": 4}})
	fx := newForensics(t, db)
	from, to := hours(0, 2)
	var ids []int64
	for range 2 {
		r, err := reserve(t, db.Pool, capacity.ReserveParams{PoolID: "p", Tenant: "a", Devices: 1, Start: from, End: to, TTL: time.Hour})
		require.NoError(t, err)
		ids = append(ids, r.ID)
	}
	db.MustExec(t, `ALTER TABLE capacity_bookings DROP CONSTRAINT capacity_bookings_no_overlap`)
	db.MustExec(t, `UPDATE capacity_bookings SET device_id = 'p-n0-d00' WHERE reservation_id = $1`, ids[1])
	db.MustExec(t, `UPDATE capacity_reservations SET device_count = 2 WHERE id = $1`, ids[1])

	dir := t.TempDir()
	fx.dir, fx.again = dir, []time.Duration{10 * time.Millisecond}
	fx.record(t, "planted")
	report, err := os.ReadFile(filepath.Join(dir, "forensics-"+db.Name+".txt"))
	require.NoError(t, err)
	text := string(report)
	for _, want := range []string{
		"## at detection: disagreeing bookings",
		fmt.Sprintf("of reservation %d: device p-n0-d00", ids[1]), "(committed)",
		fmt.Sprintf("reservation %d hold n=2", ids[1]),
		"## at detection: committed, undeleted booking tuples no snapshot shows (pageinspect)",
		"overlapping live bookings of one device: 1 (sequential scans: 1)",
		"capacity_bookings_pkey: ok", "## 10ms later: disagreeing bookings",
		fmt.Sprintf("capacity_bookings INSERT 2 of reservation %d: hold", ids[1]),
		fmt.Sprintf("capacity_bookings UPDATE 2 of reservation %d: hold", ids[1]),
		"device p-n0-d00: gist index [1@(0,1) hold", "| sequential scan [1@(0,1) hold",
	} {
		require.Contains(t, text, want)
	}
	require.NotContains(t, text, "error")
}
