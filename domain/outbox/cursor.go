package outbox

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/bettercompute/bettercompute/platform/fault"
)

// Cursor is a position in the event log: the (txid, seq) of the last event
// read. Events are read in (txid, seq) order, so everything at or before a cursor
// has been read. The zero Cursor is before every event.
//
// Its text form, TXID:SEQ in decimal, is an event's ID: the SSE id field, the
// Last-Event-ID a client resumes from, and the idempotency key a receiver can
// use to drop a repeated event.
type Cursor struct {
	Txid uint64 // the appending transaction's id (xid8)
	Seq  int64  // the row's sequence number
}

// String returns the cursor as TXID:SEQ.
func (c Cursor) String() string {
	return strconv.FormatUint(c.Txid, 10) + ":" + strconv.FormatInt(c.Seq, 10)
}

// Less reports whether c comes before d in (txid, seq) order.
func (c Cursor) Less(d Cursor) bool {
	return c.Txid < d.Txid || c.Txid == d.Txid && c.Seq < d.Seq
}

// IsZero reports whether c is the start of the log.
func (c Cursor) IsZero() bool { return c == Cursor{} }

// txidText is the cursor's txid as text, for a $n::text::xid8 parameter: pgx
// has no xid8 codec, and the server parses the text.
func (c Cursor) txidText() string { return strconv.FormatUint(c.Txid, 10) }

// ParseCursor parses TXID:SEQ. It returns INVALID_ARGUMENT for anything else.
func ParseCursor(s string) (Cursor, error) {
	t, q, ok := strings.Cut(strings.TrimSpace(s), ":")
	if !ok {
		return Cursor{}, fault.New(fault.InvalidArgument, "cursor %q: want TXID:SEQ", s)
	}
	txid, err1 := strconv.ParseUint(t, 10, 64)
	seq, err2 := strconv.ParseInt(q, 10, 64)
	if err1 != nil || err2 != nil || seq < 0 {
		return Cursor{}, fault.New(fault.InvalidArgument, "cursor %q: want TXID:SEQ, two non-negative integers", s)
	}
	return Cursor{Txid: txid, Seq: seq}, nil
}

func scanCursor(txid string, seq int64) (Cursor, error) {
	t, err := strconv.ParseUint(txid, 10, 64)
	if err != nil {
		return Cursor{}, fmt.Errorf("error parsing txid %q: %w", txid, err)
	}
	return Cursor{Txid: t, Seq: seq}, nil
}

// Position says where a reader starts: the start of the retained log, its end
// (only events committed from now on), or just after a given cursor.
type Position struct {
	kind   positionKind
	cursor Cursor
}

type positionKind int

const (
	posStart positionKind = iota
	posEnd
	posCursor
)

// Start is the start of the log: every retained event.
var Start = Position{kind: posStart}

// End is the end of the log: only events that become visible from now on.
var End = Position{kind: posEnd}

// After is the position just after c.
func After(c Cursor) Position { return Position{kind: posCursor, cursor: c} }

// String returns start, end or TXID:SEQ.
func (p Position) String() string {
	switch p.kind {
	case posEnd:
		return "end"
	case posCursor:
		return p.cursor.String()
	default:
		return "start"
	}
}

// ParsePosition parses start, end or TXID:SEQ; it returns INVALID_ARGUMENT for
// anything else.
func ParsePosition(s string) (Position, error) {
	switch strings.TrimSpace(s) {
	case "start", "":
		return Start, nil
	case "end":
		return End, nil
	}
	c, err := ParseCursor(s)
	if err != nil {
		return Position{}, fault.New(fault.InvalidArgument, "position %q: want start, end or TXID:SEQ", s)
	}
	return After(c), nil
}

// endCursorSQL is the cursor of the log's end: every transaction below the
// snapshot's xmin has ended and is skipped, and every row of xmin or later
// (seq > 0) is still ahead.
const endCursorSQL = `SELECT pg_snapshot_xmin(pg_current_snapshot())::text, 0::bigint`
