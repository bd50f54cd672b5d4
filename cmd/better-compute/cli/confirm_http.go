package cli

import (
	"embed"
	"encoding/json"
	"errors"
	"html/template"
	"io"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/bettercompute/bettercompute/domain/workflow/confirmation"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/tracing"
	"github.com/bettercompute/bettercompute/platform/web"
)

// The confirmation links, on the public listener:
//
//	GET  /confirm/{token}           a page: what confirming does, and a Confirm button; changes nothing
//	POST /confirm/{token}           the button: confirms, and answers with a page
//	POST /v1/confirmations/{token}  the same for machines, in JSON
//
// Outcomes, with their HTTP status and stable code (JSON: {"code", "message"}):
//
//	confirmed          200  (JSON: {"outcome": "confirmed", "workflow_id", "signal"})
//	already confirmed  409  ALREADY_CONFIRMED
//	unknown, expired
//	or revoked         404  NOT_FOUND: one answer, after the same work, no sooner than refusalFloor
//	malformed token    400  INVALID_ARGUMENT (also no sooner than refusalFloor)
//	workflow finished  409  CONFLICT (nothing written: the link stays pending)
//	body too large     413  PAYLOAD_TOO_LARGE
//	other method       405  METHOD_NOT_ALLOWED, with Allow
//	too many guesses   429  RATE_LIMITED, with Retry-After
//	database down      503  UNAVAILABLE
//
// A refusal (404, 400) is a guess: each client may make guessBurst of them at
// once, then one per guessEvery; past that, every request of the client is
// 429 until its allowance refills. A confirmation or an "already confirmed"
// costs nothing. No log line, span, metric or error holds a token: the path
// is never logged, and spans and lines name the binding by its id.

const (
	// maxConfirmBody is the largest request body the routes read: they need
	// none (the form posts one field).
	maxConfirmBody = 4 << 10
	// refusalFloor is the least time a refusal takes, so that an unknown and
	// an expired token take the same time to refuse, whatever the database's
	// index and heap lookups took; it also slows guessing.
	refusalFloor = 50 * time.Millisecond
	// guessBurst and guessEvery are each client's allowance of refusals.
	guessBurst = 20
	guessEvery = 3 * time.Second
	// maxGuessClients bounds the clients the limiter tracks; past it, those
	// whose allowance has refilled are forgotten.
	maxGuessClients = 100_000
)

//go:embed confirm_templates/*.html
var confirmTemplateFS embed.FS

var confirmTemplates = template.Must(template.New("").Funcs(template.FuncMap{
	"when": func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04 UTC") },
}).ParseFS(confirmTemplateFS, "confirm_templates/*.html"))

// confirmHandler serves the confirmation routes.
type confirmHandler struct {
	db       *pg.Pool
	log      zerolog.Logger
	tracer   trace.TracerProvider // nil: no spans
	ipHeader string               // BETTER_COMPUTE_PUBLIC_CLIENT_IP_HEADER
	limiter  *guessLimiter
	floor    time.Duration
	outcomes *prometheus.CounterVec
}

// confirmationOutcomes counts the routes' answers by route and outcome (no
// token, no binding: bounded labels).
func newConfirmationOutcomes() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "bettercompute_confirmation_requests_total",
		Help: "Requests to the confirmation links on the public listener, by route (page, confirm, api) and outcome.",
	}, []string{"route", "outcome"})
}

// routes are the handler's routes, for the public listener. They take every
// method: a wrong one is answered here, in JSON (405 METHOD_NOT_ALLOWED).
func (h *confirmHandler) routes() []web.Route {
	return []web.Route{
		{Pattern: "/confirm/{token}", Handler: http.HandlerFunc(h.page)},
		{Pattern: "/v1/confirmations/{token}", Handler: http.HandlerFunc(h.api)},
	}
}

// answer is one outcome: its HTTP status, stable code and message.
type answer struct {
	status  int
	code    string
	message string
	outcome string // the metric's label
	b       *confirmation.Binding
	retry   time.Duration // 429: Retry-After
}

var (
	answerTooLarge = answer{status: http.StatusRequestEntityTooLarge, code: "PAYLOAD_TOO_LARGE",
		message: "the request body is too large: these routes take none", outcome: "too_large"}
	answerMalformed = answer{status: http.StatusBadRequest, code: string(fault.InvalidArgument),
		message: "this is not a confirmation link: check that it was copied whole", outcome: "malformed"}
	answerNotValid = answer{status: http.StatusNotFound, code: string(fault.NotFound),
		message: "this confirmation link is not valid: it may have expired or been withdrawn", outcome: "not_valid"}
	answerUnavailable = answer{status: http.StatusServiceUnavailable, code: string(fault.Unavailable),
		message: "confirmations cannot be taken right now: try again in a minute", outcome: "error"}
)

// page serves /confirm/{token}: GET (and HEAD) shows the page, POST confirms.
func (h *confirmHandler) page(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		a := h.do(r, "page", false)
		h.render(w, r, a, true)
	case http.MethodPost:
		a := h.do(r, "confirm", true)
		h.render(w, r, a, false)
	default:
		h.methodNotAllowed(w, "page", "GET, HEAD, POST")
	}
}

// api serves POST /v1/confirmations/{token}.
func (h *confirmHandler) api(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		h.methodNotAllowed(w, "api", "POST")
		return
	}
	a := h.do(r, "api", true)
	if a.retry > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(a.retry.Seconds()))))
	}
	if a.status == http.StatusOK {
		writeAPIJSON(w, http.StatusOK, map[string]any{"outcome": "confirmed", "workflow_id": a.b.WorkflowID, "signal": a.b.Signal})
		return
	}
	writeAPIJSON(w, a.status, map[string]string{"code": a.code, "message": a.message})
}

func (h *confirmHandler) methodNotAllowed(w http.ResponseWriter, route, allow string) {
	h.outcomes.WithLabelValues(route, "bad_method").Inc()
	w.Header().Set("Allow", allow)
	writeAPIJSON(w, http.StatusMethodNotAllowed, map[string]string{"code": "METHOD_NOT_ALLOWED", "message": "use " + allow})
}

// do reads the request, checks the client's allowance and the token, and
// peeks (a GET) or confirms (a POST).
func (h *confirmHandler) do(r *http.Request, route string, confirm bool) (a answer) {
	start := time.Now()
	ctx, span := tracing.Start(r.Context(), h.tracer, "confirmation."+route, nil,
		trace.WithSpanKind(trace.SpanKindServer))
	defer func() {
		h.outcomes.WithLabelValues(route, a.outcome).Inc()
		span.SetAttributes(attribute.String("bettercompute.confirmation.outcome", a.outcome))
		if a.b != nil {
			span.SetAttributes(attribute.Int64("bettercompute.confirmation.id", a.b.ID),
				attribute.String("bettercompute.workflow.id", a.b.WorkflowID))
		}
		span.End()
	}()
	client := h.client(r)
	if wait := h.limiter.wait(client, start); wait > 0 {
		h.log.Debug().Str("client", client).Msg("confirmation: too many refused tokens from this client")
		return answer{status: http.StatusTooManyRequests, code: "RATE_LIMITED",
			message: "too many invalid links from your address: try again later", outcome: "rate_limited", retry: wait}
	}
	if _, err := io.Copy(io.Discard, http.MaxBytesReader(nil, r.Body, maxConfirmBody)); err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return answerTooLarge
		}
		return answer{status: http.StatusBadRequest, code: string(fault.InvalidArgument), message: "the request body could not be read", outcome: "bad_body"}
	}
	refuse := func(a answer) answer {
		h.limiter.fail(client, start)
		if d := time.Until(start.Add(h.floor)); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
		}
		return a
	}
	token := r.PathValue("token")
	if err := confirmation.CheckToken(token); err != nil {
		return refuse(answerMalformed)
	}
	var b *confirmation.Binding
	var err error
	if confirm {
		b, err = confirmation.Confirm(ctx, h.db, token)
	} else {
		b, err = confirmation.Peek(ctx, h.db, token)
	}
	switch {
	case err == nil && confirm:
		h.log.Info().Int64("confirmation", b.ID).Str("workflow", b.WorkflowID).Str("signal", b.Signal).Msg("confirmation: confirmed, signal delivered")
		return answer{status: http.StatusOK, outcome: "confirmed", b: b}
	case err == nil:
		return answer{status: http.StatusOK, outcome: "shown", b: b}
	case errors.Is(err, confirmation.ErrAlreadyConfirmed):
		return answer{status: http.StatusConflict, code: "ALREADY_CONFIRMED",
			message: "this link was already used: its confirmation counted once", outcome: "already_confirmed", b: b}
	case errors.Is(err, confirmation.ErrNotValid):
		return refuse(answerNotValid)
	case fault.Has(err, fault.Conflict), fault.Has(err, fault.InvalidArgument):
		// The token was good; its signal cannot be stored: the workflow has
		// ended, or (INVALID_ARGUMENT) its kind no longer declares the signal.
		h.log.Info().Err(err).Msg("confirmation: refused, its workflow takes no more signals")
		return answer{status: http.StatusConflict, code: string(fault.Conflict),
			message: "this confirmation is no longer needed: what it confirms has ended", outcome: "conflict"}
	}
	if ctx.Err() == nil {
		h.log.Error().Err(err).Msg("confirmation: cannot read or confirm")
	}
	return answerUnavailable
}

// client is the key the limiter counts a request's guesses under: the
// configured header's last entry (the one the proxy added), else the
// connection's address; an IPv6 address by its /64, which one host holds.
func (h *confirmHandler) client(r *http.Request) string {
	addr := ""
	if h.ipHeader != "" {
		if v := r.Header.Values(h.ipHeader); len(v) > 0 {
			last := v[len(v)-1]
			if i := strings.LastIndexByte(last, ','); i >= 0 {
				last = last[i+1:]
			}
			addr = strings.TrimSpace(last)
		}
	}
	if addr == "" {
		addr = r.RemoteAddr
		if host, _, err := net.SplitHostPort(addr); err == nil {
			addr = host
		}
	}
	ip, err := netip.ParseAddr(addr)
	if err != nil {
		if len(addr) > 64 {
			addr = addr[:64]
		}
		return addr
	}
	ip = ip.Unmap()
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.String()
	}
	return ip.String()
}

// render writes a page's answer as HTML; show is a GET's page (a Confirm
// button) rather than the outcome of a POST.
func (h *confirmHandler) render(w http.ResponseWriter, r *http.Request, a answer, show bool) {
	if a.retry > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(a.retry.Seconds()))))
	}
	data := struct {
		Show, Confirmed bool
		Title, Message  string
		Code            string
		B               *confirmation.Binding
		Payload         string
	}{Show: show && a.status == http.StatusOK, Confirmed: !show && a.status == http.StatusOK, Code: a.code, Message: a.message, B: a.b}
	switch {
	case data.Show:
		data.Title = "Confirm?"
		if len(a.b.Payload) > 0 && string(a.b.Payload) != "null" {
			data.Payload = indentJSON(a.b.Payload)
		}
	case data.Confirmed:
		data.Title = "Confirmed"
	case a.code == "ALREADY_CONFIRMED":
		data.Title = "Already confirmed"
	default:
		data.Title = "Not confirmed"
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(a.status)
	if r.Method == http.MethodHead {
		return
	}
	if err := confirmTemplates.ExecuteTemplate(w, "confirm.html", data); err != nil && r.Context().Err() == nil {
		h.log.Warn().Err(err).Msg("confirmation: cannot render the page")
	}
}

func indentJSON(b []byte) string {
	var v any
	if json.Unmarshal(b, &v) != nil {
		return string(b)
	}
	out, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return string(b)
	}
	return string(out)
}

// guessLimiter is a token bucket of refusals per client: guessBurst at
// once, refilled at one per guessEvery. It lives in the serving process:
// several serve processes each allow a client as much.
type guessLimiter struct {
	burst float64
	every time.Duration

	mu      sync.Mutex
	clients map[string]*allowance
}

type allowance struct {
	left float64
	at   time.Time
}

func newGuessLimiter(burst int, every time.Duration) *guessLimiter {
	return &guessLimiter{burst: float64(burst), every: every, clients: map[string]*allowance{}}
}

// refill brings a's allowance to now (under mu).
func (l *guessLimiter) refill(a *allowance, now time.Time) {
	a.left = min(l.burst, a.left+float64(now.Sub(a.at))/float64(l.every))
	a.at = now
}

// wait is how long client must wait before its next request (0: go on).
func (l *guessLimiter) wait(client string, now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	a, ok := l.clients[client]
	if !ok {
		return 0
	}
	l.refill(a, now)
	if a.left >= 1 {
		return 0
	}
	return time.Duration((1 - a.left) * float64(l.every))
}

// fail counts a refusal of client's.
func (l *guessLimiter) fail(client string, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	a, ok := l.clients[client]
	if !ok {
		if len(l.clients) >= maxGuessClients {
			for k, c := range l.clients {
				if l.refill(c, now); c.left >= l.burst {
					delete(l.clients, k)
				}
			}
			for k := range l.clients { // none refilled: forget one at random
				if len(l.clients) < maxGuessClients {
					break
				}
				delete(l.clients, k)
			}
		}
		a = &allowance{left: l.burst, at: now}
		l.clients[client] = a
	}
	l.refill(a, now)
	a.left = max(0, a.left-1)
}
