package confirmation_test

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bettercompute/bettercompute/domain/workflow"
	"github.com/bettercompute/bettercompute/domain/workflow/confirmation"
	"github.com/bettercompute/bettercompute/platform/clock"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type approval struct {
	By string `json:"by"`
}

// refund waits for "approved"; no worker runs in these tests: what they check
// is the signal stored in the workflow's inbox.
var refund = &workflow.Workflow[string, string, string]{
	Kind: "refund",
	Init: func(in string) (string, error) { return in, nil },
	Steps: []workflow.Step[string]{
		{Name: "ask", Tx: func(context.Context, pgx.Tx, *workflow.Call[string]) (workflow.Next, error) {
			return workflow.AwaitSignal("approved", time.Hour, "pay", "pay"), nil
		}},
		{Name: "pay", Tx: func(_ context.Context, _ pgx.Tx, c *workflow.Call[string]) (workflow.Next, error) {
			return workflow.Finish(c.State), nil
		}},
	},
	Signals: []string{"approved", "rejected"},
}

func setup(t testing.TB) *pgtest.DB {
	t.Helper()
	db := pgtest.New(t)
	if err := workflow.RecordKinds(context.Background(), db, []workflow.Meta{refund.Meta()}); err != nil {
		t.Fatal(err)
	}
	return db
}

func start(t *testing.T, db *pgtest.DB, id string) {
	t.Helper()
	err := pg.InTx(context.Background(), db, func(ctx context.Context, tx pgx.Tx) error {
		_, err := refund.StartTx(ctx, tx, "r", &workflow.StartOpts{ID: id})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// signals counts the signals stored for workflow id.
func signals(t *testing.T, db *pgtest.DB, id string) int {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(), `SELECT count(*) FROM compute_workflow_signals WHERE workflow_id = $1`, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestConfirmStoresTheSignalOnce(t *testing.T) {
	ctx := context.Background()
	db := setup(t)
	start(t, db, "refund-1")

	tok, b, err := confirmation.Create(ctx, db, "refund-1", "approved", &confirmation.CreateOpts{Payload: approval{By: "kim"}})
	if err != nil {
		t.Fatal(err)
	}
	if b.State != confirmation.Pending || b.Kind != "refund" || b.ExpiresAt.Sub(b.CreatedAt) != confirmation.DefaultTTL {
		t.Fatalf("binding = %+v", b)
	}
	if err := confirmation.CheckToken(string(tok)); err != nil {
		t.Fatalf("CreateTx's token fails CheckToken: %v", err)
	}
	if p, err := confirmation.Peek(ctx, db, string(tok)); err != nil || p.ID != b.ID || p.State != confirmation.Pending {
		t.Fatalf("Peek = %+v, %v", p, err)
	}
	if n := signals(t, db, "refund-1"); n != 0 {
		t.Fatalf("%d signals before the confirmation (Peek stored one?)", n)
	}

	got, err := confirmation.Confirm(ctx, db, string(tok))
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != b.ID || got.WorkflowID != "refund-1" || got.Signal != "approved" {
		t.Fatalf("Confirm = %+v", got)
	}
	var payload, dedup string
	err = db.QueryRow(ctx, `SELECT payload::text, dedup_key FROM compute_workflow_signals WHERE workflow_id = 'refund-1' AND name = 'approved'`).Scan(&payload, &dedup)
	if err != nil {
		t.Fatal(err)
	}
	if payload != `{"by": "kim"}` || dedup != fmt.Sprintf("confirmation:%d", b.ID) {
		t.Fatalf("signal payload %s, dedup key %s", payload, dedup)
	}

	for range 3 {
		again, err := confirmation.Confirm(ctx, db, string(tok))
		if !errors.Is(err, confirmation.ErrAlreadyConfirmed) || !fault.Has(err, fault.Conflict) {
			t.Fatalf("second Confirm: %v", err)
		}
		if again == nil || again.ID != b.ID {
			t.Fatalf("second Confirm's binding = %+v", again)
		}
	}
	if _, err := confirmation.Peek(ctx, db, string(tok)); !errors.Is(err, confirmation.ErrAlreadyConfirmed) {
		t.Fatalf("Peek after the confirmation: %v", err)
	}
	if n := signals(t, db, "refund-1"); n != 1 {
		t.Fatalf("%d signals, want 1", n)
	}
	bs, err := confirmation.List(ctx, db, confirmation.ListOpts{WorkflowID: "refund-1"})
	if err != nil || len(bs) != 1 || bs[0].State != confirmation.Confirmed || bs[0].UsedAt == nil {
		t.Fatalf("List = %+v, %v", bs, err)
	}
}

// TestConcurrentConfirmsStoreOneSignal: 50 confirmations of one token at
// once: one is confirmed, 49 are ErrAlreadyConfirmed, one signal is stored.
func TestConcurrentConfirmsStoreOneSignal(t *testing.T) {
	ctx := context.Background()
	db := setup(t)
	start(t, db, "refund-c")
	tok, _, err := confirmation.Create(ctx, db, "refund-c", "approved", nil)
	if err != nil {
		t.Fatal(err)
	}
	const n = 50
	var wg sync.WaitGroup
	errs := make(chan error, n)
	gate := make(chan struct{})
	for range n {
		wg.Go(func() {
			<-gate
			_, err := confirmation.Confirm(ctx, db, string(tok))
			errs <- err
		})
	}
	close(gate)
	wg.Wait()
	close(errs)
	ok, already := 0, 0
	for err := range errs {
		switch {
		case err == nil:
			ok++
		case errors.Is(err, confirmation.ErrAlreadyConfirmed):
			already++
		default:
			t.Errorf("Confirm: %v", err)
		}
	}
	if ok != 1 || already != n-1 {
		t.Fatalf("%d confirmed, %d already confirmed; want 1 and %d", ok, already, n-1)
	}
	if got := signals(t, db, "refund-c"); got != 1 {
		t.Fatalf("%d signals, want 1", got)
	}
}

// TestExpiryOnTheSimClock: a binding works until its TTL has passed on
// compute_now(), then it is ErrNotValid, as an unknown token is.
func TestExpiryOnTheSimClock(t *testing.T) {
	ctx := context.Background()
	db := setup(t)
	if err := clock.UseSim(ctx, db, time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)); err != nil {
		t.Fatal(err)
	}
	start(t, db, "refund-e")
	tok, b, err := confirmation.Create(ctx, db, "refund-e", "approved", &confirmation.CreateOpts{TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if !b.ExpiresAt.Equal(time.Date(2030, 1, 1, 1, 0, 0, 0, time.UTC)) {
		t.Fatalf("expires at %s, want an hour after the sim clock's time", b.ExpiresAt)
	}
	if _, err := clock.Advance(ctx, db, 59*time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := confirmation.Peek(ctx, db, string(tok)); err != nil {
		t.Fatalf("Peek a minute before the expiry: %v", err)
	}
	if _, err := clock.Advance(ctx, db, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := confirmation.Peek(ctx, db, string(tok)); err != confirmation.ErrNotValid {
		t.Fatalf("Peek at the expiry: %v, want ErrNotValid", err)
	}
	if _, err := confirmation.Confirm(ctx, db, string(tok)); err != confirmation.ErrNotValid {
		t.Fatalf("Confirm at the expiry: %v, want ErrNotValid", err)
	}
	unknown, _, _ := confirmation.Create(ctx, db, "refund-e", "approved", nil) // a valid token, then forget its binding
	if _, err := db.Exec(ctx, `DELETE FROM compute_confirmations WHERE id <> $1`, b.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := confirmation.Confirm(ctx, db, string(unknown)); err != confirmation.ErrNotValid {
		t.Fatalf("Confirm of an unknown token: %v, want the very same ErrNotValid", err)
	}
	if n := signals(t, db, "refund-e"); n != 0 {
		t.Fatalf("%d signals after refused confirmations", n)
	}
	bs, err := confirmation.List(ctx, db, confirmation.ListOpts{State: confirmation.Expired})
	if err != nil || len(bs) != 1 || bs[0].ID != b.ID {
		t.Fatalf("List(expired) = %+v, %v", bs, err)
	}
}

// TestRevokeRacesConfirm: a revoke and a confirmation of one binding at once,
// many times: exactly one wins each time, and a signal is stored exactly when
// the confirmation won.
func TestRevokeRacesConfirm(t *testing.T) {
	ctx := context.Background()
	db := setup(t)
	wins := map[string]int{}
	for i := range 40 {
		id := fmt.Sprintf("refund-r%d", i)
		start(t, db, id)
		tok, b, err := confirmation.Create(ctx, db, id, "approved", nil)
		if err != nil {
			t.Fatal(err)
		}
		var cerr, rerr error
		var wg sync.WaitGroup
		gate := make(chan struct{})
		wg.Go(func() { <-gate; _, cerr = confirmation.Confirm(ctx, db, string(tok)) })
		wg.Go(func() { <-gate; _, rerr = confirmation.Revoke(ctx, db, b.ID) })
		close(gate)
		wg.Wait()
		n := signals(t, db, id)
		switch {
		case cerr == nil && errors.Is(rerr, confirmation.ErrAlreadyConfirmed) && n == 1:
			wins["confirm"]++
		case rerr == nil && cerr == confirmation.ErrNotValid && n == 0:
			wins["revoke"]++
		default:
			t.Fatalf("round %d: confirm %v, revoke %v, %d signals", i, cerr, rerr, n)
		}
	}
	t.Logf("wins: %v", wins)
}

func TestRevoke(t *testing.T) {
	ctx := context.Background()
	db := setup(t)
	start(t, db, "refund-v")
	tok, b, err := confirmation.Create(ctx, db, "refund-v", "rejected", nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 { // a second revoke changes nothing more
		got, err := confirmation.Revoke(ctx, db, b.ID)
		if err != nil || got.State != confirmation.Revoked || got.RevokedAt == nil {
			t.Fatalf("Revoke = %+v, %v", got, err)
		}
	}
	if _, err := confirmation.Confirm(ctx, db, string(tok)); err != confirmation.ErrNotValid {
		t.Fatalf("Confirm of a revoked token: %v", err)
	}
	if _, err := confirmation.Revoke(ctx, db, 1<<40); !fault.Has(err, fault.NotFound) {
		t.Fatalf("Revoke of an unknown id: %v", err)
	}
}

// TestCreateRefusesBadInput: each refusal has its code and writes nothing.
func TestCreateRefusesBadInput(t *testing.T) {
	ctx := context.Background()
	db := setup(t)
	start(t, db, "refund-b")
	start(t, db, "refund-done")
	if err := pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		return workflow.CancelTx(ctx, tx, "refund-done", "test")
	}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, workflow, signal string
		opts                   *confirmation.CreateOpts
		code                   fault.Code
	}{
		{"unknown workflow", "no-such", "approved", nil, fault.NotFound},
		{"finished workflow", "refund-done", "approved", nil, fault.Conflict},
		{"undeclared signal", "refund-b", "shipped", nil, fault.InvalidArgument},
		{"bad workflow id", "", "approved", nil, fault.InvalidArgument},
		{"empty signal", "refund-b", "", nil, fault.InvalidArgument},
		{"signal with a NUL", "refund-b", "a\x00b", nil, fault.InvalidArgument},
		{"TTL too short", "refund-b", "approved", &confirmation.CreateOpts{TTL: time.Millisecond}, fault.InvalidArgument},
		{"TTL too long", "refund-b", "approved", &confirmation.CreateOpts{TTL: 100 * 24 * time.Hour}, fault.InvalidArgument},
		{"negative TTL", "refund-b", "approved", &confirmation.CreateOpts{TTL: -time.Hour}, fault.InvalidArgument},
		{"bad JSON payload", "refund-b", "approved", &confirmation.CreateOpts{Payload: json.RawMessage(`{`)}, fault.InvalidArgument},
		{"oversize payload", "refund-b", "approved", &confirmation.CreateOpts{Payload: strings.Repeat("x", confirmation.MaxPayload)}, fault.InvalidArgument},
		{"unencodable payload", "refund-b", "approved", &confirmation.CreateOpts{Payload: func() {}}, fault.InvalidArgument},
	} {
		t.Run(c.name, func(t *testing.T) {
			tok, b, err := confirmation.Create(ctx, db, c.workflow, c.signal, c.opts)
			if !fault.Has(err, c.code) || tok != "" || b != nil {
				t.Fatalf("Create = %q, %+v, %v; want %s", tok, b, err, c.code)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("error is not one line: %q", err)
			}
		})
	}
	var n int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM compute_confirmations`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d bindings written by refused creates (%v)", n, err)
	}
}

// TestConfirmOfAFinishedWorkflow: the signal cannot be stored, so nothing is
// written: the binding stays pending.
func TestConfirmOfAFinishedWorkflow(t *testing.T) {
	ctx := context.Background()
	db := setup(t)
	start(t, db, "refund-f")
	tok, b, err := confirmation.Create(ctx, db, "refund-f", "approved", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := pg.InTx(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
		return workflow.CancelTx(ctx, tx, "refund-f", "test")
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := confirmation.Confirm(ctx, db, string(tok)); !fault.Has(err, fault.Conflict) || errors.Is(err, confirmation.ErrAlreadyConfirmed) {
		t.Fatalf("Confirm for a cancelled workflow: %v, want CONFLICT", err)
	}
	got, err := confirmation.Get(ctx, db, b.ID)
	if err != nil || got.State != confirmation.Pending {
		t.Fatalf("binding after the refused confirmation: %+v, %v", got, err)
	}
}

// TestTokenIsNeitherStoredNorPrinted: the table holds the token's SHA-256
// only, and formatting a Token, or an error of this package, never prints it.
func TestTokenIsNeitherStoredNorPrinted(t *testing.T) {
	ctx := context.Background()
	db := setup(t)
	start(t, db, "refund-s")
	tok, b, err := confirmation.Create(ctx, db, "refund-s", "approved", nil)
	if err != nil {
		t.Fatal(err)
	}
	secret := string(tok)[len(confirmation.TokenPrefix):]
	var row string
	var h []byte
	if err := db.QueryRow(ctx, `SELECT c::text, token_hash FROM compute_confirmations c WHERE id = $1`, b.ID).Scan(&row, &h); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(row, secret) {
		t.Fatalf("the stored row holds the token: %s", row)
	}
	if want := sha256.Sum256([]byte(tok)); string(h) != string(want[:]) {
		t.Fatalf("token_hash is not the token's SHA-256")
	}
	for _, s := range []string{fmt.Sprint(tok), fmt.Sprintf("%v %s %q %#v %+v", tok, tok, tok, tok, tok),
		fmt.Sprint(struct{ T confirmation.Token }{tok}), fmt.Errorf("oops: %v", tok).Error()} {
		if strings.Contains(s, secret) {
			t.Fatalf("formatting a Token printed it: %s", s)
		}
	}
	if u := tok.URL("https://pay.example.com/"); u != "https://pay.example.com/confirm/"+string(tok) {
		t.Fatalf("URL = %s", u)
	}
	// A malformed token: INVALID_ARGUMENT, and the message does not repeat it.
	for _, bad := range []string{"", "bcc_", string(tok) + "x", string(tok)[:len(tok)-1], strings.Replace(string(tok), "bcc_", "bcd_", 1),
		string(tok)[:len(tok)-1] + "!", string(tok)[:len(tok)-1] + "\x00"} {
		_, err := confirmation.Confirm(ctx, db, bad)
		if !fault.Has(err, fault.InvalidArgument) || (len(bad) > 8 && strings.Contains(err.Error(), bad[4:])) {
			t.Fatalf("Confirm(%q): %v", bad, err)
		}
	}
	if n := signals(t, db, "refund-s"); n != 0 {
		t.Fatalf("%d signals after malformed confirmations", n)
	}
}
