package web

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/bettercompute/bettercompute/platform/fault"
)

// CheckBind returns INVALID_CONFIG when listen is not host:port, or when it
// names an address that is not loopback (127.0.0.0/8, ::1, or a name that
// resolves only to those) and auth is false. An empty host (":8080") means every
// interface, so it needs auth too.
func CheckBind(ctx context.Context, listen string, auth bool) error {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return fault.Wrap(fault.InvalidConfig, err, "BETTER_COMPUTE_LISTEN=%q is not host:port", listen)
	}
	if auth || isLoopback(ctx, host) {
		return nil
	}
	what := host
	if what == "" {
		what = "every interface"
	}
	return fault.New(fault.InvalidConfig,
		"BETTER_COMPUTE_LISTEN=%s is not a loopback address (%s): River UI can cancel, retry and delete jobs, so serve binds beyond this machine only with BETTER_COMPUTE_AUTH_USER and BETTER_COMPUTE_AUTH_PASSWORD set",
		listen, what)
}

// isLoopback reports whether host is a loopback IP or a name that resolves only
// to loopback IPs.
func isLoopback(ctx context.Context, host string) bool {
	if host == "" {
		return false
	}
	if ip := net.ParseIP(stripZone(host)); ip != nil {
		return ip.IsLoopback()
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupIPAddr(ctx, host)
	if err != nil || len(addrs) == 0 {
		return false
	}
	for _, a := range addrs {
		if !a.IP.IsLoopback() {
			return false
		}
	}
	return true
}

func stripZone(host string) string {
	if i := strings.IndexByte(host, '%'); i >= 0 {
		return host[:i]
	}
	return host
}

// loopbackName reports whether a Host header names this machine's loopback
// interface: a loopback IP, localhost, *.localhost, or the configured host.
func (s *Server) loopbackName(hostHeader string) bool {
	if hostHeader == "" {
		return true // HTTP/1.0 without Host: not a browser
	}
	host := hostHeader
	if h, _, err := net.SplitHostPort(hostHeader); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	if ip := net.ParseIP(stripZone(host)); ip != nil {
		return ip.IsLoopback()
	}
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	if h, _, err := net.SplitHostPort(s.o.Listen); err == nil && strings.EqualFold(h, host) {
		return true
	}
	return false
}

// guard wraps next with the guards of the package doc, in order. /healthz
// (GET or HEAD) passes none of them.
func (s *Server) guard(next http.Handler) http.Handler {
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.log.Debug().Str("method", r.Method).Str("path", r.URL.Path).Str("remote", r.RemoteAddr).Msg("refused a cross-origin request")
		writeError(w, http.StatusForbidden, "CROSS_ORIGIN", "cross-origin state-changing requests are refused")
	}))
	inner := cop.Handler(next)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		defer func() {
			s.log.Debug().Str("method", r.Method).Str("path", r.URL.Path).Int("status", rec.status).
				Dur("took", time.Since(start)).Str("remote", r.RemoteAddr).Msg("http request")
		}()
		if r.URL.Path == "/healthz" && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
			healthz(rec, r)
			return
		}
		if s.auth {
			if !s.authorized(r) {
				rec.Header().Set("WWW-Authenticate", `Basic realm="better-compute", charset="UTF-8"`)
				writeError(rec, http.StatusUnauthorized, "UNAUTHORIZED", "credentials required (HTTP basic auth)")
				return
			}
		} else if !s.loopbackName(r.Host) {
			writeError(rec, http.StatusForbidden, "MISDIRECTED",
				"without credentials serve answers only requests addressed to a loopback name (localhost, 127.0.0.1, [::1])")
			return
		}
		inner.ServeHTTP(rec, r)
	})
}

// authorized compares the request's basic-auth user and password with the
// configured ones in constant time (over SHA-256 digests, so lengths leak
// nothing either), always comparing both.
func (s *Server) authorized(r *http.Request) bool {
	user, pass, ok := r.BasicAuth()
	uh := sha256.Sum256([]byte(user))
	ph := sha256.Sum256([]byte(pass))
	u := subtle.ConstantTimeCompare(uh[:], s.userHash[:])
	p := subtle.ConstantTimeCompare(ph[:], s.passHash[:])
	return ok && u&p == 1
}

// safeMethod reports whether m changes nothing by HTTP's definition.
func safeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions
}

// readOnlyGuard refuses every request to next whose method is not safe.
func readOnlyGuard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !safeMethod(r.Method) {
			refuseReadOnly(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func refuseReadOnly(w http.ResponseWriter, r *http.Request) {
	writeError(w, http.StatusForbidden, "READ_ONLY",
		"read-only mode (BETTER_COMPUTE_READ_ONLY=true): "+r.Method+" "+r.URL.Path+" is refused")
}

// writeError writes {"message": msg, "code": code} with status. River UI shows
// the message.
func writeError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"message": msg, "code": code})
}

// statusRecorder remembers the status for the access log; Unwrap lets
// http.ResponseController reach Flush on the real writer (event streams).
type statusRecorder struct {
	http.ResponseWriter
	status      int
	wroteHeader bool
}

func (r *statusRecorder) WriteHeader(code int) {
	if !r.wroteHeader {
		r.status, r.wroteHeader = code, true
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	r.wroteHeader = true
	return r.ResponseWriter.Write(b)
}

// Flush forwards to the underlying writer when it can flush, for handlers that
// test for http.Flusher directly.
func (r *statusRecorder) Flush() {
	r.wroteHeader = true
	_ = http.NewResponseController(r.ResponseWriter).Flush()
}

func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }
