package outbox

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
)

var sinkNameRe = regexp.MustCompile(`^[a-z][a-z0-9_.-]{0,62}$`)

// ValidateSinkName checks a sink name: a lowercase letter, then up to 62
// lowercase letters, digits, '_', '.' or '-'. It returns INVALID_CONFIG.
func ValidateSinkName(name string) error {
	if !sinkNameRe.MatchString(name) {
		return fault.New(fault.InvalidConfig, "invalid sink name %q: want [a-z][a-z0-9_.-]{0,62}", name)
	}
	return nil
}

// checkName is INVALID_ARGUMENT for a sink name an operator gave that is not
// valid UTF-8 or holds a NUL byte: the statement would fail with it.
func checkName(name string) error { return fault.CheckText("sink name", name) }

// SinkLease is the name of sink name's lease in compute_leases.
func SinkLease(name string) string { return "sink/" + name }

// SinkState is a sink's stored state, as operators see it.
type SinkState struct {
	Name   string
	Cursor Cursor // the last event delivered
	Paused bool
	// Owner holds the sink's lease now ("" when nobody is delivering).
	Owner string
	// LagRows counts the events after the cursor (capped at LagCap); LagAge is
	// the age of the first of them (0 when none is visible yet).
	LagRows     int64
	LagAge      time.Duration
	Delivered   int64 // events delivered since the sink was created
	DeliveredAt *time.Time
	Failures    int // consecutive failed deliveries
	LastError   string
	LastErrorAt *time.Time
	JobID       *int64 // the live delivery job, if any
}

// LagCap caps the row count of a sink's lag, so listing stays cheap behind a
// huge backlog.
const LagCap = 1_000_000

// EnsureSink creates the state of sink name if it does not exist yet, with its
// cursor at from (Start or End). An existing sink keeps its cursor.
func EnsureSink(ctx context.Context, db pg.DBTX, name string, from Position) error {
	if err := ValidateSinkName(name); err != nil {
		return err
	}
	sql := `INSERT INTO compute_sinks (name) VALUES ($1) ON CONFLICT (name) DO NOTHING`
	if from.kind == posEnd {
		sql = `INSERT INTO compute_sinks (name, cursor_txid, cursor_seq)
VALUES ($1, pg_snapshot_xmin(pg_current_snapshot()), 0) ON CONFLICT (name) DO NOTHING`
	} else if from.kind == posCursor {
		_, err := db.Exec(ctx, `INSERT INTO compute_sinks (name, cursor_txid, cursor_seq)
VALUES ($1, $2::text::xid8, $3) ON CONFLICT (name) DO NOTHING`, name, from.cursor.txidText(), from.cursor.Seq)
		return pg.Translate(err)
	}
	_, err := db.Exec(ctx, sql, name)
	if err != nil {
		return pg.Translate(fmt.Errorf("error creating sink %s: %w", name, err))
	}
	return nil
}

const listSinksSQL = `
SELECT s.name, s.cursor_txid::text, s.cursor_seq, s.paused,
       coalesce(l.owner, '') AS owner,
       (SELECT count(*) FROM (SELECT 1 FROM compute_events e
            WHERE (e.txid, e.seq) > (s.cursor_txid, s.cursor_seq) LIMIT $2) x) AS lag_rows,
       coalesce(extract(epoch FROM compute_now() - (
            SELECT e.created_at FROM compute_events e
            WHERE e.txid < pg_snapshot_xmin(pg_current_snapshot())
              AND (e.txid, e.seq) > (s.cursor_txid, s.cursor_seq)
            ORDER BY e.txid, e.seq LIMIT 1)), 0)::float8 AS lag_age,
       s.delivered, s.delivered_at, s.failures, coalesce(s.last_error, ''), s.last_error_at, s.job_id
FROM compute_sinks s
LEFT JOIN compute_leases l ON l.name = 'sink/' || s.name AND l.expires_at > compute_now()
WHERE $1::text IS NULL OR s.name = $1
ORDER BY s.name`

// ListSinks returns every sink's state with its lag, by name.
func ListSinks(ctx context.Context, db pg.DBTX) ([]SinkState, error) {
	return listSinks(ctx, db, nil)
}

// GetSink returns one sink's state; NOT_FOUND when there is no such sink,
// INVALID_ARGUMENT for a name that is not valid UTF-8 or holds a NUL byte.
func GetSink(ctx context.Context, db pg.DBTX, name string) (SinkState, error) {
	if err := checkName(name); err != nil {
		return SinkState{}, err
	}
	ss, err := listSinks(ctx, db, &name)
	if err != nil {
		return SinkState{}, err
	}
	if len(ss) == 0 {
		return SinkState{}, notFound(ctx, db, name)
	}
	return ss[0], nil
}

func listSinks(ctx context.Context, db pg.DBTX, name *string) ([]SinkState, error) {
	rows, err := db.Query(ctx, listSinksSQL, name, LagCap)
	if err != nil {
		return nil, pg.Translate(fmt.Errorf("error listing sinks: %w", err))
	}
	defer rows.Close()
	var out []SinkState
	for rows.Next() {
		var (
			s    SinkState
			txid string
			age  float64
		)
		if err := rows.Scan(&s.Name, &txid, &s.Cursor.Seq, &s.Paused, &s.Owner, &s.LagRows, &age,
			&s.Delivered, &s.DeliveredAt, &s.Failures, &s.LastError, &s.LastErrorAt, &s.JobID); err != nil {
			return nil, pg.Translate(fmt.Errorf("error listing sinks: %w", err))
		}
		c, err := scanCursor(txid, s.Cursor.Seq)
		if err != nil {
			return nil, err
		}
		s.Cursor = c
		s.LagAge = time.Duration(age * float64(time.Second))
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, pg.Translate(fmt.Errorf("error listing sinks: %w", err))
	}
	return out, nil
}

// notFound is the NOT_FOUND error for an unknown sink, naming the known ones.
func notFound(ctx context.Context, db pg.DBTX, name string) error {
	var names []string
	rows, err := db.Query(ctx, `SELECT name FROM compute_sinks ORDER BY name LIMIT 21`)
	if err == nil {
		names, _ = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	known := "there are no sinks yet (a worker creates a registered sink's state when it starts)"
	if len(names) > 20 {
		known = "known sinks: " + strings.Join(names[:20], ", ") + ", …"
	} else if len(names) > 0 {
		known = "known sinks: " + strings.Join(names, ", ")
	}
	return fault.New(fault.NotFound, "unknown sink %q: %s", name, known)
}

// PauseSink pauses sink name: no new delivery starts until ResumeSink (a batch
// in flight still completes). It returns NOT_FOUND for an unknown sink, and
// INVALID_ARGUMENT for a name that is not valid UTF-8 or holds a NUL byte.
func PauseSink(ctx context.Context, db pg.DBTX, name string) error {
	return setPaused(ctx, db, name, true)
}

// ResumeSink resumes a paused sink; NOT_FOUND for an unknown sink (and
// INVALID_ARGUMENT for a bad name, as PauseSink).
func ResumeSink(ctx context.Context, db pg.DBTX, name string) error {
	return setPaused(ctx, db, name, false)
}

func setPaused(ctx context.Context, db pg.DBTX, name string, paused bool) error {
	if err := checkName(name); err != nil {
		return err
	}
	tag, err := db.Exec(ctx, `UPDATE compute_sinks SET paused = $2, updated_at = compute_now() WHERE name = $1`, name, paused)
	if err != nil {
		return pg.Translate(fmt.Errorf("error updating sink %s: %w", name, err))
	}
	if tag.RowsAffected() == 0 {
		return notFound(ctx, db, name)
	}
	return nil
}

// ResetSink moves sink name's cursor to p (Start, End or After(c)) and clears
// its failures, and returns the new cursor. A delivery in flight does not move
// the cursor back over it: its advance finds the cursor moved and is dropped.
//
// A reset to After(c) is refused when retention has deleted events after c
// (the horizon is after c: see PrunedThrough), since the sink could not deliver
// them; the error names the horizon and the earliest event still stored. It
// holds the horizon row (FOR SHARE) while it moves the cursor, so a concurrent
// Prune either deletes nothing after the new cursor or has moved the horizon
// first and the reset is refused. Start (every retained event) and End are
// never refused.
//
// It returns NOT_FOUND for an unknown sink and INVALID_ARGUMENT for a reset to
// a pruned position or a name that is not valid UTF-8 or holds a NUL byte.
func ResetSink(ctx context.Context, db pg.DBTX, name string, p Position) (Cursor, error) {
	if err := checkName(name); err != nil {
		return Cursor{}, err
	}
	var (
		txid string
		seq  int64
	)
	var err error
	switch p.kind {
	case posEnd:
		err = db.QueryRow(ctx, `UPDATE compute_sinks
SET cursor_txid = pg_snapshot_xmin(pg_current_snapshot()), cursor_seq = 0, reset_gen = reset_gen + 1,
    failures = 0, last_error = NULL, last_error_at = NULL, updated_at = compute_now()
WHERE name = $1 RETURNING cursor_txid::text, cursor_seq`, name).Scan(&txid, &seq)
	case posCursor:
		err = pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
			return resetSinkToCursor(ctx, tx, name, p.cursor, &txid, &seq)
		})
	default: // Start: the zero cursor, every retained event
		err = db.QueryRow(ctx, resetSinkSQL, name, "0", 0).Scan(&txid, &seq)
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return Cursor{}, notFound(ctx, db, name)
	}
	if f := (*fault.Error)(nil); errors.As(err, &f) {
		return Cursor{}, err // the refusal (or a translated error), as it is
	}
	if err != nil {
		return Cursor{}, pg.Translate(fmt.Errorf("error resetting sink %s: %w", name, err))
	}
	return scanCursor(txid, seq)
}

const resetSinkSQL = `UPDATE compute_sinks
SET cursor_txid = $2::text::xid8, cursor_seq = $3, reset_gen = reset_gen + 1,
    failures = 0, last_error = NULL, last_error_at = NULL, updated_at = compute_now()
WHERE name = $1 RETURNING cursor_txid::text, cursor_seq`

// resetSinkToCursor is ResetSink to After(c), in tx: it share-locks the horizon
// row (waiting for a Prune in progress, and then reading the horizon that Prune
// left), refuses a cursor behind it, and moves the cursor while holding the row,
// so that the next Prune's delete sees the new cursor.
func resetSinkToCursor(ctx context.Context, tx pgx.Tx, name string, c Cursor, txid *string, seq *int64) error {
	var (
		ht string
		hs int64
	)
	err := tx.QueryRow(ctx, `SELECT through_txid::text, through_seq FROM compute_events_pruned WHERE id FOR SHARE`).Scan(&ht, &hs)
	if errors.Is(err, pgx.ErrNoRows) {
		return errNoHorizon
	}
	if err != nil {
		return pg.Translate(fmt.Errorf("error locking the retention horizon: %w", err))
	}
	through, err := scanCursor(ht, hs)
	if err != nil {
		return err
	}
	if !c.Less(through) {
		return tx.QueryRow(ctx, resetSinkSQL, name, c.txidText(), c.Seq).Scan(txid, seq)
	}
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM compute_sinks WHERE name = $1)`, name).Scan(&exists); err != nil {
		return pg.Translate(fmt.Errorf("error resetting sink %s: %w", name, err))
	}
	if !exists {
		return pgx.ErrNoRows
	}
	h, err := ReadHorizon(ctx, tx)
	if err != nil {
		return err
	}
	earliest := "none is stored yet"
	if !h.Earliest.IsZero() {
		earliest = "the earliest available is " + h.Earliest.String()
	}
	return fault.New(fault.InvalidArgument,
		"sink %s cannot be reset to %s: retention has deleted the events after it through %s (%s); reset it to start (--to start) to deliver every retained event, or to %s (--to %s) to deliver what follows the deleted ones",
		name, c, h.Through, earliest, h.Through, h.Through)
}

// SinkPosition is where a sink's next delivery starts.
type SinkPosition struct {
	Cursor   Cursor
	Paused   bool
	ResetGen int64 // goes up at every ResetSink
}

// SinkCursor reads sink name's position; NOT_FOUND for an unknown sink,
// INVALID_ARGUMENT for a name that is not valid UTF-8 or holds a NUL byte.
func SinkCursor(ctx context.Context, db pg.DBTX, name string) (SinkPosition, error) {
	if err := checkName(name); err != nil {
		return SinkPosition{}, err
	}
	var (
		p    SinkPosition
		txid string
	)
	err := db.QueryRow(ctx, `SELECT cursor_txid::text, cursor_seq, paused, reset_gen FROM compute_sinks WHERE name = $1`, name).
		Scan(&txid, &p.Cursor.Seq, &p.Paused, &p.ResetGen)
	if errors.Is(err, pgx.ErrNoRows) {
		return SinkPosition{}, notFound(ctx, db, name)
	}
	if err != nil {
		return SinkPosition{}, pg.Translate(fmt.Errorf("error reading sink %s: %w", name, err))
	}
	p.Cursor, err = scanCursor(txid, p.Cursor.Seq)
	return p, err
}

// AdvanceSinkTx moves sink name's cursor from `from` (read by SinkCursor before
// the delivery) to `to` in tx, the delivery's fenced transaction, after its
// handler returned for n events. The move is guarded by the position itself: it
// returns false, changing nothing, when an operator reset the sink meanwhile.
func AdvanceSinkTx(ctx context.Context, tx pgx.Tx, name string, from SinkPosition, to Cursor, n int) (bool, error) {
	tag, err := tx.Exec(ctx, `UPDATE compute_sinks
SET cursor_txid = $5::text::xid8, cursor_seq = $6, delivered = delivered + $7,
    delivered_at = compute_now(), failures = 0, last_error = NULL, last_error_at = NULL,
    updated_at = compute_now()
WHERE name = $1 AND reset_gen = $2 AND cursor_txid = $3::text::xid8 AND cursor_seq = $4`,
		name, from.ResetGen, from.Cursor.txidText(), from.Cursor.Seq, to.txidText(), to.Seq, n)
	if err != nil {
		return false, pg.Translate(fmt.Errorf("error advancing sink %s: %w", name, err))
	}
	return tag.RowsAffected() == 1, nil
}

// RecordSinkFailure stores a failed delivery's error (its first MaxErrorLen
// characters) on sink name.
func RecordSinkFailure(ctx context.Context, db pg.DBTX, name string, msg string) error {
	_, err := db.Exec(ctx, `UPDATE compute_sinks
SET failures = failures + 1, last_error = $2, last_error_at = compute_now(), updated_at = compute_now()
WHERE name = $1`, name, TruncateError(msg))
	return pg.Translate(err)
}

// SetSinkJobTx records job as sink name's live delivery job, in tx.
func SetSinkJobTx(ctx context.Context, tx pgx.Tx, name string, job int64) error {
	_, err := tx.Exec(ctx, `UPDATE compute_sinks SET job_id = $2 WHERE name = $1`, name, job)
	return pg.Translate(err)
}

// ClaimSinkStartTx locks sink name's row in tx if its live job is still
// prevJob (nil: none recorded) and it is not paused, so that one of several
// processes starts its next delivery job. It returns false when another process
// got there first.
func ClaimSinkStartTx(ctx context.Context, tx pgx.Tx, name string, prevJob *int64) (bool, error) {
	tag, err := tx.Exec(ctx, `UPDATE compute_sinks SET updated_at = compute_now()
WHERE name = $1 AND job_id IS NOT DISTINCT FROM $2 AND NOT paused`, name, prevJob)
	if err != nil {
		return false, pg.Translate(err)
	}
	return tag.RowsAffected() == 1, nil
}

// Due is a sink that has events to deliver and no live delivery job.
type Due struct {
	Name  string
	JobID *int64 // the last job recorded, for ClaimSinkStartTx
}

// DueSinks returns, among names, the sinks that are not paused, have a visible
// event after their cursor, and have no live delivery job: the ones whose next
// delivery must be started. One statement, an index probe per sink.
func DueSinks(ctx context.Context, db pg.DBTX, names []string) ([]Due, error) {
	rows, err := db.Query(ctx, jobs.DueSinksSQL, names)
	if err != nil {
		return nil, pg.Translate(fmt.Errorf("error polling sinks: %w", err))
	}
	defer rows.Close()
	var out []Due
	for rows.Next() {
		var d Due
		if err := rows.Scan(&d.Name, &d.JobID); err != nil {
			return nil, pg.Translate(err)
		}
		out = append(out, d)
	}
	return out, pg.Translate(rows.Err())
}

// HandBackStale returns to the queue the running delivery jobs of sinks among
// names that started before startedBefore and whose sink lease nobody holds
// unexpired: their process died (or paused past its lease), and River would
// otherwise wait an hour to rescue them. A paused process that wakes up is
// fenced: its lease epoch and job attempt are no longer current. It returns the
// number of jobs handed back.
func HandBackStale(ctx context.Context, db pg.DBTX, names []string, kind string, startedBefore time.Time) (int, error) {
	n, err := jobs.HandBackStaleSinkJobs(ctx, db, names, kind, time.Now(), startedBefore)
	if err != nil {
		return 0, pg.Translate(fmt.Errorf("error handing back stale sink jobs: %w", err))
	}
	return int(n), nil
}
