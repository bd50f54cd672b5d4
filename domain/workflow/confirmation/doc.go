// Package confirmation is Better Compute's confirmations: single-use,
// expiring links that resume a workflow exactly once. A manager approves a
// refund from an email, a customer confirms an order, a payment provider calls
// back: each holds a link whose secret token is bound to one action, a signal
// (with an optional payload) to one workflow.
//
//	tok, b, err := confirmation.CreateTx(ctx, tx, "order-17", "paid",
//		&confirmation.CreateOpts{Payload: Payment{Amount: 30}, TTL: 24 * time.Hour})
//	link := tok.URL("https://pay.example.com/") // https://pay.example.com/confirm/bcc_…
//
// `better-compute serve` answers the links on its public listener
// (BETTER_COMPUTE_PUBLIC_LISTEN): GET /confirm/{token} shows what will happen
// and a Confirm button, and changes nothing; the button's POST, or
// POST /v1/confirmations/{token} for machines, calls Confirm.
//
// # States
//
//	CreateTx ─▶ pending ──Confirm──▶ confirmed (the signal stored, once)
//	               │
//	               ├──Revoke──▶ revoked
//	               └──ExpiresAt passes (compute_now())──▶ expired
//
// # Invariants
//
//   - The token is 256 random bits (crypto/rand), returned once by CreateTx
//     and stored only as its SHA-256: the database, its backups and every
//     operator surface (List, the CLI, the workflows page, metrics) hold no
//     token. A Token formats as "bcc_…" (fmt's %s and %v), so a token passed
//     to a logger or an error by mistake does not leak; string(tok) or
//     tok.URL(base) is the one way to read it.
//   - Confirming stores the signal and marks the binding used in one
//     transaction: a binding is confirmed at most once, and its signal is
//     stored exactly once (also with a dedup key, confirmation:<id>).
//     Concurrent confirmations of one token serialize on its row: one is
//     confirmed, every other one is ErrAlreadyConfirmed. If the signal cannot
//     be stored (the workflow has finished), nothing is written and the
//     binding stays pending.
//   - Revoke and Confirm of one binding serialize on its row: exactly one
//     wins; the loser sees ErrAlreadyConfirmed (Revoke) or ErrNotValid
//     (Confirm).
//   - An unknown, expired or revoked token is ErrNotValid, the same error
//     (NOT_FOUND) by the same path (one index lookup, one row): nothing tells
//     whether a token exists. Only its holder learns that it was used
//     (ErrAlreadyConfirmed).
//   - No error, log line, span or metric of this package or of serve's
//     confirmation routes holds a token.
//   - A binding is made only for a workflow that exists, is not finished and
//     declares the signal (NOT_FOUND, CONFLICT, INVALID_ARGUMENT otherwise,
//     nothing written), and goes with its workflow (retention deletes both).
package confirmation
