package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
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
}

// MaxTopicLen and MaxKeyLen bound a Message's topic and key.
const (
	MaxTopicLen = 200
	MaxKeyLen   = 512
)

func (m Message) payloadText() (string, error) {
	switch p := m.Payload.(type) {
	case json.RawMessage:
		if len(p) == 0 {
			return "null", nil
		}
		return string(p), nil
	case []byte:
		if len(p) == 0 {
			return "null", nil
		}
		return string(p), nil
	}
	b, err := json.Marshal(m.Payload)
	if err != nil {
		return "", fault.Wrap(fault.InvalidArgument, err, "event %s: payload does not marshal", m.Topic)
	}
	return string(b), nil
}

func (m Message) validate() error {
	switch {
	case m.Topic == "" || len(m.Topic) > MaxTopicLen:
		return fault.New(fault.InvalidArgument, "event topic must be 1 to %d bytes, got %d", MaxTopicLen, len(m.Topic))
	case len(m.Key) > MaxKeyLen:
		return fault.New(fault.InvalidArgument, "event %s: key must be at most %d bytes, got %d", m.Topic, MaxKeyLen, len(m.Key))
	}
	return nil
}

const appendOneSQL = `INSERT INTO compute_events (topic, key, payload) VALUES ($1, $2, $3::text::jsonb)`

const appendManySQL = `INSERT INTO compute_events (topic, key, payload)
SELECT t, k, p::jsonb FROM unnest($1::text[], $2::text[], $3::text[]) WITH ORDINALITY AS m(t, k, p, i) ORDER BY i`

// Append writes msgs to the event log in tx, the caller's transaction: if tx
// rolls back, so do the events; once it commits, every sink delivers them (at
// least once) and the SSE stream shows them. Events of one call get increasing
// seq numbers in the order given. It costs one round trip.
//
//	err := pg.InTx(ctx, db, nil, func(tx pgx.Tx) error {
//		if _, err := tx.Exec(ctx, `UPDATE items SET quantity = quantity + $2 WHERE id = $1`, id, delta); err != nil {
//			return err
//		}
//		return outbox.Append(ctx, tx, outbox.Message{Topic: "item.changed", Key: id, Payload: change})
//	})
//
// It returns INVALID_ARGUMENT for an empty or long topic, a long key, or a
// payload that is not JSON.
func Append(ctx context.Context, tx pgx.Tx, msgs ...Message) error {
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
		if _, err := tx.Exec(ctx, appendOneSQL, m.Topic, m.Key, p); err != nil {
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
	if _, err := tx.Exec(ctx, appendManySQL, topics, keys, payloads); err != nil {
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
const readSQL = `
SELECT s.txid::text AS txid_text, s.seq, s.topic, s.key,
       CASE WHEN s.wanted THEN s.payload::text END AS payload_text, s.created_at, s.wanted
FROM (
    SELECT e.txid, e.seq, e.topic, e.key, e.payload, e.created_at,
           (cardinality($4::text[]) = 0 OR e.topic = ANY($4::text[])) AS wanted
    FROM compute_events e
    WHERE e.txid < pg_snapshot_xmin(pg_current_snapshot())
      AND (e.txid, e.seq) > ($1::text::xid8, $2::bigint)
    ORDER BY e.txid, e.seq
    LIMIT $3
) s
ORDER BY s.txid, s.seq`

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
	if o.Limit <= 0 {
		o.Limit = 1000
	}
	topics := o.Topics
	if topics == nil {
		topics = []string{}
	}
	rows, err := db.Query(ctx, readSQL, o.After.txidText(), o.After.Seq, o.Limit, topics)
	if err != nil {
		return nil, o.After, 0, pg.Translate(fmt.Errorf("error reading events: %w", err))
	}
	defer rows.Close()
	next = o.After
	for rows.Next() {
		var (
			txid    string
			payload *string
			wanted  bool
			e       Event
		)
		if err := rows.Scan(&txid, &e.ID.Seq, &e.Topic, &e.Key, &payload, &e.CreatedAt, &wanted); err != nil {
			return nil, o.After, 0, pg.Translate(fmt.Errorf("error reading events: %w", err))
		}
		c, err := scanCursor(txid, e.ID.Seq)
		if err != nil {
			return nil, o.After, 0, err
		}
		e.ID = c
		next = c
		scanned++
		if wanted {
			if payload != nil {
				e.Payload = json.RawMessage(*payload)
			}
			events = append(events, e)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, o.After, 0, pg.Translate(fmt.Errorf("error reading events: %w", err))
	}
	return events, next, scanned, nil
}

// Resolve turns a position into a cursor: Start is the zero cursor, End the
// log's end now (see End), After(c) is c.
func Resolve(ctx context.Context, db pg.DBTX, p Position) (Cursor, error) {
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

// pruneSQL deletes, among the first $2 rows of the log in (txid, seq) order,
// those that every sink cursor has passed (with no sink: every ended
// transaction's rows) and that are older than the window $1 (seconds). Scanning
// only the head keeps a call bounded whatever the log holds; the head is where
// the oldest, passed rows are.
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
    SELECT e.txid, e.seq, e.created_at FROM compute_events e
    ORDER BY e.txid, e.seq
    LIMIT $2
), doomed AS (
    SELECT h.txid, h.seq FROM head h, bound
    WHERE (h.txid, h.seq) <= (bound.t, bound.s)
      AND h.created_at < compute_now() - make_interval(secs => $1)
)
DELETE FROM compute_events e USING doomed d
WHERE e.txid = d.txid AND e.seq = d.seq`

// Prune deletes one bounded batch of events that every sink cursor has passed
// and that are older than o.Keep, and returns how many it deleted. A result of
// o.Batch means more may be deletable now.
func Prune(ctx context.Context, db pg.DBTX, o PruneOptions) (int, error) {
	if o.Batch <= 0 {
		o.Batch = 10000
	}
	if o.Keep < 0 {
		o.Keep = 0
	}
	tag, err := db.Exec(ctx, pruneSQL, o.Keep.Seconds(), o.Batch)
	if err != nil {
		return 0, pg.Translate(fmt.Errorf("error pruning events: %w", err))
	}
	return int(tag.RowsAffected()), nil
}
