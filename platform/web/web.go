package web

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/rs/zerolog"
	"riverqueue.com/riverui"

	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/logging"
	"github.com/bettercompute/bettercompute/platform/migrate"
	"github.com/bettercompute/bettercompute/platform/pg"
)

// defaultListen is the address serve listens on when none is configured.
const defaultListen = "127.0.0.1:8080"

// streamGrace is how long after shutdown begins the contexts of requests still
// running (event streams) are cancelled.
const streamGrace = time.Second

// readyTimeout bounds one /readyz check.
const readyTimeout = 3 * time.Second

// Options configure a Server.
type Options struct {
	// Listen is the host:port to listen on (default DefaultListen). An address
	// that is not loopback needs User and Password.
	Listen string
	// User and Password, when set, are required (HTTP basic auth) by every
	// request except /healthz. Set both or neither.
	User, Password string
	// ReadOnly refuses every state-changing request: any method but GET, HEAD
	// and OPTIONS to River UI, and every request to a Route that is not ReadOnly.
	ReadOnly bool

	// Pool is the database (required).
	Pool *pg.Pool
	// Client is River UI's River client. Nil: an insert-only client on Pool
	// (it works no queue and runs no maintenance).
	Client *river.Client[pgx.Tx]
	// Migrations are what /readyz checks the ledger against. Nil: /readyz only
	// checks that the database answers.
	Migrations *migrate.Set
	// Metrics is served on /metrics. Nil: no /metrics.
	Metrics prometheus.Gatherer
	// Routes are mounted beside River UI, behind the same guards.
	Routes []Route

	// Log receives the server's own lines (start, stop, refusals at debug) and
	// River UI's. The password is never written to it.
	Log zerolog.Logger
	// ShutdownTimeout bounds Shutdown (default 5 s).
	ShutdownTimeout time.Duration
}

// Route is an HTTP endpoint mounted beside River UI.
type Route struct {
	// Pattern is an http.ServeMux pattern, e.g. "GET /v1/events". Paths under
	// /api and /assets belong to River UI and are refused.
	Pattern string
	// ReadOnly routes change nothing and are served in read-only mode too.
	ReadOnly bool
	// Handler serves the route.
	Handler http.Handler
}

// Server is the HTTP server: a guarded handler and, once Listen ran, a listener.
type Server struct {
	o        Options
	log      zerolog.Logger
	handler  http.Handler
	connURL  string
	userHash [32]byte
	passHash [32]byte
	auth     bool

	uiCancel   context.CancelFunc
	baseCtx    context.Context
	baseCancel context.CancelFunc

	mu     sync.Mutex
	srv    *http.Server
	ln     net.Listener
	served chan struct{}

	shutdownOnce sync.Once
	shutdownErr  error
}

// Start builds the server, listens and serves until ctx is cancelled (then it
// shuts down gracefully) or Shutdown is called. Errors are New's and Listen's.
func Start(ctx context.Context, o Options) (*Server, error) {
	s, err := New(ctx, o)
	if err != nil {
		return nil, err
	}
	if err := s.Listen(); err != nil {
		_ = s.Shutdown(context.Background())
		return nil, err
	}
	go func() {
		select {
		case <-ctx.Done():
			_ = s.Shutdown(context.Background())
		case <-s.served:
		}
	}()
	return s, nil
}

// New checks the options and builds the guarded handler; nothing listens yet.
// River UI's background services run until ctx is cancelled or Shutdown.
//
// It returns INVALID_CONFIG for a listen address that is not loopback when no
// credentials are set (see CheckBind), for only one of User and Password, and
// for a route pattern that is malformed, conflicts with another or lies in
// River UI's paths.
func New(ctx context.Context, o Options) (*Server, error) {
	if o.Pool == nil {
		return nil, fault.New(fault.InvalidConfig, "web: no pool")
	}
	if o.Listen == "" {
		o.Listen = defaultListen
	}
	if o.ShutdownTimeout <= 0 {
		o.ShutdownTimeout = 5 * time.Second
	}
	if (o.User == "") != (o.Password == "") {
		return nil, fault.New(fault.InvalidConfig, "BETTER_COMPUTE_AUTH_USER and BETTER_COMPUTE_AUTH_PASSWORD go together: set both or neither")
	}
	if err := CheckBind(ctx, o.Listen, o.User != ""); err != nil {
		return nil, err
	}
	s := &Server{
		o:       o,
		log:     o.Log.With().Str("component", "web").Logger(),
		connURL: o.Pool.Config().ConnString(),
		auth:    o.User != "",
	}
	if s.auth {
		s.userHash = sha256.Sum256([]byte(o.User))
		s.passHash = sha256.Sum256([]byte(o.Password))
	}
	s.baseCtx, s.baseCancel = context.WithCancel(context.WithoutCancel(ctx))

	client := o.Client
	if client == nil {
		c, err := river.NewClient(riverpgxv5.New(o.Pool.Pool), &river.Config{
			PollOnly: true, // no LISTEN/NOTIFY: PgBouncer in transaction mode
			Logger:   logging.Slog(o.Log.With().Str("component", "river").Logger()),
		})
		if err != nil {
			s.baseCancel()
			return nil, fault.Wrap(fault.InvalidConfig, err, "cannot configure River UI's client")
		}
		client = c
	}
	ui, err := riverui.NewHandler(&riverui.HandlerOpts{
		Endpoints: riverui.NewEndpoints(client, nil),
		Logger:    logging.Slog(o.Log.With().Str("component", "riverui").Logger()),
		Prefix:    "/",
	})
	if err != nil {
		s.baseCancel()
		return nil, fault.Wrap(fault.Internal, err, "cannot build River UI")
	}

	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", healthz)
	mux.HandleFunc("GET /readyz", s.readyz)
	if o.Metrics != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(o.Metrics, promhttp.HandlerOpts{
			ErrorLog:      promLogger{s.log},
			ErrorHandling: promhttp.ContinueOnError,
		}))
	}
	for _, r := range o.Routes {
		h := r.Handler
		if h == nil {
			s.baseCancel()
			return nil, fault.New(fault.InvalidConfig, "route %q has no handler", r.Pattern)
		}
		if o.ReadOnly && !r.ReadOnly {
			h = http.HandlerFunc(refuseReadOnly)
		}
		if err := handle(mux, r.Pattern, h); err != nil {
			s.baseCancel()
			return nil, err
		}
	}
	var uiHandler http.Handler = ui
	if o.ReadOnly {
		uiHandler = readOnlyGuard(ui)
	}
	mux.Handle("/", uiHandler)

	uiCtx, uiCancel := context.WithCancel(ctx)
	if err := ui.Start(uiCtx); err != nil {
		uiCancel()
		s.baseCancel()
		return nil, fault.Wrap(fault.Internal, err, "cannot start River UI")
	}
	s.uiCancel = uiCancel
	s.handler = s.guard(mux)
	return s, nil
}

// handle registers h at pattern, turning ServeMux's panic on a bad or
// conflicting pattern into INVALID_CONFIG.
func handle(mux *http.ServeMux, pattern string, h http.Handler) (err error) {
	path := pattern
	if _, p, ok := strings.Cut(pattern, " "); ok {
		path = strings.TrimSpace(p)
	}
	if i := strings.IndexByte(path, '/'); i > 0 {
		path = path[i:] // host-qualified pattern
	}
	for _, reserved := range []string{"/api", "/assets"} {
		if path == reserved || strings.HasPrefix(path, reserved+"/") {
			return fault.New(fault.InvalidConfig, "route %q: paths under %s belong to River UI", pattern, reserved)
		}
	}
	defer func() {
		if r := recover(); r != nil {
			err = fault.New(fault.InvalidConfig, "route %q: %v", pattern, r)
		}
	}()
	mux.Handle(pattern, h)
	return nil
}

// Handler is the guarded handler of every route (for tests and for mounting in
// another server).
func (s *Server) Handler() http.Handler { return s.handler }

// Listen listens on Options.Listen and serves in the background. It returns
// INVALID_CONFIG when the address cannot be bound, or when the bound address
// turns out not to be loopback without credentials.
func (s *Server) Listen() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil {
		return fault.New(fault.Internal, "web: already listening")
	}
	ln, err := net.Listen("tcp", s.o.Listen)
	if err != nil {
		return fault.Wrap(fault.InvalidConfig, err, "BETTER_COMPUTE_LISTEN=%s: cannot listen", s.o.Listen)
	}
	if tcp, ok := ln.Addr().(*net.TCPAddr); ok && !s.auth && !tcp.IP.IsLoopback() {
		_ = ln.Close()
		return fault.New(fault.InvalidConfig, "BETTER_COMPUTE_LISTEN=%s bound %s, which is not loopback; set BETTER_COMPUTE_AUTH_USER and BETTER_COMPUTE_AUTH_PASSWORD to serve beyond this machine", s.o.Listen, tcp.IP)
	}
	s.ln = ln
	s.served = make(chan struct{})
	s.srv = &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		BaseContext:       func(net.Listener) context.Context { return s.baseCtx },
		ErrorLog:          slog.NewLogLogger(logging.Slog(s.log).Handler(), slog.LevelWarn),
	}
	srv, served := s.srv, s.served
	go func() {
		defer close(served)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error().Err(err).Msg("HTTP server stopped")
		}
	}()
	routes := make([]string, len(s.o.Routes))
	for i, r := range s.o.Routes {
		routes[i] = r.Pattern
	}
	s.log.Info().Str("listen", ln.Addr().String()).Bool("auth", s.auth).Bool("read_only", s.o.ReadOnly).
		Strs("routes", routes).Msg("serving River UI, /healthz, /readyz, /metrics and the routes listed")
	return nil
}

// Addr is the address the server listens on (nil before Listen).
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return nil
	}
	return s.ln.Addr()
}

// URL is the server's base URL, http://ADDR/ ("" before Listen).
func (s *Server) URL() string {
	a := s.Addr()
	if a == nil {
		return ""
	}
	return "http://" + a.String() + "/"
}

// Shutdown stops the server: it stops accepting connections, lets requests in
// flight finish for up to ShutdownTimeout (or until ctx ends), cancels the
// contexts of the requests still running after StreamGrace, closes whatever
// remains at the deadline, and stops River UI's background services. It is
// safe to call more than once and from several goroutines; every call returns
// the first one's result.
func (s *Server) Shutdown(ctx context.Context) error {
	s.shutdownOnce.Do(func() {
		s.mu.Lock()
		srv, served := s.srv, s.served
		s.mu.Unlock()
		if srv != nil {
			timer := time.AfterFunc(streamGrace, s.baseCancel)
			sctx, cancel := context.WithTimeout(ctx, s.o.ShutdownTimeout)
			err := srv.Shutdown(sctx)
			cancel()
			timer.Stop()
			if err != nil {
				_ = srv.Close()
				s.shutdownErr = fault.Wrap(fault.Unavailable, err, "HTTP server did not stop within %s", s.o.ShutdownTimeout)
			}
			<-served
			s.log.Info().Msg("HTTP server stopped")
		}
		s.baseCancel()
		s.uiCancel()
	})
	return s.shutdownErr
}

func healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write([]byte("ok\n"))
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
	defer cancel()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if reason := s.NotReady(ctx); reason != "" {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = fmt.Fprintf(w, "not ready: %s\n", reason)
		return
	}
	_, _ = w.Write([]byte("ready\n"))
}

// NotReady returns why the server is not ready ("" when it is): the database
// does not answer, a migration is refused (a newer release migrated it, or one
// was renamed), or a migration is pending. It is what /readyz reports.
func (s *Server) NotReady(ctx context.Context) string {
	if s.o.Migrations == nil {
		if err := s.o.Pool.Ping(ctx); err != nil {
			return "database unreachable: " + pg.Redact(err.Error(), s.connURL)
		}
		return ""
	}
	st, err := s.o.Migrations.Check(ctx, s.o.Pool)
	if err != nil {
		return "database unreachable: " + pg.Redact(err.Error(), s.connURL)
	}
	if len(st.Refused) > 0 {
		return "migrations refused: " + strings.Join(st.Refused, "; ")
	}
	if n := len(st.Pending); n > 0 {
		list := st.Pending
		more := ""
		if n > 5 {
			list, more = list[:5], fmt.Sprintf(" and %d more", n-5)
		}
		return fmt.Sprintf("%d migrations pending (%s%s): run better-compute migrate", n, strings.Join(list, ", "), more)
	}
	return ""
}

// promLogger writes promhttp's errors (a collector that failed) as warnings.
type promLogger struct{ log zerolog.Logger }

func (l promLogger) Println(v ...any) { l.log.Warn().Msg(strings.TrimSpace(fmt.Sprintln(v...))) }
