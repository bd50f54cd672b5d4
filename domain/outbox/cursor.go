package outbox

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
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

// TailOptions configure a Tail.
type TailOptions struct {
	// Topics keeps only events of these topics; empty keeps all. Rows of other
	// topics are still scanned and moved past (see ReadOptions).
	Topics []string
	// Limit is the most rows one Next scans (default 1,000).
	Limit int
}

// Gap is a run of events that retention deleted before a Tail read them: every
// event after After up to Through is gone.
type Gap struct {
	// After is where the reader was: the cursor it resumed from, or the one it
	// had reached when retention passed it.
	After Cursor
	// Through is the retention horizon, the last deleted event (see
	// PrunedThrough). The Tail goes on after it.
	Through Cursor
	// Earliest is the first event stored after Through (the zero Cursor when
	// none is readable yet).
	Earliest Cursor
}

// Tail follows the event log for a long-lived reader, such as the SSE stream:
// it reads the events after its cursor with Read's rule, and reports a Gap when
// retention has deleted events it had not read, before anything that follows
// the gap.
//
//	tail, gap, err := outbox.OpenTail(ctx, db, outbox.After(last), outbox.TailOptions{Topics: topics})
//	if err != nil {
//		return err
//	}
//	if gap != nil {
//		// events after last were deleted: rebuild, then go on after gap.Through
//	}
//	for {
//		b, err := tail.Next(ctx, db)
//		… // b.Gap first, if any, then b.Events; poll again later when b.Scanned < Limit
//	}
//
// A Tail opened at Start reads "every retained event": until a read returns a
// row it follows the horizon silently, and it never reports a gap at its start.
// A Tail is not safe for concurrent use.
type Tail struct {
	cursor Cursor
	// floating is true for a Tail opened at Start until a read returns a row.
	floating bool
	topics   []string
	limit    int
}

// OpenTail returns a Tail at p. Start opens at the retention horizon (nothing
// at or before it is stored), End at the log's end now (see Resolve), and
// After(c) at c, unless retention has deleted events after c (see
// Horizon.Lost): the Tail then opens at the horizon, and OpenTail returns the
// Gap to report before anything else (nil otherwise).
//
// Each position costs one statement, so db may be a pool or a transaction.
func OpenTail(ctx context.Context, db pg.DBTX, p Position, o TailOptions) (*Tail, *Gap, error) {
	if o.Limit <= 0 {
		o.Limit = 1000
	}
	t := &Tail{topics: append([]string(nil), o.Topics...), limit: o.Limit}
	switch p.kind {
	case posStart:
		// Every retained event: nothing at or before the horizon is stored.
		c, err := PrunedThrough(ctx, db)
		if err != nil {
			return nil, nil, err
		}
		t.cursor, t.floating = c, true
		return t, nil, nil
	case posCursor:
		hz, err := ReadHorizon(ctx, db)
		if err != nil {
			return nil, nil, err
		}
		t.cursor = p.cursor
		if !hz.Lost(p.cursor) {
			return t, nil, nil
		}
		t.cursor = hz.Through
		return t, &Gap{After: p.cursor, Through: hz.Through, Earliest: hz.Earliest}, nil
	}
	c, err := resolve(ctx, db, p)
	if err != nil {
		return nil, nil, err
	}
	t.cursor = c
	return t, nil, nil
}

// Cursor returns the Tail's position: the last row it scanned (of any topic),
// the horizon it moved to, or where it opened. A reader that resumes after it
// reads every later event of its topics, and no earlier row again.
func (t *Tail) Cursor() Cursor { return t.cursor }

// TailBatch is what one Tail.Next read.
type TailBatch struct {
	// Gap, when not nil, comes before Events: retention deleted the events
	// after the Tail's cursor up to Gap.Through before this read.
	Gap *Gap
	// Events are the events of the Tail's topics after its cursor (after
	// Gap.Through when there is a gap), in (txid, seq) order.
	Events []Event
	// Scanned counts the rows read, of any topic: Scanned == Limit means more
	// may be ready now.
	Scanned int
}

// Next reads the next batch after the Tail's cursor and moves the cursor past
// every row it scanned. The read also reads the horizon in its own snapshot
// (one lookup of a one-row table, made only when it returns a row), so a Tail
// that fell behind retention while it read gets the Gap with the first rows
// after it. On error the cursor stays where it was.
func (t *Tail) Next(ctx context.Context, db pg.DBTX) (TailBatch, error) {
	b, err := read(ctx, db, ReadOptions{After: t.cursor, Limit: t.limit, Topics: t.topics}, true)
	if err != nil {
		return TailBatch{}, err
	}
	out := TailBatch{Events: b.events, Scanned: b.scanned}
	if b.scanned > 0 && t.cursor.Less(b.horizon) && !t.floating {
		out.Gap = &Gap{After: t.cursor, Through: b.horizon, Earliest: b.first}
		out.Events = nil
		for _, e := range b.events {
			if b.horizon.Less(e.ID) {
				out.Events = append(out.Events, e)
			}
		}
	}
	if b.scanned > 0 {
		t.floating = false
	}
	t.cursor = b.next
	return out, nil
}

// CheckHorizon reads the retention horizon, for a Tail that has not read for a
// while (an idle reader between polls): it returns the Gap when retention has
// deleted events after the Tail's cursor, and moves the cursor to the horizon.
// A Tail opened at Start that has read no row yet moves there without a Gap.
// One index probe when retention has not passed the cursor, two when it has.
func (t *Tail) CheckHorizon(ctx context.Context, db pg.DBTX) (*Gap, error) {
	through, err := PrunedThrough(ctx, db)
	if err != nil {
		return nil, err
	}
	switch {
	case !t.cursor.Less(through):
		return nil, nil
	case t.floating:
		t.cursor = through
		return nil, nil
	}
	hz, err := ReadHorizon(ctx, db)
	if err != nil {
		return nil, err
	}
	gap := &Gap{After: t.cursor, Through: hz.Through, Earliest: hz.Earliest}
	t.cursor = hz.Through
	return gap, nil
}

// endCursorSQL is the cursor of the log's end: every transaction below the
// snapshot's xmin has ended and is skipped, and every row of xmin or later
// (seq > 0) is still ahead.
const endCursorSQL = `SELECT pg_snapshot_xmin(pg_current_snapshot())::text, 0::bigint`
