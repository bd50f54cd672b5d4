package web

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/logging"
)

// PublicOptions configure a public server: one listener, for anyone, that
// serves its Routes and nothing else (no River UI, no probes, no metrics).
type PublicOptions struct {
	// Listen is the host:port to listen on (required). Any address is
	// allowed: the routes guard themselves.
	Listen string
	// Routes are all the server serves; any other path is 404.
	Routes []Route
	// Log receives the server's own lines (start, stop). No request is
	// logged: public paths may hold secrets (a confirmation's token).
	Log zerolog.Logger
	// ShutdownTimeout bounds Shutdown (default 5 s).
	ShutdownTimeout time.Duration
}

// Public is a public server: the listener of the routes people outside the
// operators use (confirmation links).
//
// Every response carries headers that keep a page and its URL to itself:
// no caching (Cache-Control: no-store), no Referer sent from it (a link's
// token would leak to the sites it links to), no framing (clickjacking of a
// Confirm button), no sniffing, no indexing, and a Content-Security-Policy
// that allows inline styles and forms posting to the page's own origin only.
// A state-changing request that a browser marks as coming from another origin
// is refused (403; net/http's CrossOriginProtection).
type Public struct {
	o   PublicOptions
	log zerolog.Logger
	srv *http.Server
	ln  net.Listener

	served       chan struct{}
	shutdownOnce sync.Once
	shutdownErr  error
}

// StartPublic listens on o.Listen and serves o.Routes until ctx is cancelled
// (then it shuts down gracefully) or Shutdown is called. It returns
// INVALID_CONFIG for an address that cannot be bound or a route that is
// malformed or conflicts with another.
func StartPublic(ctx context.Context, o PublicOptions) (*Public, error) {
	if o.Listen == "" {
		return nil, fault.New(fault.InvalidConfig, "web: the public listener has no address")
	}
	if o.ShutdownTimeout <= 0 {
		o.ShutdownTimeout = 5 * time.Second
	}
	p := &Public{o: o, log: o.Log.With().Str("component", "public").Logger(), served: make(chan struct{})}
	mux := http.NewServeMux()
	for _, r := range o.Routes {
		if r.Handler == nil {
			return nil, fault.New(fault.InvalidConfig, "public route %q has no handler", r.Pattern)
		}
		if err := handle(mux, r.Pattern, r.Handler); err != nil {
			return nil, err
		}
	}
	mux.Handle("/", http.HandlerFunc(publicNotFound))
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return nil, fault.Wrap(fault.InvalidConfig, err, "BETTER_COMPUTE_PUBLIC_LISTEN=%s: cannot listen", o.Listen)
	}
	p.ln = ln
	baseCtx := context.WithoutCancel(ctx)
	p.srv = &http.Server{
		Handler:           publicHeaders(http.NewCrossOriginProtection().Handler(mux)),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       time.Minute,
		MaxHeaderBytes:    16 << 10,
		BaseContext:       func(net.Listener) context.Context { return baseCtx },
		ErrorLog:          slog.NewLogLogger(logging.Slog(p.log).Handler(), slog.LevelWarn),
	}
	go func() {
		defer close(p.served)
		if err := p.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			p.log.Error().Err(err).Msg("public HTTP server stopped")
		}
	}()
	go func() {
		select {
		case <-ctx.Done():
			_ = p.Shutdown(context.Background())
		case <-p.served:
		}
	}()
	routes := make([]string, len(o.Routes))
	for i, r := range o.Routes {
		routes[i] = r.Pattern
	}
	p.log.Info().Str("listen", ln.Addr().String()).Strs("routes", routes).Msg("public listener: serving the routes listed, and nothing else")
	return p, nil
}

// URL is the server's base URL, http://ADDR/.
func (p *Public) URL() string { return "http://" + p.ln.Addr().String() + "/" }

// Shutdown stops the server: it stops accepting connections and lets
// requests in flight finish for up to ShutdownTimeout. It is safe to call
// more than once; every call returns the first one's result.
func (p *Public) Shutdown(ctx context.Context) error {
	p.shutdownOnce.Do(func() {
		sctx, cancel := context.WithTimeout(ctx, p.o.ShutdownTimeout)
		defer cancel()
		if err := p.srv.Shutdown(sctx); err != nil {
			_ = p.srv.Close()
			p.shutdownErr = fault.Wrap(fault.Unavailable, err, "public HTTP server did not stop within %s", p.o.ShutdownTimeout)
		}
		<-p.served
		p.log.Info().Msg("public HTTP server stopped")
	})
	return p.shutdownErr
}

// publicHeaders sets the headers of every public response (see Public).
func publicHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Cache-Control", "no-store")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Frame-Options", "DENY")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Robots-Tag", "noindex, nofollow")
		h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		next.ServeHTTP(w, r)
	})
}

func publicNotFound(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusNotFound)
	_, _ = w.Write([]byte(`{"message":"not found","code":"NOT_FOUND"}` + "\n"))
}
