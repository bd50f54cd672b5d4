package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
)

// Table describes an application-owned outbox table for the dispatcher (seed
// 003, "Deliver an outbox"). The table has the columns
//
//	id              any type, unique: the receiver's idempotency key
//	attempts        integer NOT NULL DEFAULT 0
//	next_attempt_at timestamptz NOT NULL DEFAULT compute_now()
//	claimed_until   timestamptz
//	last_error      text
//
// plus an ordering column (the key whose rows are published in order), a
// sequence column (unique, e.g. an identity primary key, ordering the rows) and
// the effect's own data. The dispatcher maintains the five columns above; a
// writer leaves them at their defaults. Two indexes keep a claim proportional to
// its batch, not the backlog: one on the sequence column and the partial index
//
//	CREATE INDEX … ON tbl (key) WHERE claimed_until IS NOT NULL OR attempts > 0;
//
// with Where's columns first in both.
type Table struct {
	// Table is the table, optionally schema-qualified: lowercase SQL identifiers.
	Table string
	// OrderBy is the ordering (key) column.
	OrderBy string
	// Sequence is the sequence column; its values must fit a bigint.
	Sequence string
	// Where restricts the dispatcher to rows whose columns equal these values
	// (for example one tenant or shard). Optional. One claim of a table and
	// Where runs at a time across replicas.
	Where map[string]any
	// BatchSize is the most rows one claim takes (default 100).
	BatchSize int
	// ClaimTimeout bounds a claim: its rows are reclaimable after it, a claim
	// transaction stalled this long gives up its turn, and a batch that outlives
	// it starts no further publish (default 30 s).
	ClaimTimeout time.Duration
}

// Defaults of Table.
const (
	defaultBatchSize    = 100
	DefaultClaimTimeout = 30 * time.Second
	// MaxErrorLen is how many characters of a failed publish's error are kept in
	// last_error.
	MaxErrorLen = 1000
	// MaxBackoff is the longest wait before a failed row is retried.
	MaxBackoff = 256 * time.Second
)

var (
	identRe      = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)
	tableIdentRe = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}(\.[a-z_][a-z0-9_]{0,62})?$`)
)

// Validate checks every name before any query: the table and each column must
// be lowercase SQL identifiers (the table may name its schema). It returns
// INVALID_CONFIG "invalid outbox table …" or "invalid outbox … column …".
func (t Table) Validate() error {
	if !tableIdentRe.MatchString(t.Table) {
		return fault.New(fault.InvalidConfig, "invalid outbox table %q: want a lowercase SQL identifier, optionally schema-qualified (schema.table)", t.Table)
	}
	if !identRe.MatchString(t.OrderBy) {
		return fault.New(fault.InvalidConfig, "invalid outbox orderBy column %q: want a lowercase SQL identifier", t.OrderBy)
	}
	if !identRe.MatchString(t.Sequence) {
		return fault.New(fault.InvalidConfig, "invalid outbox sequence column %q: want a lowercase SQL identifier", t.Sequence)
	}
	for c := range t.Where {
		if !identRe.MatchString(c) {
			return fault.New(fault.InvalidConfig, "invalid outbox where column %q: want a lowercase SQL identifier", c)
		}
	}
	if t.BatchSize < 0 {
		return fault.New(fault.InvalidConfig, "outbox table %s: batch size %d is negative", t.Table, t.BatchSize)
	}
	if t.ClaimTimeout < 0 || t.ClaimTimeout > 0 && t.ClaimTimeout < 100*time.Millisecond {
		return fault.New(fault.InvalidConfig, "outbox table %s: claim timeout %s is too short (at least 100ms)", t.Table, t.ClaimTimeout)
	}
	return nil
}

// Compiled is a validated Table with its statements built once.
type Compiled struct {
	t         Table
	lockKey   int64
	whereVals []any // $1..$k, in the sorted order of Where's columns
	claimSQL  string
	deleteSQL string
	failSQL   string
	freeSQL   string
	statsSQL  string
}

// Compile validates t (see Validate) and builds its statements. It sends no
// query.
func Compile(t Table) (*Compiled, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	if t.BatchSize == 0 {
		t.BatchSize = defaultBatchSize
	}
	if t.ClaimTimeout == 0 {
		t.ClaimTimeout = DefaultClaimTimeout
	}
	c := &Compiled{t: t}
	cols := make([]string, 0, len(t.Where))
	for col := range t.Where {
		cols = append(cols, col)
	}
	sort.Strings(cols)

	table := quoteTable(t.Table)
	key, seq := quote(t.OrderBy), quote(t.Sequence)
	where := func(alias string) string {
		if len(cols) == 0 {
			return "true"
		}
		parts := make([]string, len(cols))
		for i, col := range cols {
			parts[i] = fmt.Sprintf("%s.%s = $%d", alias, quote(col), i+1)
		}
		return strings.Join(parts, " AND ")
	}
	h := fnv.New64a()
	_, _ = fmt.Fprintf(h, "bettercompute.outbox|%s", t.Table)
	for _, col := range cols {
		c.whereVals = append(c.whereVals, t.Where[col])
		_, _ = fmt.Fprintf(h, "|%s=%v", col, t.Where[col])
	}
	c.lockKey = int64(h.Sum64())
	n := len(cols)
	p := func(i int) string { return "$" + strconv.Itoa(n+i) }

	// The candidate scan walks the sequence index in order; the busy check is a
	// correlated subplan (not an anti-join the planner could hash and re-sort),
	// one probe of the partial index per candidate, so the scan stops at the
	// batch size whatever the statistics say. The claim transaction also turns
	// off sequential scans, bitmap scans and sorts.
	c.claimSQL = `
WITH picked AS (
    SELECT t.` + seq + ` AS s FROM ` + table + ` t
    WHERE ` + where("t") + `
      AND t.next_attempt_at <= compute_now()
      AND (t.claimed_until IS NULL OR t.claimed_until <= compute_now())
      AND NOT coalesce((
          SELECT true FROM ` + table + ` b
          WHERE ` + where("b") + ` AND b.` + key + ` = t.` + key + `
            AND (b.claimed_until IS NOT NULL OR b.attempts > 0)
            AND (b.claimed_until > compute_now() OR b.next_attempt_at > compute_now())
          LIMIT 1), false)
    ORDER BY t.` + seq + `
    LIMIT ` + p(1) + `
)
UPDATE ` + table + ` t SET claimed_until = compute_now() + make_interval(secs => ` + p(2) + `)
FROM picked
WHERE t.` + seq + ` = picked.s AND ` + where("t") + `
RETURNING t.` + seq + `::bigint, t.` + key + `::text, t.attempts, t.claimed_until, to_jsonb(t)::text`

	c.deleteSQL = `DELETE FROM ` + table + ` t
WHERE t.` + seq + ` = ANY(` + p(1) + `::bigint[]) AND ` + where("t") + ` AND t.claimed_until = ` + p(2) + `::timestamptz`
	c.failSQL = `UPDATE ` + table + ` t
SET attempts = t.attempts + 1,
    next_attempt_at = compute_now() + make_interval(secs => least(power(2, t.attempts + 1), ` + strconv.Itoa(int(MaxBackoff/time.Second)) + `)),
    claimed_until = NULL,
    last_error = f.err
FROM unnest(` + p(1) + `::bigint[], ` + p(2) + `::text[]) AS f(s, err)
WHERE t.` + seq + ` = f.s AND ` + where("t") + ` AND t.claimed_until = ` + p(3) + `::timestamptz`
	c.freeSQL = `UPDATE ` + table + ` t SET claimed_until = NULL
WHERE t.` + seq + ` = ANY(` + p(1) + `::bigint[]) AND ` + where("t") + ` AND t.claimed_until = ` + p(2) + `::timestamptz`
	// Both counts stop at StatsCap rows: the backlog walks the sequence index,
	// the failing rows the partial index (attempts > 0).
	c.statsSQL = `SELECT
    (SELECT count(*) FROM (SELECT 1 FROM ` + table + ` t WHERE ` + where("t") + ` ORDER BY t.` + seq + ` LIMIT ` + p(1) + `) x),
    (SELECT count(DISTINCT k) FROM (SELECT t.` + key + ` AS k FROM ` + table + ` t
        WHERE ` + where("t") + ` AND (t.claimed_until IS NOT NULL OR t.attempts > 0) AND t.attempts > 0 LIMIT ` + p(1) + `) y)`
	return c, nil
}

// StatsCap caps the rows TableStats counts, so a scrape stays cheap behind a
// huge backlog.
const StatsCap = 100_000

// TableStats is what a dispatcher's table holds now: the rows waiting to be
// published (Backlog) and the keys with a row whose publish failed at least
// once (FailingKeys: each waits for that row's retry), each counted up to
// StatsCap rows.
type TableStats struct {
	Backlog, FailingKeys int64
}

// Stats counts the table's backlog and failing keys (the outbox metrics).
func (c *Compiled) Stats(ctx context.Context, db pg.DBTX) (TableStats, error) {
	var st TableStats
	err := db.QueryRow(ctx, c.statsSQL, c.args(StatsCap)...).Scan(&st.Backlog, &st.FailingKeys)
	if err != nil {
		return st, pg.Translate(fmt.Errorf("error counting outbox table %s: %w", c.t.Table, err))
	}
	return st, nil
}

// Table returns the compiled table with its defaults applied.
func (c *Compiled) Table() Table { return c.t }

func quote(ident string) string { return pgx.Identifier{ident}.Sanitize() }

func quoteTable(t string) string {
	if s, tbl, ok := strings.Cut(t, "."); ok {
		return pgx.Identifier{s, tbl}.Sanitize()
	}
	return quote(t)
}

func (c *Compiled) args(extra ...any) []any {
	return append(append(make([]any, 0, len(c.whereVals)+len(extra)), c.whereVals...), extra...)
}

// Claimed is one row of a claimed batch.
type Claimed struct {
	Seq      int64           // the sequence column
	Key      string          // the ordering column, as text
	Attempts int             // failed publishes so far
	Row      json.RawMessage // the whole row, to_jsonb
}

// Batch is a claim: its rows, in sequence order, and the claim's token (the
// claimed_until it wrote, which Finish checks so that it never touches rows
// another claim has taken since).
type Batch struct {
	Rows  []Claimed
	Token time.Time
	// Deadline is when the claim times out by this process's clock (measured
	// from before the claim began, so it never comes after the database's
	// claimed_until): no publish may start after it.
	Deadline time.Time
}

// claimSettings caps the claim transaction: $1 the lock wait, $2 idle in
// transaction (a process paused mid-claim loses its session, and with it the
// lock: it gives up its turn), and plans that walk the indexes whatever the
// statistics say.
const claimSettings = `SELECT set_config('statement_timeout', $1, true),
       set_config('idle_in_transaction_session_timeout', $2, true),
       set_config('enable_seqscan', 'off', true),
       set_config('enable_bitmapscan', 'off', true),
       set_config('enable_sort', 'off', true)`

func ms(d time.Duration) string { return strconv.FormatInt(max(d.Milliseconds(), 1), 10) }

// Claim takes the next batch: up to BatchSize due rows in sequence order whose
// key has no earlier row claimed or waiting for its retry, marking them claimed
// until now + ClaimTimeout. One claim of a table and Where runs at a time across
// processes: the claim holds a transaction-level advisory lock (never a session
// lock: safe behind PgBouncer), and a claim stalled for ClaimTimeout is cancelled
// by the server, releasing it. db must be a pool (the claim commits its own
// transaction). It returns an empty batch when no row is due.
func (c *Compiled) Claim(ctx context.Context, db pg.DBTX) (*Batch, error) {
	b := &Batch{Deadline: time.Now().Add(c.t.ClaimTimeout)}
	err := pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		var pb pgx.Batch
		pb.Queue(claimSettings, ms(2*c.t.ClaimTimeout), ms(c.t.ClaimTimeout))
		pb.Queue(`SELECT pg_advisory_xact_lock($1)`, c.lockKey)
		pb.Queue(`SELECT set_config('statement_timeout', $1, true)`, ms(c.t.ClaimTimeout))
		pb.Queue(c.claimSQL, c.args(c.t.BatchSize, c.t.ClaimTimeout.Seconds())...)
		res := tx.SendBatch(ctx, &pb)
		defer res.Close()
		for i := 0; i < 3; i++ {
			if _, err := res.Exec(); err != nil {
				return fmt.Errorf("error taking the claim lock of outbox %s: %w", c.t.Table, err)
			}
		}
		rows, err := res.Query()
		if err != nil {
			return fmt.Errorf("error claiming from outbox %s: %w", c.t.Table, err)
		}
		for rows.Next() {
			var r Claimed
			var row string
			var token time.Time
			if err := rows.Scan(&r.Seq, &r.Key, &r.Attempts, &token, &row); err != nil {
				rows.Close()
				return fmt.Errorf("error claiming from outbox %s: %w", c.t.Table, err)
			}
			r.Row = json.RawMessage(row)
			b.Token = token
			b.Rows = append(b.Rows, r)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("error claiming from outbox %s: %w", c.t.Table, err)
		}
		return res.Close()
	})
	if err != nil {
		return nil, pg.Translate(err)
	}
	sort.Slice(b.Rows, func(i, j int) bool { return b.Rows[i].Seq < b.Rows[j].Seq })
	return b, nil
}

// Failure is a row whose publish failed, with its error message.
type Failure struct {
	Seq int64
	Err string
}

// Outcome is what became of a batch's rows.
type Outcome struct {
	Published []int64   // deleted
	Failed    []Failure // retried after Backoff, keeping their place
	Released  []int64   // not tried (an earlier row of their key failed, or the batch ran out of time): claimable again at once
}

// Finish ends a batch in one transaction, under the same lock as claims: it
// deletes the published rows, records each failure (attempts + 1, the next
// attempt after Backoff, the first MaxErrorLen characters of the error) and
// releases the rest. Rows whose claim another batch has taken since (their
// claimed_until is no longer the token) are left alone: that batch owns them.
func (c *Compiled) Finish(ctx context.Context, db pg.DBTX, b *Batch, o Outcome) error {
	if len(o.Published)+len(o.Failed)+len(o.Released) == 0 {
		return nil
	}
	failSeqs := make([]int64, len(o.Failed))
	failErrs := make([]string, len(o.Failed))
	for i, f := range o.Failed {
		failSeqs[i], failErrs[i] = f.Seq, TruncateError(f.Err)
	}
	err := pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		var pb pgx.Batch
		pb.Queue(`SELECT set_config('statement_timeout', $1, true), set_config('idle_in_transaction_session_timeout', $1, true)`, ms(c.t.ClaimTimeout))
		pb.Queue(`SELECT pg_advisory_xact_lock($1)`, c.lockKey)
		if len(o.Published) > 0 {
			pb.Queue(c.deleteSQL, c.args(o.Published, b.Token)...)
		}
		if len(o.Failed) > 0 {
			pb.Queue(c.failSQL, c.args(failSeqs, failErrs, b.Token)...)
		}
		if len(o.Released) > 0 {
			pb.Queue(c.freeSQL, c.args(o.Released, b.Token)...)
		}
		res := tx.SendBatch(ctx, &pb)
		for i := 0; i < pb.Len(); i++ {
			if _, err := res.Exec(); err != nil {
				res.Close()
				return fmt.Errorf("error finishing a batch of outbox %s: %w", c.t.Table, err)
			}
		}
		return res.Close()
	})
	return pg.Translate(err)
}

// Backoff is the wait before the next publish of a row that has failed
// attempts times: 2, 4, 8 … seconds, at most MaxBackoff (256 s), without end.
func Backoff(attempts int) time.Duration {
	if attempts < 1 {
		return 0
	}
	if attempts >= 8 {
		return MaxBackoff
	}
	return time.Duration(math.Pow(2, float64(attempts))) * time.Second
}

// TruncateError returns the first MaxErrorLen characters of msg, as valid UTF-8
// without NUL bytes (PostgreSQL text refuses both).
func TruncateError(msg string) string {
	msg = fault.CleanText(msg)
	if utf8.RuneCountInString(msg) <= MaxErrorLen {
		return msg
	}
	n := 0
	for i := range msg {
		if n == MaxErrorLen {
			return msg[:i]
		}
		n++
	}
	return msg
}
