package demo

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/cmd/better-compute/cli"
	"github.com/bettercompute/bettercompute/cmd/better-compute/cli/clitest"
	"github.com/bettercompute/bettercompute/domain/outbox"
	"github.com/bettercompute/bettercompute/domain/workflow/confirmation"
	"github.com/bettercompute/bettercompute/platform/config"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/web"
)

// mailboxRoute is the workflow demo module's GET /demo/mailbox, with links
// under base.
func mailboxRoute(t *testing.T, db *pg.Pool, base string) web.Route {
	t.Helper()
	m := demoWorkflowModule()
	require.NotNil(t, m.Routes)
	s := &cli.Session{Config: &config.Config{PublicURL: base}, Log: zerolog.Nop()}
	rs := m.Routes(s, db)
	require.Len(t, rs, 1)
	require.Equal(t, "GET /demo/mailbox", rs[0].Pattern)
	require.True(t, rs[0].ReadOnly, "it changes nothing: served in read-only mode too")
	return rs[0]
}

var payLinkRe = regexp.MustCompile(`<a class="pay" href="([^"]+)">`)

// TestMailboxPageListsPaymentLinks: the operator's view of the mailbox lists
// each order's email with its payment link under the public base URL; the
// link, followed as a person clicking it would (its token confirmed), pays
// the order.
func TestMailboxPageListsPaymentLinks(t *testing.T) {
	t.Parallel()
	db := startOrderDemo(t)
	ctx := context.Background()
	first, second := placeOrder(t, db.Pool, 1), placeOrder(t, db.Pool, 2)
	tok1, _ := waitMail(t, db.Pool, first)
	tok2, _ := waitMail(t, db.Pool, second)

	const base = "https://pay.example.com/shop/"
	route := mailboxRoute(t, db.Pool, base)
	rec := httptest.NewRecorder()
	route.Handler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/demo/mailbox", nil))
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.Equal(t, "text/html; charset=utf-8", rec.Header().Get("Content-Type"))
	require.Equal(t, "no-store", rec.Header().Get("Cache-Control"), "secrets are not cached")
	body := rec.Body.String()
	require.Contains(t, body, "Demo mailbox")
	require.Contains(t, body, "ada")
	var links []string
	for _, m := range payLinkRe.FindAllStringSubmatch(body, -1) {
		links = append(links, m[1])
	}
	// Both mails, under the public base (the orders' workflows reserve in
	// either order, so their mails arrive in either order).
	require.ElementsMatch(t, []string{tok1.URL(base), tok2.URL(base)}, links)
	require.True(t, strings.HasPrefix(links[0], "https://pay.example.com/shop/confirm/bcc_"), links[0])
	require.Contains(t, body, `href="/workflows/order-`+strconv.FormatInt(second, 10)+`"`)

	// The person clicks the second order's link: the public page's Confirm
	// button confirms its token.
	i := slices.Index(links, tok2.URL(base))
	tok := confirmation.Token(strings.TrimPrefix(links[i], base+"confirm/"))
	require.NoError(t, pay(db.Pool, tok))
	out, err := OrderWorkflow.Wait(ctx, db.Pool, OrderWorkflowID(second), 20*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, "confirmed", out.Status)
	require.Equal(t, 2*PricePerDevice, out.Paid)

	// The page now shows that order confirmed.
	rec = httptest.NewRecorder()
	route.Handler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/demo/mailbox", nil))
	require.Equal(t, http.StatusOK, rec.Code)
	require.Regexp(t, `order `+strconv.FormatInt(second, 10)+`</a></td><td>confirmed</td>`, rec.Body.String())
}

// TestMailboxSinkLogsNoToken: the mailbox sink writes each payment link's
// email once (a repeated delivery changes nothing) and logs its order, never
// its token; an event that is no payment link is skipped, logged by its id
// without its payload.
func TestMailboxSinkLogsNoToken(t *testing.T) {
	t.Parallel()
	db := startOrderDemo(t)
	ctx := context.Background()
	tok := confirmation.TokenPrefix + strings.Repeat("Ab3-_", 8) + "xyz"
	require.NoError(t, confirmation.CheckToken(tok))
	good, err := json.Marshal(PaymentLink{OrderID: 4711, Amount: 60, Token: tok})
	require.NoError(t, err)
	bad := json.RawMessage(`{"order_id": 4712, "amount": 30, "token": "` + tok + `x"}`) // not a token's form
	events := []outbox.Event{
		{ID: outbox.Cursor{Txid: 1, Seq: 1}, Topic: PaymentLinkTopic, Key: "grace", Payload: good},
		{ID: outbox.Cursor{Txid: 1, Seq: 2}, Topic: PaymentLinkTopic, Key: "grace", Payload: bad},
	}
	logs := &clitest.Buffer{}
	log := zerolog.New(logs).Level(zerolog.DebugLevel)
	for range 2 { // delivered twice: at least once is the rule for a retried batch
		require.NoError(t, pg.InTx(ctx, db.Pool, func(ctx context.Context, tx pgx.Tx) error {
			return deliverMail(ctx, tx, log, events)
		}))
	}
	var (
		customer string
		amount   int
		stored   string
	)
	require.NoError(t, db.QueryRow(ctx, `SELECT customer, amount, link_token FROM demo_workflow_mailbox WHERE order_id = 4711`).
		Scan(&customer, &amount, &stored))
	require.Equal(t, []any{"grace", 60, tok}, []any{customer, amount, stored})
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM demo_workflow_mailbox`), "one mail, the malformed event skipped")

	out := logs.String()
	require.Contains(t, out, `"order":4711`)
	require.Contains(t, out, "payment link mailed")
	require.Contains(t, out, `"repeat":true`)
	require.Contains(t, out, "is no payment link; skipped")
	require.NotContains(t, out, tok[len(confirmation.TokenPrefix):len(confirmation.TokenPrefix)+20], "a token in the sink's log")
	require.NotContains(t, out, "4712", "the malformed event's payload in the log")
}
