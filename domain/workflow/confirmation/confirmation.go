package confirmation

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/domain/workflow"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
)

const (
	// TokenPrefix begins every token, so a secret scanner can find one.
	TokenPrefix = "bcc_"
	// tokenBytes is a token's randomness: 256 bits.
	tokenBytes = 32
	// TokenLen is a token's length: the prefix and 43 characters of
	// unpadded base64url.
	TokenLen = len(TokenPrefix) + 43

	// DefaultTTL is how long a binding stays pending when CreateOpts.TTL is 0.
	DefaultTTL = 72 * time.Hour
	// MinTTL and MaxTTL bound CreateOpts.TTL.
	MinTTL = time.Second
	MaxTTL = 90 * 24 * time.Hour
	// MaxPayload is the largest payload, encoded as JSON, a binding carries.
	MaxPayload = 64 << 10
)

var (
	// ErrNotValid is an unknown, expired or revoked token, and a revoked or
	// unknown binding id: one error, so that nothing tells which tokens exist.
	ErrNotValid = fault.New(fault.NotFound, "no such confirmation: the link is unknown, expired or revoked")
	// ErrAlreadyConfirmed is a binding that was confirmed before: its signal
	// was stored then, and is not stored again.
	ErrAlreadyConfirmed = fault.New(fault.Conflict, "already confirmed")
	// errMalformed is a string that cannot be a token.
	errMalformed = fault.New(fault.InvalidArgument, "malformed confirmation token: want bcc_ and 43 characters of base64url")
)

// Token is a binding's secret. It formats as "bcc_…" (%s, %v, %q), so a token
// handed to a logger or an error by mistake does not leak; string(tok) and
// URL read it.
type Token string

// String returns the token's prefix only.
func (Token) String() string { return TokenPrefix + "…" }

// GoString returns the token's prefix only (%#v).
func (Token) GoString() string { return `confirmation.Token("` + TokenPrefix + `…")` }

// URL is the token's link under base (the public listener's URL, e.g.
// https://confirm.example.com/): base/confirm/TOKEN.
func (t Token) URL(base string) string {
	return strings.TrimSuffix(base, "/") + "/confirm/" + string(t)
}

// CheckToken reports whether s has a token's form (INVALID_ARGUMENT
// otherwise, without s in the message).
func CheckToken(s string) error {
	if len(s) != TokenLen || !strings.HasPrefix(s, TokenPrefix) {
		return errMalformed
	}
	for _, c := range []byte(s[len(TokenPrefix):]) {
		if !('A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return errMalformed
		}
	}
	return nil
}

func newToken() (Token, []byte) {
	b := make([]byte, tokenBytes)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	t := Token(TokenPrefix + base64.RawURLEncoding.EncodeToString(b))
	return t, hash(string(t))
}

func hash(token string) []byte {
	h := sha256.Sum256([]byte(token))
	return h[:]
}

// State is a binding's state.
type State string

// A binding's states: see the package doc.
const (
	Pending   State = "pending"
	Confirmed State = "confirmed"
	Revoked   State = "revoked"
	Expired   State = "expired"
)

// Binding is a confirmation without its token.
type Binding struct {
	ID         int64           `json:"id"`
	WorkflowID string          `json:"workflow_id"`
	Kind       string          `json:"kind"` // the workflow's kind
	Signal     string          `json:"signal"`
	Payload    json.RawMessage `json:"payload,omitempty"`
	State      State           `json:"state"`
	CreatedAt  time.Time       `json:"created_at"`
	ExpiresAt  time.Time       `json:"expires_at"`
	UsedAt     *time.Time      `json:"used_at,omitempty"`
	RevokedAt  *time.Time      `json:"revoked_at,omitempty"`
}

// bindingColumns are a Binding's columns, read by scanBinding (c is
// compute_confirmations, w its workflow).
const bindingColumns = `c.id, c.workflow_id, w.kind, c.signal, c.payload, ` + stateSQL + `,
	c.created_at, c.expires_at, c.used_at, c.revoked_at`

// stateSQL is the State of binding c, derived from its columns.
const stateSQL = `CASE WHEN c.used_at IS NOT NULL THEN 'confirmed' WHEN c.revoked_at IS NOT NULL THEN 'revoked'
	WHEN c.expires_at <= compute_now() THEN 'expired' ELSE 'pending' END`

func scanBinding(row pgx.Row) (*Binding, error) {
	var b Binding
	var payload []byte
	err := row.Scan(&b.ID, &b.WorkflowID, &b.Kind, &b.Signal, &payload, &b.State,
		&b.CreatedAt, &b.ExpiresAt, &b.UsedAt, &b.RevokedAt)
	if err != nil {
		return nil, err
	}
	if payload != nil {
		b.Payload = json.RawMessage(payload)
	}
	return &b, nil
}

// CreateOpts are a binding's options.
type CreateOpts struct {
	// Payload, optional, is the signal's payload (any value that encodes as
	// JSON; a json.RawMessage as is), at most MaxPayload bytes.
	Payload any
	// TTL is how long the binding stays pending, from compute_now() (default
	// DefaultTTL; MinTTL to MaxTTL).
	TTL time.Duration
}

// createSQL inserts a binding for workflow $1 if it is live and declares
// signal $3: $2 the token's hash, $4 the payload, $5 the TTL in
// microseconds. FOR KEY SHARE of the workflow's row, as a signal takes it: a
// finish committing meanwhile shows as the status. Its row: status, whether
// the kind declares the signal, and the binding (NULL when refused).
const createSQL = `
WITH w AS (
    SELECT w.id, w.kind, w.status, k.signals FROM compute_workflows w
    LEFT JOIN compute_workflow_kinds k ON k.kind = w.kind
    WHERE w.id = $1 FOR KEY SHARE OF w
), ins AS (
    INSERT INTO compute_confirmations (token_hash, workflow_id, signal, payload, expires_at)
    SELECT $2, w.id, $3, $4::jsonb, compute_now() + $5::bigint * interval '1 microsecond' FROM w
    WHERE $3 = ANY(w.signals) AND w.status NOT IN ('cancelling', 'completed', 'failed', 'cancelled')
    RETURNING id, created_at, expires_at
)
SELECT w.kind, w.status, coalesce($3 = ANY(w.signals), false), ins.id, ins.created_at, ins.expires_at
FROM w LEFT JOIN ins ON true`

// CreateTx binds a new token to signal (with opts.Payload) for workflow
// workflowID, in the caller's transaction: if tx rolls back, the token never
// worked. It returns the token, once (only its hash is stored), and the
// binding. A workflow that does not exist is NOT_FOUND, a finished (or
// cancelling) one CONFLICT, a signal its kind does not declare, a bad id,
// signal, payload or TTL INVALID_ARGUMENT; nothing is written then.
func CreateTx(ctx context.Context, tx pgx.Tx, workflowID, signal string, opts *CreateOpts) (Token, *Binding, error) {
	var o CreateOpts
	if opts != nil {
		o = *opts
	}
	if err := workflow.ValidateID(workflowID); err != nil {
		return "", nil, err
	}
	if err := fault.CheckText("confirmation: signal", signal); err != nil {
		return "", nil, err
	}
	if signal == "" || len(signal) > 63 {
		return "", nil, fault.New(fault.InvalidArgument, "confirmation: bad signal name %q", signal)
	}
	if o.TTL == 0 {
		o.TTL = DefaultTTL
	}
	if o.TTL < MinTTL || o.TTL > MaxTTL {
		return "", nil, fault.New(fault.InvalidArgument, "confirmation: TTL %s is out of range (%s to %s)", o.TTL, MinTTL, MaxTTL)
	}
	var payload any
	if o.Payload != nil {
		enc, err := encodePayload(o.Payload)
		if err != nil {
			return "", nil, err
		}
		payload = string(enc)
	}
	tok, h := newToken()
	var (
		kind, status string
		known        bool
		id           *int64
		created, exp *time.Time
	)
	err := tx.QueryRow(ctx, createSQL, workflowID, h, signal, payload, o.TTL.Microseconds()).
		Scan(&kind, &status, &known, &id, &created, &exp)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil, fault.New(fault.NotFound, "no workflow %s", workflowID)
	}
	if err != nil {
		return "", nil, pg.Translate(fmt.Errorf("error creating a confirmation for workflow %s: %w", workflowID, err))
	}
	switch {
	case !known:
		return "", nil, fault.New(fault.InvalidArgument, "workflow %s (%s) does not take signal %s", workflowID, kind, signal)
	case id == nil:
		return "", nil, fault.New(fault.Conflict, "workflow %s is %s: it takes no more signals", workflowID, status)
	}
	b := &Binding{ID: *id, WorkflowID: workflowID, Kind: kind, Signal: signal, State: Pending, CreatedAt: *created, ExpiresAt: *exp}
	if payload != nil {
		b.Payload = json.RawMessage(payload.(string))
	}
	return tok, b, nil
}

// Create is CreateTx in a transaction of its own.
func Create(ctx context.Context, db pg.DBTX, workflowID, signal string, opts *CreateOpts) (tok Token, b *Binding, err error) {
	err = pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		tok, b, err = CreateTx(ctx, tx, workflowID, signal, opts)
		return err
	})
	return tok, b, err
}

// encodePayload is workflow.EncodePayload (the checks a signal's payload
// passes), within this package's smaller MaxPayload.
func encodePayload(v any) (json.RawMessage, error) {
	enc, err := workflow.EncodePayload("confirmation's payload", v)
	if err != nil {
		return nil, err
	}
	if len(enc) > MaxPayload {
		return nil, fault.New(fault.InvalidArgument, "confirmation: the payload is %d bytes, over the limit of %d", len(enc), MaxPayload)
	}
	return enc, nil
}

// ConfirmTx uses token in the caller's transaction: it marks its binding
// confirmed and stores the binding's signal, both or neither (the caller
// commits, or rolls back on an error). A token used before is
// ErrAlreadyConfirmed (CONFLICT), with the binding; an unknown, expired or
// revoked one ErrNotValid (NOT_FOUND); a string that cannot be a token
// INVALID_ARGUMENT before any statement is sent. A workflow that takes no
// more signals (it finished) is CONFLICT, and the binding stays pending. No
// error holds the token.
func ConfirmTx(ctx context.Context, tx pgx.Tx, token string) (*Binding, error) {
	if err := CheckToken(token); err != nil {
		return nil, err
	}
	var (
		outcome  string
		id       *int64
		wid, sig *string
		payload  []byte
	)
	err := tx.QueryRow(ctx, `SELECT outcome, id, workflow_id, signal, payload FROM compute_confirm($1)`, hash(token)).
		Scan(&outcome, &id, &wid, &sig, &payload)
	if err != nil {
		return nil, pg.Translate(fmt.Errorf("error confirming: %w", err))
	}
	switch outcome {
	case "used":
		return &Binding{ID: *id, WorkflowID: *wid, Signal: *sig, State: Confirmed}, ErrAlreadyConfirmed
	case "refused":
		return nil, ErrNotValid
	}
	var p any
	if payload != nil {
		p = json.RawMessage(payload)
	}
	_, err = workflow.SignalTx(ctx, tx, *wid, *sig, p, &workflow.SignalOpts{DedupKey: fmt.Sprintf("confirmation:%d", *id)})
	if err != nil {
		return nil, fmt.Errorf("confirmation %d: %w", *id, err)
	}
	return &Binding{ID: *id, WorkflowID: *wid, Signal: *sig, Payload: json.RawMessage(payload), State: Confirmed}, nil
}

// Confirm is ConfirmTx in a transaction of its own.
func Confirm(ctx context.Context, db pg.DBTX, token string) (b *Binding, err error) {
	err = pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		b, err = ConfirmTx(ctx, tx, token)
		return err
	})
	return b, err
}

// Peek returns token's binding if it is pending, changing nothing (what the
// GET of a link shows). Errors are ConfirmTx's: ErrAlreadyConfirmed (with the
// binding), ErrNotValid, INVALID_ARGUMENT.
func Peek(ctx context.Context, db pg.DBTX, token string) (*Binding, error) {
	if err := CheckToken(token); err != nil {
		return nil, err
	}
	b, err := scanBinding(db.QueryRow(ctx, `SELECT `+bindingColumns+` FROM compute_confirmations c
		JOIN compute_workflows w ON w.id = c.workflow_id WHERE c.token_hash = $1`, hash(token)))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotValid
	}
	if err != nil {
		return nil, pg.Translate(fmt.Errorf("error reading a confirmation: %w", err))
	}
	switch b.State {
	case Pending:
		return b, nil
	case Confirmed:
		return b, ErrAlreadyConfirmed
	}
	return nil, ErrNotValid
}

// Get returns binding id (NOT_FOUND if there is none).
func Get(ctx context.Context, db pg.DBTX, id int64) (*Binding, error) {
	b, err := scanBinding(db.QueryRow(ctx, `SELECT `+bindingColumns+` FROM compute_confirmations c
		JOIN compute_workflows w ON w.id = c.workflow_id WHERE c.id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fault.New(fault.NotFound, "no confirmation %d", id)
	}
	if err != nil {
		return nil, pg.Translate(fmt.Errorf("error reading confirmation %d: %w", id, err))
	}
	return b, nil
}

// RevokeTx revokes binding id in the caller's transaction: its token stops
// working. A binding confirmed before is ErrAlreadyConfirmed (its signal was
// stored); revoking a revoked or expired one changes nothing more; an
// unknown id is NOT_FOUND. It returns the binding as it is now.
func RevokeTx(ctx context.Context, tx pgx.Tx, id int64) (*Binding, error) {
	_, err := tx.Exec(ctx, `UPDATE compute_confirmations SET revoked_at = compute_now()
		WHERE id = $1 AND used_at IS NULL AND revoked_at IS NULL`, id)
	if err != nil {
		return nil, pg.Translate(fmt.Errorf("error revoking confirmation %d: %w", id, err))
	}
	// After the UPDATE: it waited for a confirmation in flight, whose commit
	// this statement's snapshot sees.
	b, err := Get(ctx, tx, id)
	if err != nil {
		return nil, err
	}
	if b.State == Confirmed {
		return b, ErrAlreadyConfirmed
	}
	return b, nil
}

// Revoke is RevokeTx in a transaction of its own.
func Revoke(ctx context.Context, db pg.DBTX, id int64) (b *Binding, err error) {
	err = pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		b, err = RevokeTx(ctx, tx, id)
		if errors.Is(err, ErrAlreadyConfirmed) {
			return nil
		}
		return err
	})
	if err == nil && b.State == Confirmed {
		err = ErrAlreadyConfirmed
	}
	return b, err
}

// ListOpts filter List.
type ListOpts struct {
	// WorkflowID, optional: that workflow's bindings only.
	WorkflowID string
	// State, optional: bindings in that state only.
	State State
	// Limit is the most bindings returned, newest first (default and maximum 1000).
	Limit int
}

// List returns bindings, newest first, without their tokens.
func List(ctx context.Context, db pg.DBTX, o ListOpts) ([]Binding, error) {
	switch o.State {
	case "", Pending, Confirmed, Revoked, Expired:
	default:
		return nil, fault.New(fault.InvalidArgument, "state %q: want pending, confirmed, revoked or expired", o.State)
	}
	if o.WorkflowID != "" {
		if err := workflow.ValidateID(o.WorkflowID); err != nil {
			return nil, err
		}
	}
	if o.Limit <= 0 || o.Limit > 1000 {
		o.Limit = 1000
	}
	rows, err := db.Query(ctx, `SELECT * FROM (SELECT `+bindingColumns+` FROM compute_confirmations c
		JOIN compute_workflows w ON w.id = c.workflow_id
		WHERE ($1 = '' OR c.workflow_id = $1)) b (id, workflow_id, kind, signal, payload, state, created_at, expires_at, used_at, revoked_at)
		WHERE ($2 = '' OR state = $2) ORDER BY id DESC LIMIT $3`, o.WorkflowID, string(o.State), o.Limit)
	if err != nil {
		return nil, pg.Translate(fmt.Errorf("error listing confirmations: %w", err))
	}
	defer rows.Close()
	var out []Binding
	for rows.Next() {
		b, err := scanBinding(rows)
		if err != nil {
			return nil, pg.Translate(fmt.Errorf("error listing confirmations: %w", err))
		}
		out = append(out, *b)
	}
	if err := rows.Err(); err != nil {
		return nil, pg.Translate(fmt.Errorf("error listing confirmations: %w", err))
	}
	return out, nil
}

// Counts returns how many bindings are in each state (every state present).
func Counts(ctx context.Context, db pg.DBTX) (map[State]int64, error) {
	out := map[State]int64{Pending: 0, Confirmed: 0, Revoked: 0, Expired: 0}
	rows, err := db.Query(ctx, `SELECT `+stateSQL+`, count(*) FROM compute_confirmations c GROUP BY 1`)
	if err != nil {
		return nil, pg.Translate(fmt.Errorf("error counting confirmations: %w", err))
	}
	defer rows.Close()
	for rows.Next() {
		var st State
		var n int64
		if err := rows.Scan(&st, &n); err != nil {
			return nil, pg.Translate(fmt.Errorf("error counting confirmations: %w", err))
		}
		out[st] = n
	}
	if err := rows.Err(); err != nil {
		return nil, pg.Translate(fmt.Errorf("error counting confirmations: %w", err))
	}
	return out, nil
}
