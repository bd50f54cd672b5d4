package outbox

import (
	"context"
	"strconv"
	"time"

	"github.com/bettercompute/bettercompute/platform/pg"
)

// WriteXact is a write transaction open on the server (it has a transaction
// id), as pg_stat_activity or pg_prepared_xacts show it to this role. Every
// outbox reader reads only events below a fresh snapshot's xmin, so the oldest
// of them, in any database of the server, holds every reader back.
type WriteXact struct {
	Database, User, App, State string
	PID                        int
	GID                        string     // a prepared transaction's name; "" for a session
	Start                      *time.Time // nil when this role may not see it
	XID                        uint32
}

// writeXactsSQL lists the server's write transactions, in every database: the
// sessions' (pg_stat_activity hides another role's start time and state from a
// role without pg_read_all_stats) and the prepared ones.
const writeXactsSQL = `
SELECT coalesce(datname::text, ''), pid, coalesce(usename::text, ''), coalesce(application_name, ''),
       coalesce(state, ''), '' AS gid, xact_start, backend_xid::text
FROM pg_stat_activity WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid()
UNION ALL
SELECT database::text, 0, owner::text, '', 'prepared', gid, prepared, transaction::text
FROM pg_prepared_xacts`

// ListWriteXacts lists the server's open write transactions (doctor's
// 'snapshot' check and the outbox metrics read it).
func ListWriteXacts(ctx context.Context, db pg.DBTX) ([]WriteXact, error) {
	rows, err := db.Query(ctx, writeXactsSQL)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var open []WriteXact
	for rows.Next() {
		var x WriteXact
		var xid string
		if err := rows.Scan(&x.Database, &x.PID, &x.User, &x.App, &x.State, &x.GID, &x.Start, &xid); err != nil {
			return nil, err
		}
		n, _ := strconv.ParseUint(xid, 10, 32)
		x.XID = uint32(n)
		open = append(open, x)
	}
	return open, rows.Err()
}

// serverClock reads the server's wall clock, which pg_stat_activity's
// transaction starts are on (not compute_now()'s).
func serverClock(ctx context.Context, db pg.DBTX) (time.Time, error) {
	var now time.Time
	err := db.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&now) // bare clock: transaction starts are on the server's wall clock
	return now, err
}

// OldestWriteXact is the age, by the server's clock, of the oldest write
// transaction open on the server whose start this role may see (0 when none),
// and how many write transactions are open.
func OldestWriteXact(ctx context.Context, db pg.DBTX) (time.Duration, int, error) {
	open, err := ListWriteXacts(ctx, db)
	if err != nil {
		return 0, 0, err
	}
	now, err := serverClock(ctx, db)
	if err != nil {
		return 0, 0, err
	}
	var oldest time.Duration
	for _, x := range open {
		if x.Start != nil {
			oldest = max(oldest, now.Sub(*x.Start))
		}
	}
	return oldest, len(open), nil
}

// SnapshotXminSQL is the xmin of a fresh snapshot: every outbox reader reads
// only events below it.
const SnapshotXminSQL = `SELECT pg_snapshot_xmin(pg_current_snapshot())::text`

// heldBackSQL counts the committed events of this database that readers may not
// read yet, at one snapshot's xmin.
const heldBackSQL = `
SELECT x::text, (SELECT count(*) FROM compute_events WHERE txid >= x)
FROM (SELECT pg_snapshot_xmin(pg_current_snapshot()) AS x) s`

// HeldBack reads a fresh snapshot's xmin and counts the committed events of
// this database at or above it: events no reader may read until the
// transaction at xmin ends.
func HeldBack(ctx context.Context, db pg.DBTX) (xmin uint64, events int, err error) {
	var text string
	if err := db.QueryRow(ctx, heldBackSQL).Scan(&text, &events); err != nil {
		return 0, 0, pg.Translate(err)
	}
	xmin, _ = strconv.ParseUint(text, 10, 64)
	return xmin, events, nil
}
