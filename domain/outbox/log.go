package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/jobs"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/tracing"
)

// Message is one event to append: a topic (what happened), a key (what it
// happened to) and a JSON payload.
type Message struct {
	// Topic names the kind of event, e.g. "inventory.stock_changed": 1 to 200
	// bytes. Readers filter on it.
	Topic string
	// Key names the object the event is about (optional, at most 512 bytes).
	Key string
	// Payload is marshalled with encoding/json; a json.RawMessage or []byte is
	// used as it is (it must be valid JSON).
	Payload any
}

// Event is an event read from the log.
type Event struct {
	// ID is the event's position: its TXID:SEQ text is the SSE id and the
	// idempotency key a receiver keeps to drop a repeated delivery.
	ID        Cursor
	Topic     string
	Key       string
	Payload   json.RawMessage
	CreatedAt time.Time // compute_now() of the appending transaction
	// Cause is the W3C traceparent of the span that appended the event
	// (tracing.Cause of AppendTx's context), "" when it had no sampled span: a
	// sink's delivery span is caused by it. The SSE stream does not show it.
	Cause string
	// Tenant is the tenant AppendTx's context named (workers.WithTenant), ""
	// for none.
	Tenant string
}

// maxTopicLen and MaxKeyLen bound a Message's topic and key.
const (
	maxTopicLen = 200
	MaxKeyLen   = 512
)

// payloadText is the payload's JSON text, checked: JSON (a raw payload is
// used as it is) that jsonb stores (fault.CheckJSON).
func (m Message) payloadText() (string, error) {
	b, raw := m.Payload.([]byte)
	if r, ok := m.Payload.(json.RawMessage); ok {
		b, raw = r, true
	}
	switch {
	case raw && len(b) == 0:
		return "null", nil
	case raw && !json.Valid(b):
		return "", fault.New(fault.InvalidArgument, "event %s: payload is not JSON", m.Topic)
	case !raw:
		var err error
		if b, err = json.Marshal(m.Payload); err != nil {
			return "", fault.Wrap(fault.InvalidArgument, err, "event %s: payload does not marshal", m.Topic)
		}
	}
	if err := fault.CheckJSON("event "+m.Topic+": payload", b); err != nil {
		return "", err
	}
	return string(b), nil
}

func (m Message) validate() error {
	switch {
	case m.Topic == "" || len(m.Topic) > maxTopicLen:
		return fault.New(fault.InvalidArgument, "event topic must be 1 to %d bytes, got %d", maxTopicLen, len(m.Topic))
	case len(m.Key) > MaxKeyLen:
		return fault.New(fault.InvalidArgument, "event %s: key must be at most %d bytes, got %d", m.Topic, MaxKeyLen, len(m.Key))
	}
	if err := fault.CheckText("event topic", m.Topic); err != nil {
		return err
	}
	return fault.CheckText("event "+m.Topic+": key", m.Key)
}

// appendOneSQL writes one event through compute_append_event (migration
// outbox/0003_append): the server keeps that procedure's INSERT planned, where
// an INSERT sent as an unnamed statement (the only kind the pool sends) is
// parsed, rewritten and planned again at every call. $3 is the payload's JSON
// text, which the procedure's jsonb parameter parses; $4 the caller's cause
// (a traceparent, or NULL; migration outbox/0004_cause); $5 the context's
// tenant, or NULL (migration outbox/0005_tenant).
const appendOneSQL = `CALL compute_append_event($1, $2, $3, $4, $5)`

// appendManySQL's tenant ($5) has been through jobs.ValidateTenant.
const appendManySQL = `INSERT INTO compute_events (topic, key, payload, cause, tenant)
SELECT t, k, p::jsonb, $4::text, $5::text FROM unnest($1::text[], $2::text[], $3::text[]) WITH ORDINALITY AS m(t, k, p, i) ORDER BY i`

// Append writes msgs to the event log in tx, the caller's transaction: if tx
// rolls back, so do the events; once it commits, every sink delivers them (at
// least once) and the SSE stream shows them. Events of one call get increasing
// seq numbers in the order given. It costs one round trip.
//
//	err := pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
//		if _, err := tx.Exec(ctx, `UPDATE items SET quantity = quantity + $2 WHERE id = $1`, id, delta); err != nil {
//			return err
//		}
//		return outbox.AppendTx(ctx, tx, outbox.Message{Topic: "item.changed", Key: id, Payload: change})
//	})
//
// The span of ctx, if sampled, is recorded as each event's cause (Event.Cause):
// the delivery of the event is a span caused by it. The tenant ctx names
// (workers.WithTenant), if any, is recorded as each event's Tenant, whatever
// the tenant's state: an event records a change that commits with it (holding
// a suspended tenant's back would reorder the log every sink reads in order;
// a deleted tenant's workflow compensation may announce what it undid).
//
// It returns INVALID_ARGUMENT for an empty or long topic, a long key, a topic
// or key that is not valid UTF-8 or holds a NUL byte, or a payload that is not
// JSON jsonb stores (a string holding a NUL byte, say), before any statement
// is sent: tx stays usable.
func AppendTx(ctx context.Context, tx pgx.Tx, msgs ...Message) error {
	switch len(msgs) {
	case 0:
		return nil
	case 1:
		m := msgs[0]
		if err := m.validate(); err != nil {
			return err
		}
		p, err := m.payloadText()
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, appendOneSQL, m.Topic, m.Key, p, tracing.CauseOrNil(ctx), tenantOrNil(ctx)); err != nil {
			return pg.Translate(fmt.Errorf("error appending event %s: %w", m.Topic, err))
		}
		return nil
	}
	topics := make([]string, len(msgs))
	keys := make([]string, len(msgs))
	payloads := make([]string, len(msgs))
	for i, m := range msgs {
		if err := m.validate(); err != nil {
			return err
		}
		p, err := m.payloadText()
		if err != nil {
			return err
		}
		topics[i], keys[i], payloads[i] = m.Topic, m.Key, p
	}
	tenant := tenantOrNil(ctx)
	if tenant != nil {
		if err := jobs.ValidateTenant(*tenant); err != nil {
			return err
		}
	}
	if _, err := tx.Exec(ctx, appendManySQL, topics, keys, payloads, tracing.CauseOrNil(ctx), tenant); err != nil {
		return pg.Translate(fmt.Errorf("error appending %d events: %w", len(msgs), err))
	}
	return nil
}

// ReadOptions bound a Read.
type ReadOptions struct {
	// After is the cursor to read after (the zero Cursor: from the start).
	After Cursor
	// Limit is the most rows to scan (default 1,000).
	Limit int
	// Topics keeps only events of these topics; empty keeps all. Rows of other
	// topics are still scanned and moved past.
	Topics []string
}

// readSQL is seed 000's read rule. The inner scan walks the (txid, seq) primary
// key from the cursor and stops at the limit or at the snapshot's xmin, so its
// cost is the batch, not the log. $1 txid, $2 seq, $3 limit, $4 topics.
const readSQL = readSelect + readFrom

// readStreamSQL is readSQL that also returns, on every row, the retention
// horizon in the read's own snapshot, for Tail.Next: an uncorrelated
// subquery (an init plan) that the server runs once, and only when the read
// returns a row, so an idle poll costs nothing more.
const readStreamSQL = readSelect + `,
       (SELECT p.through_txid::text || ':' || p.through_seq FROM compute_events_pruned p WHERE p.id) AS horizon` + readFrom

const readSelect = `
SELECT s.txid::text AS txid_text, s.seq, s.topic, s.key,
       CASE WHEN s.wanted THEN s.payload::text END AS payload_text, s.created_at, s.wanted, s.cause, s.tenant`

const readFrom = `
FROM (
    SELECT e.txid, e.seq, e.topic, e.key, e.payload, e.created_at, e.cause, e.tenant,
           (cardinality($4::text[]) = 0 OR e.topic = ANY($4::text[])) AS wanted
    FROM compute_events e
    WHERE e.txid < pg_snapshot_xmin(pg_current_snapshot())
      AND (e.txid, e.seq) > ($1::text::xid8, $2::bigint)
    ORDER BY e.txid, e.seq
    LIMIT $3
) s
ORDER BY s.txid, s.seq`

// tenantOrNil is the tenant ctx names (jobs.TenantOf), nil for none.
func tenantOrNil(ctx context.Context) *string {
	if t := jobs.TenantOf(ctx); t != "" {
		return &t
	}
	return nil
}

// Read reads the next events after o.After with seed 000's rule: only rows of
// transactions below the snapshot's xmin (all ended), after the cursor, in
// (txid, seq) order. Nothing can commit behind the returned cursor, so a reader
// that always reads after its last cursor never skips an event and never sees
// one out of order.
//
// It returns the events of o.Topics among the scanned rows, the cursor of the
// last scanned row (o.After when none: read again later), and the number of rows
// scanned; scanned == Limit means more may be ready now.
func Read(ctx context.Context, db pg.DBTX, o ReadOptions) (events []Event, next Cursor, scanned int, err error) {
	b, err := read(ctx, db, o, false)
	return b.events, b.next, b.scanned, err
}

// batch is what read returns: Read's results, the first scanned row, and with
// withHorizon the retention horizon in the read's own snapshot.
type batch struct {
	events  []Event
	next    Cursor // the last scanned row (o.After when none)
	scanned int
	// first is the first scanned row, horizon the horizon in the read's
	// snapshot; both are zero when the read scanned nothing. Events after
	// o.After were deleted before the read iff o.After.Less(horizon); first is
	// then the earliest event stored after the horizon (retention deletes a
	// prefix of the log).
	first, horizon Cursor
}

func read(ctx context.Context, db pg.DBTX, o ReadOptions, withHorizon bool) (batch, error) {
	if o.Limit <= 0 {
		o.Limit = 1000
	}
	topics := o.Topics
	if topics == nil {
		topics = []string{}
	}
	for _, t := range topics {
		if err := fault.CheckText("read events: topic", t); err != nil {
			return batch{next: o.After}, err
		}
	}
	sql := readSQL
	if withHorizon {
		sql = readStreamSQL
	}
	fail := func(err error) (batch, error) { return batch{next: o.After}, err }
	rows, err := db.Query(ctx, sql, o.After.txidText(), o.After.Seq, o.Limit, topics)
	if err != nil {
		return fail(pg.Translate(fmt.Errorf("error reading events: %w", err)))
	}
	defer rows.Close()
	b := batch{next: o.After}
	for rows.Next() {
		var (
			txid    string
			payload *string
			wanted  bool
			hz      *string
			cause   *string
			tenant  *string
			e       Event
		)
		dest := []any{&txid, &e.ID.Seq, &e.Topic, &e.Key, &payload, &e.CreatedAt, &wanted, &cause, &tenant}
		if withHorizon {
			dest = append(dest, &hz)
		}
		if err := rows.Scan(dest...); err != nil {
			return fail(pg.Translate(fmt.Errorf("error reading events: %w", err)))
		}
		c, err := scanCursor(txid, e.ID.Seq)
		if err != nil {
			return fail(err)
		}
		if b.scanned == 0 {
			b.first = c
			if withHorizon {
				if hz == nil {
					return fail(errNoHorizon)
				}
				if b.horizon, err = ParseCursor(*hz); err != nil {
					return fail(fmt.Errorf("error parsing the retention horizon %q: %w", *hz, err))
				}
			}
		}
		e.ID = c
		b.next = c
		b.scanned++
		if wanted {
			if payload != nil {
				e.Payload = json.RawMessage(*payload)
			}
			if cause != nil {
				e.Cause = *cause
			}
			if tenant != nil {
				e.Tenant = *tenant
			}
			b.events = append(b.events, e)
		}
	}
	if err := rows.Err(); err != nil {
		return fail(pg.Translate(fmt.Errorf("error reading events: %w", err)))
	}
	return b, nil
}

// resolve turns a position into a cursor: Start is the zero cursor, End the
// log's end now (see End), After(c) is c.
func resolve(ctx context.Context, db pg.DBTX, p Position) (Cursor, error) {
	switch p.kind {
	case posStart:
		return Cursor{}, nil
	case posCursor:
		return p.cursor, nil
	}
	var txid string
	var seq int64
	if err := db.QueryRow(ctx, endCursorSQL).Scan(&txid, &seq); err != nil {
		return Cursor{}, pg.Translate(fmt.Errorf("error reading the log's end: %w", err))
	}
	return scanCursor(txid, seq)
}

// PruneOptions bound one Prune.
type PruneOptions struct {
	// Keep is the replay window: no event younger than this is deleted, even when
	// every sink has passed it (SSE clients resume within it). Default 0.
	Keep time.Duration
	// Batch is the most rows one call scans and deletes (default 10,000).
	Batch int
}

// pruneLockSQL locks the horizon row, so that Prune and ResetSink take turns
// (see Prune), and reads the isolation level Prune's argument rests on.
const pruneLockSQL = `SELECT current_setting('transaction_isolation') FROM compute_events_pruned WHERE id FOR UPDATE`

// pruneSQL deletes, among the first $2 rows of the log in (txid, seq) order,
// the leading run of rows that every sink cursor has passed (with no sink:
// every ended transaction's rows) and that are older than the window $1
// (seconds), and moves the horizon to the last row it deleted. It stops at the
// first row that must stay, so what retention has deleted is always a prefix of
// the log: everything at or before the horizon is gone, everything after it is
// stored. Scanning only the head keeps a call bounded whatever the log holds;
// the head is where the oldest, passed rows are. The delete fetches the rows
// the head scan found by their ctid, in the same snapshot (a TID scan whatever
// the statistics say, where a join on the key could hash the whole log). It
// returns the number deleted, or no row when it deleted none.
const pruneSQL = `
WITH bound AS (
    SELECT b.t, b.s FROM (
        SELECT cursor_txid AS t, cursor_seq AS s FROM compute_sinks
        UNION ALL
        SELECT pg_snapshot_xmin(pg_current_snapshot()), 0
    ) b
    ORDER BY b.t, b.s
    LIMIT 1
), head AS (
    SELECT e.ctid AS row_id, e.txid, e.seq, e.created_at FROM compute_events e
    ORDER BY e.txid, e.seq
    LIMIT $2
), kept AS (
    SELECT h.txid, h.seq FROM head h, bound
    WHERE (h.txid, h.seq) > (bound.t, bound.s)
       OR h.created_at >= compute_now() - make_interval(secs => $1)
    ORDER BY h.txid, h.seq
    LIMIT 1
), doomed AS (
    SELECT h.row_id FROM head h
    WHERE NOT EXISTS (SELECT 1 FROM kept)
       OR (h.txid, h.seq) < (SELECT k.txid, k.seq FROM kept k)
), deleted AS (
    DELETE FROM compute_events e
    WHERE e.ctid = ANY (ARRAY(SELECT d.row_id FROM doomed d))
    RETURNING e.txid, e.seq
), last AS (
    SELECT d.txid, d.seq, (SELECT count(*) FROM deleted) AS n FROM deleted d
    ORDER BY d.txid DESC, d.seq DESC
    LIMIT 1
)
UPDATE compute_events_pruned p
SET through_txid = CASE WHEN (l.txid, l.seq) > (p.through_txid, p.through_seq) THEN l.txid ELSE p.through_txid END,
    through_seq  = CASE WHEN (l.txid, l.seq) > (p.through_txid, p.through_seq) THEN l.seq ELSE p.through_seq END,
    pruned = p.pruned + l.n, updated_at = compute_now()
FROM last l
WHERE p.id
RETURNING l.n`

// Prune deletes one bounded batch of events that every sink cursor has passed
// and that are older than o.Keep, records the retention horizon (the last event
// it deleted: see PrunedThrough) in the same transaction, and returns how many
// it deleted. A result of o.Batch means more may be deletable now.
//
// It runs in a transaction of its own, or in a savepoint when db is a pgx.Tx
// (the horizon row stays locked until that transaction ends), which must be
// read committed: it first locks the horizon row, and only then deletes, in a
// statement whose snapshot sees any sink reset that committed while it waited.
// A ResetSink to a cursor holds the same row, so a reset is either seen by the
// delete or sees its horizon and is refused; no accepted reset loses events. It
// returns INVALID_ARGUMENT inside a transaction of another isolation level.
func Prune(ctx context.Context, db pg.DBTX, o PruneOptions) (int, error) {
	if o.Batch <= 0 {
		o.Batch = 10000
	}
	if o.Keep < 0 {
		o.Keep = 0
	}
	var n int64
	err := pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		var iso string
		if err := tx.QueryRow(ctx, pruneLockSQL).Scan(&iso); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return errNoHorizon
			}
			return pg.Translate(fmt.Errorf("error locking the retention horizon: %w", err))
		}
		if iso != "read committed" {
			return fault.New(fault.InvalidArgument, "outbox.Prune needs a read committed transaction, not %s: its delete must see the sink resets that committed while it waited", iso)
		}
		err := tx.QueryRow(ctx, pruneSQL, o.Keep.Seconds(), o.Batch).Scan(&n)
		if errors.Is(err, pgx.ErrNoRows) {
			n = 0
			return nil
		}
		if err != nil {
			return pg.Translate(fmt.Errorf("error pruning events: %w", err))
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return int(n), nil
}

// errNoHorizon is the error for a database whose horizon row is missing.
var errNoHorizon = fault.New(fault.InvalidConfig, "the outbox retention horizon (compute_events_pruned) has no row: run better-compute migrate")

// Horizon is what retention has left of the event log.
type Horizon struct {
	// Through is the retention horizon: the last event retention has deleted
	// (the zero Cursor when it has deleted none). Every event at or before it is
	// gone; every committed event after it is still stored.
	Through Cursor
	// Earliest is the first event after Through that a reader can read now (the
	// zero Cursor when there is none yet).
	Earliest Cursor
	// Pruned counts the events retention has deleted.
	Pruned int64
}

// Lost reports whether a reader at cursor c has lost events to retention: some
// event after c was deleted, i.e. the horizon is after c in (txid, seq) order.
// A reader that resumes from Start has lost nothing by definition (Start means
// every retained event) and should not ask.
func (h Horizon) Lost(c Cursor) bool { return c.Less(h.Through) }

// PrunedThrough returns the retention horizon: the last event retention has
// deleted (the zero Cursor when none). Events after c were deleted, and a reader
// at c cannot read them, iff c.Less(horizon). One index probe of a one-row table.
func PrunedThrough(ctx context.Context, db pg.DBTX) (Cursor, error) {
	var (
		txid string
		seq  int64
	)
	err := db.QueryRow(ctx, `SELECT through_txid::text, through_seq FROM compute_events_pruned WHERE id`).Scan(&txid, &seq)
	if errors.Is(err, pgx.ErrNoRows) {
		return Cursor{}, errNoHorizon
	}
	if err != nil {
		return Cursor{}, pg.Translate(fmt.Errorf("error reading the retention horizon: %w", err))
	}
	return scanCursor(txid, seq)
}

// readHorizonSQL reads the horizon and, with the read rule, the first readable
// event after it: two index probes.
const readHorizonSQL = `
SELECT p.through_txid::text, p.through_seq, p.pruned, coalesce(e.txid::text, '0'), coalesce(e.seq, 0)
FROM compute_events_pruned p
LEFT JOIN LATERAL (
    SELECT e.txid, e.seq FROM compute_events e
    WHERE e.txid < pg_snapshot_xmin(pg_current_snapshot())
      AND (e.txid, e.seq) > (p.through_txid, p.through_seq)
    ORDER BY e.txid, e.seq
    LIMIT 1
) e ON true
WHERE p.id`

// ReadHorizon returns the retention horizon with the first event a reader can
// read after it and the count of pruned events (see Horizon).
func ReadHorizon(ctx context.Context, db pg.DBTX) (Horizon, error) {
	var (
		h          Horizon
		txid, etid string
		seq, eseq  int64
	)
	err := db.QueryRow(ctx, readHorizonSQL).Scan(&txid, &seq, &h.Pruned, &etid, &eseq)
	if errors.Is(err, pgx.ErrNoRows) {
		return Horizon{}, errNoHorizon
	}
	if err != nil {
		return Horizon{}, pg.Translate(fmt.Errorf("error reading the retention horizon: %w", err))
	}
	if h.Through, err = scanCursor(txid, seq); err != nil {
		return Horizon{}, err
	}
	if h.Earliest, err = scanCursor(etid, eseq); err != nil {
		return Horizon{}, err
	}
	return h, nil
}
