package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/cmd/better-compute/cli"
	"github.com/bettercompute/bettercompute/cmd/better-compute/cli/clitest"
	"github.com/bettercompute/bettercompute/domain/workflow"
	"github.com/bettercompute/bettercompute/domain/workflow/confirmation"
	"github.com/bettercompute/bettercompute/platform/clock"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/pgtest"
	"github.com/bettercompute/bettercompute/workers/workertest"
)

// publicServe is a running `serve` (or `dev`) of wfApp with its public listener.
type publicServe struct {
	op, pub        string // the operator's and the public listener's base URLs
	stdout, stderr *clitest.Buffer
}

// startPublic runs command (serve, or dev --trace) of wfApp on environ with a
// public listener on a free port, until the test ends.
func startPublic(t *testing.T, environ []string, command ...string) *publicServe {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := &publicServe{stdout: &clitest.Buffer{}, stderr: &clitest.Buffer{}}
	env := append(slices.Clip(environ), "BETTER_COMPUTE_LISTEN=127.0.0.1:0", "BETTER_COMPUTE_PUBLIC_LISTEN=127.0.0.1:0")
	code := make(chan int, 1)
	go func() {
		code <- cli.Run(ctx, wfApp(), command, cli.Env{Stdout: p.stdout, Stderr: p.stderr, Environ: env})
	}()
	t.Cleanup(func() {
		cancel()
		<-code
		if t.Failed() {
			t.Logf("stderr:\n%s", p.stderr.String())
		}
	})
	workertest.WaitFor(t, 60*time.Second, "serve's URLs", func() bool {
		out := p.stdout.String()
		_, op, ok1 := strings.Cut(out, "River UI: ")
		_, pub, ok2 := strings.Cut(out, "Confirmation links: ")
		if ok1 && ok2 {
			p.op = strings.Fields(op)[0]
			p.pub = strings.TrimSuffix(strings.Fields(pub)[0], "confirm/…")
			return true
		}
		select {
		case c := <-code:
			t.Fatalf("serve exited (%d): %s", c, p.stderr.String())
		default:
		}
		return false
	})
	return p
}

type httpAnswer struct {
	status int
	header http.Header
	body   string
	took   time.Duration
}

// do sends method url with body and headers (name, value pairs).
func do(t *testing.T, method, url, body string, headers ...string) httpAnswer {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return httpAnswer{status: resp.StatusCode, header: resp.Header, body: string(b), took: time.Since(start)}
}

func codeOf(t *testing.T, a httpAnswer) string {
	t.Helper()
	var v struct {
		Code string `json:"code"`
	}
	require.NoError(t, json.Unmarshal([]byte(a.body), &v), a.body)
	return v.Code
}

// awaitingOrder starts a wfcli_order that waits for "paid" and a binding for
// it; it returns the workflow's id and the token.
func awaitingOrder(t *testing.T, db *pgtest.DB, order string, ttl time.Duration) (string, confirmation.Token) {
	t.Helper()
	var id string
	var tok confirmation.Token
	require.NoError(t, pg.InTx(context.Background(), db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		id, err = wfOrder().StartTx(ctx, tx, wfOrderIn{Order: order, AwaitPaid: true}, nil)
		if err != nil {
			return err
		}
		tok, _, err = confirmation.CreateTx(ctx, tx, id, "paid", &confirmation.CreateOpts{Payload: map[string]int{"amount": 30}, TTL: ttl})
		return err
	}))
	return id, tok
}

func signalCount(t *testing.T, db *pgtest.DB, id string) int {
	t.Helper()
	return db.MustCount(t, `SELECT count(*) FROM compute_workflow_signals WHERE workflow_id = $1`, id)
}

// TestConfirmLink200ConcurrentPosts: 200 POSTs of one link at once: one
// signal, one 200 and 199 ALREADY_CONFIRMED; the workflow resumes once.
func TestConfirmLink200ConcurrentPosts(t *testing.T) {
	t.Parallel()
	db, env := wfEnv(t)
	s := startPublic(t, env, "serve")
	wfWorker(t, db)
	id, tok := awaitingOrder(t, db, "o-200", time.Hour)
	wfWait(t, db, id, workflow.Waiting)

	const n = 200
	answers := make(chan httpAnswer, n)
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			<-gate
			answers <- do(t, http.MethodPost, s.pub+"v1/confirmations/"+string(tok), "")
		})
	}
	close(gate)
	wg.Wait()
	close(answers)
	counts := map[string]int{}
	for a := range answers {
		switch a.status {
		case http.StatusOK:
			require.JSONEq(t, fmt.Sprintf(`{"outcome":"confirmed","workflow_id":%q,"signal":"paid"}`, id), a.body)
			counts["confirmed"]++
		case http.StatusConflict:
			counts[codeOf(t, a)]++
		default:
			t.Fatalf("status %d: %s", a.status, a.body)
		}
	}
	require.Equal(t, map[string]int{"confirmed": 1, "ALREADY_CONFIRMED": n - 1}, counts)
	require.Equal(t, 1, signalCount(t, db, id))
	wfWait(t, db, id, workflow.Completed)
	steps := 0
	for _, h := range wfHistory(t, db, id) {
		if h.Step == "confirm" {
			steps++
		}
	}
	require.Equal(t, 1, steps, "the confirm step ran once")
}

// TestConfirmLinkGETNeverConfirms: the page shows what will happen, any
// number of times, and changes nothing; its form's POST confirms.
func TestConfirmLinkGETNeverConfirms(t *testing.T) {
	t.Parallel()
	db, env := wfEnv(t)
	s := startPublic(t, env, "serve")
	id, tok := awaitingOrder(t, db, "o-get", time.Hour)
	link := s.pub + "confirm/" + string(tok)
	for range 3 {
		a := do(t, http.MethodGet, link, "")
		require.Equal(t, http.StatusOK, a.status, a.body)
		require.Contains(t, a.body, `<button type="submit" id="confirm">Confirm</button>`)
		require.Contains(t, a.body, id)
		require.Contains(t, a.body, "paid")
		require.Contains(t, a.body, `&#34;amount&#34;: 30`)
		require.Equal(t, "no-referrer", a.header.Get("Referrer-Policy"))
		require.Equal(t, "DENY", a.header.Get("X-Frame-Options"))
		require.Equal(t, "no-store", a.header.Get("Cache-Control"))
		require.Contains(t, a.header.Get("Content-Security-Policy"), "frame-ancestors 'none'")
	}
	require.Equal(t, http.StatusOK, do(t, http.MethodHead, link, "").status)
	require.Equal(t, 0, signalCount(t, db, id), "a GET stored a signal")
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM compute_confirmations WHERE used_at IS NULL`))

	a := do(t, http.MethodPost, link, "", "Content-Type", "application/x-www-form-urlencoded")
	require.Equal(t, http.StatusOK, a.status, a.body)
	require.Contains(t, a.body, "Confirmed")
	require.Equal(t, 1, signalCount(t, db, id))
	a = do(t, http.MethodGet, link, "")
	require.Equal(t, http.StatusConflict, a.status)
	require.Contains(t, a.body, "Already confirmed")
	require.NotContains(t, a.body, `id="confirm"`)
}

// TestConfirmLinkUnknownAndExpiredLookAlike: an expired token (on the sim
// clock) and one that never existed get the same status, body and headers,
// in the same time, on each route.
func TestConfirmLinkUnknownAndExpiredLookAlike(t *testing.T) {
	t.Parallel()
	db, env := wfEnv(t)
	ctx := context.Background()
	require.NoError(t, clock.UseSim(ctx, db.Pool, time.Date(2031, 3, 1, 12, 0, 0, 0, time.UTC)))
	s := startPublic(t, append(env, "BETTER_COMPUTE_PUBLIC_CLIENT_IP_HEADER=X-Client"), "serve")
	_, expired := awaitingOrder(t, db, "o-exp", time.Hour)
	unk, unknown := awaitingOrder(t, db, "o-unk", time.Hour)
	db.MustExec(t, `DELETE FROM compute_confirmations WHERE workflow_id = $1`, unk)
	require.Equal(t, http.StatusOK, do(t, http.MethodGet, s.pub+"confirm/"+string(expired), "").status, "pending before the sim clock moves")
	_, err := clock.Advance(ctx, db.Pool, time.Hour)
	require.NoError(t, err)

	type probe struct{ method, path string }
	probes := []probe{{http.MethodGet, "confirm/"}, {http.MethodPost, "confirm/"}, {http.MethodPost, "v1/confirmations/"}}
	took := map[string][]time.Duration{}
	client := 0
	for round := range 8 {
		for _, p := range probes {
			var got [2]httpAnswer
			for i, tok := range []confirmation.Token{expired, unknown} {
				if round%2 == 1 {
					tok = []confirmation.Token{unknown, expired}[i] // alternate which goes first
				}
				client++ // each its own client: the limiter is another test's
				a := do(t, p.method, s.pub+p.path+string(tok), "", "X-Client", fmt.Sprintf("10.9.%d.%d", client/250, client%250))
				which := "expired"
				if tok == unknown {
					which = "unknown"
				}
				took[which] = append(took[which], a.took)
				got[i] = a
			}
			require.Equal(t, http.StatusNotFound, got[0].status, got[0].body)
			require.Equal(t, got[0].status, got[1].status)
			require.Equal(t, got[0].body, got[1].body, "%s %s", p.method, p.path)
			h0, h1 := got[0].header.Clone(), got[1].header.Clone()
			h0.Del("Date")
			h1.Del("Date")
			require.Equal(t, h0, h1)
		}
	}
	median := func(d []time.Duration) time.Duration {
		slices.Sort(d)
		return d[len(d)/2]
	}
	me, mu := median(took["expired"]), median(took["unknown"])
	t.Logf("median time to refuse: expired %s, unknown %s", me, mu)
	// Both wait out the refusal floor (50ms), which hides the database's
	// lookups (a millisecond or so), so neither median stands apart.
	require.GreaterOrEqual(t, me, 50*time.Millisecond)
	require.GreaterOrEqual(t, mu, 50*time.Millisecond)
	require.Less(t, (me - mu).Abs(), 25*time.Millisecond)
}

// TestConfirmLinkRateLimitsGuesses: a client's 21st refusal in a row is 429
// with Retry-After, for any token, until its allowance refills; another
// client is not affected; confirmations and "already confirmed" cost nothing.
func TestConfirmLinkRateLimitsGuesses(t *testing.T) {
	t.Parallel()
	db, env := wfEnv(t)
	s := startPublic(t, append(env, "BETTER_COMPUTE_PUBLIC_CLIENT_IP_HEADER=X-Client"), "serve")
	idA, tokA := awaitingOrder(t, db, "o-rl-a", time.Hour)
	idB, tokB := awaitingOrder(t, db, "o-rl-b", time.Hour)
	goneID, gone := awaitingOrder(t, db, "o-rl-gone", time.Hour)
	db.MustExec(t, `DELETE FROM compute_confirmations WHERE workflow_id = $1`, goneID)

	// Its own confirmations, repeated, are never limited.
	for range 30 {
		a := do(t, http.MethodPost, s.pub+"v1/confirmations/"+string(tokB), "", "X-Client", "10.1.1.1")
		require.Contains(t, []int{http.StatusOK, http.StatusConflict}, a.status, a.body)
	}
	for i := range 20 {
		path := "v1/confirmations/" + string(gone)
		if i%4 == 0 {
			path = "v1/confirmations/bcc_short" // malformed: a guess too
		}
		a := do(t, http.MethodPost, s.pub+path, "", "X-Client", "10.1.1.1")
		require.Contains(t, []int{http.StatusNotFound, http.StatusBadRequest}, a.status, "guess %d %s: %s", i, path, a.body)
	}
	a := do(t, http.MethodPost, s.pub+"v1/confirmations/"+string(tokA), "", "X-Client", "10.1.1.1")
	require.Equal(t, http.StatusTooManyRequests, a.status, a.body)
	require.Equal(t, "RATE_LIMITED", codeOf(t, a))
	require.NotEmpty(t, a.header.Get("Retry-After"))
	a = do(t, http.MethodGet, s.pub+"confirm/"+string(tokA), "", "X-Client", "10.1.1.1")
	require.Equal(t, http.StatusTooManyRequests, a.status)
	require.Equal(t, 0, signalCount(t, db, idA), "a limited client confirmed")

	a = do(t, http.MethodPost, s.pub+"v1/confirmations/"+string(tokA), "", "X-Client", "10.1.1.2")
	require.Equal(t, http.StatusOK, a.status, "another client: %s", a.body)
	require.Equal(t, 1, signalCount(t, db, idA))
	require.Equal(t, 1, signalCount(t, db, idB))
}

// TestConfirmLinkBadInput: a malformed token, an oversize body, a wrong
// method: each its status and stable code, nothing changed.
func TestConfirmLinkBadInput(t *testing.T) {
	t.Parallel()
	db, env := wfEnv(t)
	s := startPublic(t, env, "serve")
	id, tok := awaitingOrder(t, db, "o-bad", time.Hour)
	for _, c := range []struct {
		method, path, body string
		status             int
		code               string
	}{
		{http.MethodPost, "v1/confirmations/" + string(tok)[:20], "", http.StatusBadRequest, "INVALID_ARGUMENT"},
		{http.MethodPost, "v1/confirmations/" + string(tok) + "x", "", http.StatusBadRequest, "INVALID_ARGUMENT"},
		{http.MethodPost, "v1/confirmations/" + strings.Replace(string(tok), "bcc_", "xyz_", 1), "", http.StatusBadRequest, "INVALID_ARGUMENT"},
		{http.MethodPost, "v1/confirmations/" + string(tok), strings.Repeat("x", 5000), http.StatusRequestEntityTooLarge, "PAYLOAD_TOO_LARGE"},
		{http.MethodPost, "confirm/" + string(tok), strings.Repeat("x", 5000), http.StatusRequestEntityTooLarge, ""},
		{http.MethodPut, "v1/confirmations/" + string(tok), "", http.StatusMethodNotAllowed, "METHOD_NOT_ALLOWED"},
		{http.MethodGet, "v1/confirmations/" + string(tok), "", http.StatusMethodNotAllowed, "METHOD_NOT_ALLOWED"},
		{http.MethodDelete, "confirm/" + string(tok), "", http.StatusMethodNotAllowed, "METHOD_NOT_ALLOWED"},
	} {
		a := do(t, c.method, s.pub+c.path, c.body)
		require.Equal(t, c.status, a.status, "%s %s: %s", c.method, c.path, a.body)
		if c.code != "" {
			require.Equal(t, c.code, codeOf(t, a), "%s %s", c.method, c.path)
		}
		if c.status == http.StatusMethodNotAllowed {
			require.NotEmpty(t, a.header.Get("Allow"))
		}
		require.NotContains(t, a.body, string(tok)[4:], "an answer repeats the token")
	}
	require.Equal(t, 0, signalCount(t, db, id))
	require.Equal(t, 1, db.MustCount(t, `SELECT count(*) FROM compute_confirmations WHERE used_at IS NULL AND revoked_at IS NULL`))
}

// TestPublicListenerServesNoOperatorRoute: the public listener answers 404
// to every operator path (River UI, its API, probes, metrics, the workflows
// pages, the JSON API, the event stream), and the operator's listener does
// not confirm.
func TestPublicListenerServesNoOperatorRoute(t *testing.T) {
	t.Parallel()
	db, env := wfEnv(t)
	s := startPublic(t, env, "serve")
	id, tok := awaitingOrder(t, db, "o-routes", time.Hour)
	for _, path := range []string{"", "healthz", "readyz", "metrics", "api/jobs", "api/queues", "assets/index.js",
		"workflows", "workflows/" + id, "v1/workflows", "v1/workflows/" + id, "v1/events", "v1/events/stream",
		"v1/tenants", "v1/confirmations", "confirm", "confirm/", "index.html", "jobs"} {
		for _, m := range []string{http.MethodGet, http.MethodPost} {
			a := do(t, m, s.pub+path, "")
			require.Equal(t, http.StatusNotFound, a.status, "%s /%s on the public listener: %s", m, path, a.body)
			require.Equal(t, "NOT_FOUND", codeOf(t, a))
		}
	}
	// The operator's listener: the public routes are not there.
	a := do(t, http.MethodPost, s.op+"v1/confirmations/"+string(tok), "")
	require.NotEqual(t, http.StatusOK, a.status)
	a = do(t, http.MethodPost, s.op+"confirm/"+string(tok), "")
	require.NotEqual(t, http.StatusOK, a.status)
	require.Equal(t, 0, signalCount(t, db, id))
	// The public listener is up and answers its own route.
	require.Equal(t, http.StatusOK, do(t, http.MethodGet, s.pub+"confirm/"+string(tok), "").status)
}

// TestConfirmationTokenNeverLeaks: dev --trace at debug level, a link shown,
// confirmed (page and API), repeated, refused, mangled; then the token is in
// no log line, no span (printed to stderr), no metric and no row of any
// table (stored errors, signals, jobs, events: the database holds its hash).
func TestConfirmationTokenNeverLeaks(t *testing.T) {
	t.Parallel()
	db, env := wfEnv(t)
	s := startPublic(t, append(env, "BETTER_COMPUTE_LOG_LEVEL=debug", "BETTER_COMPUTE_POLL_INTERVAL=20ms"), "dev", "--trace")
	id, tok := awaitingOrder(t, db, "o-leak", time.Hour)
	id2, tok2 := awaitingOrder(t, db, "o-leak2", time.Hour)
	secrets := []string{string(tok)[4:], string(tok2)[4:]}

	require.Equal(t, http.StatusOK, do(t, http.MethodGet, s.pub+"confirm/"+string(tok), "").status)
	require.Equal(t, http.StatusOK, do(t, http.MethodPost, s.pub+"confirm/"+string(tok), "").status)
	require.Equal(t, http.StatusConflict, do(t, http.MethodPost, s.pub+"v1/confirmations/"+string(tok), "").status)
	require.Equal(t, http.StatusBadRequest, do(t, http.MethodPost, s.pub+"v1/confirmations/"+string(tok)+"x", "").status)
	require.Equal(t, http.StatusBadRequest, do(t, http.MethodGet, s.pub+"confirm/"+string(tok2)+"%00", "").status)
	require.Equal(t, http.StatusRequestEntityTooLarge, do(t, http.MethodPost, s.pub+"v1/confirmations/"+string(tok2), strings.Repeat("y", 9000)).status)
	// tok2's workflow finishes before its link is used: CONFLICT, a stored
	// error nowhere, but the workflow's own failure is.
	require.NoError(t, pg.InTx(context.Background(), db.Pool, func(ctx context.Context, tx pgx.Tx) error {
		return workflow.CancelTx(ctx, tx, id2, "cancelled to refuse its link")
	}))
	require.Equal(t, http.StatusConflict, do(t, http.MethodPost, s.pub+"v1/confirmations/"+string(tok2), "").status)
	wfWait(t, db, id, workflow.Completed)

	metrics := do(t, http.MethodGet, s.op+"metrics", "")
	require.Equal(t, http.StatusOK, metrics.status)
	require.Contains(t, metrics.body, `bettercompute_confirmation_requests_total{outcome="confirmed",route="confirm"} 1`)
	require.Contains(t, metrics.body, `bettercompute_confirmations{state="confirmed"} 1`)
	require.Contains(t, metrics.body, `bettercompute_confirmations{state="pending"} 1`) // tok2's: its workflow ended first
	workertest.WaitFor(t, 30*time.Second, "the confirmation's span and log line", func() bool {
		e := s.stderr.String()
		return strings.Contains(e, "span confirmation.confirm ") && strings.Contains(e, "confirmation: confirmed")
	})

	var rows []string
	tables, err := db.Query(context.Background(), `SELECT format('%I.%I', table_schema, table_name) FROM information_schema.tables
		WHERE table_schema = 'public' AND table_type = 'BASE TABLE'`)
	require.NoError(t, err)
	names, err := pgx.CollectRows(tables, pgx.RowTo[string])
	require.NoError(t, err)
	require.Greater(t, len(names), 20)
	for _, n := range names {
		r, err := db.Query(context.Background(), `SELECT t::text FROM `+n+` t`)
		require.NoError(t, err, n)
		texts, err := pgx.CollectRows(r, pgx.RowTo[string])
		require.NoError(t, err, n)
		for _, x := range texts {
			rows = append(rows, n+": "+x)
		}
	}
	for _, secret := range secrets {
		for what, text := range map[string]string{"stderr (logs and spans)": s.stderr.String(), "stdout": s.stdout.String(), "metrics": metrics.body} {
			require.NotContains(t, text, secret, "the token is in %s", what)
		}
		for _, r := range rows {
			require.NotContains(t, r, secret, "the token is stored")
		}
	}
}

// TestConfirmLinksBehindPgBouncer: serve on a real PgBouncer in transaction
// mode: 50 POSTs of one link at once store one signal, a GET changes
// nothing, a revoked link is refused, and the workflow resumes.
func TestConfirmLinksBehindPgBouncer(t *testing.T) {
	t.Parallel()
	db, _ := wfEnv(t)
	via := pgtest.PgBouncer(t, db)
	s := startPublic(t, []string{"BETTER_COMPUTE_DATABASE_URL=" + via, "BETTER_COMPUTE_LOG_LEVEL=warn"}, "serve")
	wfWorker(t, db)
	id, tok := awaitingOrder(t, db, "o-bouncer", time.Hour)
	revokedID, revoked := awaitingOrder(t, db, "o-bouncer-revoked", time.Hour)
	_, err := confirmation.Revoke(context.Background(), db.Pool, int64(db.MustCount(t, `SELECT id FROM compute_confirmations WHERE workflow_id = $1`, revokedID)))
	require.NoError(t, err)

	require.Equal(t, http.StatusOK, do(t, http.MethodGet, s.pub+"confirm/"+string(tok), "").status)
	require.Equal(t, 0, signalCount(t, db, id))
	statuses := make(chan int, 50)
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() { statuses <- do(t, http.MethodPost, s.pub+"v1/confirmations/"+string(tok), "").status })
	}
	wg.Wait()
	close(statuses)
	counts := map[int]int{}
	for st := range statuses {
		counts[st]++
	}
	require.Equal(t, map[int]int{http.StatusOK: 1, http.StatusConflict: 49}, counts)
	require.Equal(t, 1, signalCount(t, db, id))
	require.Equal(t, http.StatusNotFound, do(t, http.MethodPost, s.pub+"v1/confirmations/"+string(revoked), "").status)
	require.Equal(t, 0, signalCount(t, db, revokedID))
	wfWait(t, db, id, workflow.Completed)
}
