package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/bettercompute/bettercompute/cmd/better-compute/cli"
	"github.com/bettercompute/bettercompute/domain/outbox"
	"github.com/bettercompute/bettercompute/domain/workflow/confirmation"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/web"
	"github.com/bettercompute/bettercompute/workers"
)

// The workflow demo's mailbox: where the orders' payment links arrive
// (demo_workflow_mailbox, migrations/demo_workflow/0002_mailbox.sql), as the
// emails a real shop would send its customers.
//
//	reserve step ──(its tx)──▶ demo.mail.payment_link event ──demo_mailbox sink──▶ demo_workflow_mailbox
//	demo customer / a person at GET /demo/mailbox ──▶ the link ──▶ confirmation.Confirm ──▶ "paid"
//
// A mail holds its link's token. Nothing here logs it, nor puts it in an
// error: the sink logs the order id, the customer reads it to confirm it, and
// the page shows it to the operator only.

// MailboxSink is the sink that delivers the payment links' emails to
// demo_workflow_mailbox.
const MailboxSink = "demo_mailbox"

// mailboxPageSize is how many mails GET /demo/mailbox lists: the newest.
const mailboxPageSize = 50

// mailboxSink writes each PaymentLinkTopic event into demo_workflow_mailbox,
// in the transaction that moves its cursor: each email arrives once.
func mailboxSink() workers.Sink {
	return workers.Sink{
		Name:   MailboxSink,
		Topics: []string{PaymentLinkTopic},
		HandleTx: func(ctx context.Context, tx pgx.Tx, events []outbox.Event) error {
			return deliverMail(ctx, tx, workers.RuntimeFrom(ctx).Log(), events)
		},
	}
}

// deliverMail puts each payment link's email into its customer's inbox (one
// per order: a repeat changes nothing). It logs the order, never the token;
// an event that is no payment link is logged by its id and skipped, not
// retried forever.
func deliverMail(ctx context.Context, tx pgx.Tx, log zerolog.Logger, events []outbox.Event) error {
	for _, e := range events {
		var m PaymentLink
		// Neither json's error nor the payload is logged: the payload holds the
		// token.
		if json.Unmarshal(e.Payload, &m) != nil || m.OrderID == 0 || confirmation.CheckToken(m.Token) != nil {
			log.Warn().Str("event", e.ID.String()).Str("topic", e.Topic).
				Msg("workflow demo mailbox: the event is no payment link; skipped")
			continue
		}
		tag, err := tx.Exec(ctx, `INSERT INTO demo_workflow_mailbox (customer, order_id, amount, link_token)
			VALUES ($1, $2, $3, $4) ON CONFLICT (order_id) DO NOTHING`, e.Key, m.OrderID, m.Amount, m.Token)
		if err != nil {
			// A PgError's text is its message and code: no row's values.
			return fmt.Errorf("workflow demo mailbox: error mailing order %d's payment link: %w", m.OrderID, err)
		}
		log.Info().Int64("order", m.OrderID).Str("customer", e.Key).Int("amount", m.Amount).
			Bool("repeat", tag.RowsAffected() == 0).Msg("workflow demo mailbox: payment link mailed")
	}
	return nil
}

// errNoMail is an order whose payment link is not in its customer's inbox
// yet: the sink delivers it shortly after the reserve step commits.
var errNoMail = errors.New("the order's payment link has not arrived in the mailbox yet")

// readMail returns order orderID's payment link from its customer's inbox:
// its token and amount (errNoMail when it has not arrived).
func readMail(ctx context.Context, db pg.DBTX, orderID int64) (confirmation.Token, int, error) {
	var (
		tok    string
		amount int
	)
	err := db.QueryRow(ctx, `SELECT link_token, amount FROM demo_workflow_mailbox WHERE order_id = $1`, orderID).Scan(&tok, &amount)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", 0, errNoMail
	}
	if err != nil {
		return "", 0, fmt.Errorf("error reading order %d's mail: %w", orderID, err)
	}
	return confirmation.Token(tok), amount, nil
}

// mailboxRoutes is the demo's inbox viewer, GET /demo/mailbox: the newest
// mails, each with its payment link under the public listener's URL
// (Session.PublicBase), so a person running dev can click one and pay an
// order as its customer would.
//
// The page shows secrets (the links' tokens), as an email client shows the
// mails it holds: it is an operator route, on the operator listener with River
// UI, behind its loopback address or its credentials, never a public route.
//
// The base is read once, here: serve starts the public listener before it
// mounts the operator's routes, so it is the address that listener took (dev's
// 127.0.0.1:8081, or a free port if that one was taken), unless
// BETTER_COMPUTE_PUBLIC_URL says otherwise.
func mailboxRoutes(s *cli.Session, db *pg.Pool) []web.Route {
	log := s.Log.With().Str("component", "demo_mailbox").Logger()
	return []web.Route{{Pattern: "GET /demo/mailbox", ReadOnly: true, Handler: mailboxPage(db, s.PublicBase(), log)}}
}

// mail is a row of the mailbox page.
type mail struct {
	ID       int64
	Customer string
	OrderID  int64
	Status   string // the order's status now
	Amount   int
	SentAt   time.Time
	Link     string
}

func mailboxPage(db *pg.Pool, base string, log zerolog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rows, err := db.Query(r.Context(), `SELECT m.id, m.customer, m.order_id, coalesce(o.status, ''), m.amount, m.sent_at, m.link_token
			FROM demo_workflow_mailbox m LEFT JOIN demo_workflow_orders o ON o.id = m.order_id
			ORDER BY m.id DESC LIMIT $1`, mailboxPageSize)
		var mails []mail
		if err == nil {
			mails, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (mail, error) {
				var (
					m   mail
					tok string
				)
				err := row.Scan(&m.ID, &m.Customer, &m.OrderID, &m.Status, &m.Amount, &m.SentAt, &tok)
				m.Link = confirmation.Token(tok).URL(base)
				return m, err
			})
		}
		if err != nil {
			log.Warn().Err(err).Msg("the demo mailbox cannot be read")
			http.Error(w, "the mailbox cannot be read; see the server's log", http.StatusServiceUnavailable)
			return
		}
		var buf bytes.Buffer
		if err := mailboxTemplate.Execute(&buf, map[string]any{"Mails": mails, "Limit": mailboxPageSize, "PayWindow": PayWindow}); err != nil {
			log.Error().Err(err).Msg("rendering the demo mailbox")
			http.Error(w, "the mailbox cannot be shown", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Referrer-Policy", "no-referrer")
		_, _ = w.Write(buf.Bytes())
	})
}

var mailboxTemplate = template.Must(template.New("mailbox").Funcs(template.FuncMap{
	"time": func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 UTC") },
}).Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Demo mailbox · Better Compute</title>
<style>
body { font-family: system-ui, sans-serif; margin: 2rem; }
table { border-collapse: collapse; }
th, td { padding: .3rem .8rem; border-bottom: 1px solid #ddd; text-align: left; }
</style></head>
<body>
<h1>Demo mailbox</h1>
<p>The payment links the shop mailed its customers (the newest {{.Limit}}). Each order's link
pays it once, within {{.PayWindow}} of its reservation; open one to pay as the customer would.
These are secrets: this page is on the operator listener only.</p>
{{if .Mails}}<table>
<thead><tr><th>Sent at</th><th>Customer</th><th>Order</th><th>Order status</th><th>Amount</th><th>Payment link</th></tr></thead>
<tbody>
{{range .Mails}}<tr><td>{{time .SentAt}}</td><td>{{.Customer}}</td><td><a href="/workflows/order-{{.OrderID}}">order {{.OrderID}}</a></td><td>{{.Status}}</td><td>{{.Amount}}</td><td><a class="pay" href="{{.Link}}">Pay {{.Amount}}</a></td></tr>
{{end}}</tbody>
</table>{{else}}<p>No mail yet.</p>{{end}}
</body></html>
`))
