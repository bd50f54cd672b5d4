// Package web is the HTTP server of `better-compute serve` (and of `dev`): River
// UI, health and readiness probes, Prometheus metrics and the application's own
// routes, behind one listener and one set of guards.
//
//	srv, err := web.Start(ctx, web.Options{
//		Listen:     "127.0.0.1:8080",
//		Pool:       db,
//		Migrations: set,      // /readyz: migrations current
//		Metrics:    registry, // /metrics
//		Log:        log,
//	})
//	…
//	err = srv.Shutdown(context.Background())
//
// # Routes
//
//	GET /healthz   200 "ok" while the process runs; never needs credentials
//	GET /readyz    200 when the database answers and no migration is pending or
//	               refused; 503 with the reason otherwise
//	GET /metrics   Prometheus text format
//	/              River UI (its single-page app, and its JSON API under /api/)
//	…              every Route in Options.Routes
//
// # Guards
//
// River UI has no authentication of its own, and its API cancels, retries and
// deletes jobs and pauses queues. Every request passes these guards in order:
//
//  1. Bind: New refuses (INVALID_CONFIG), before anything listens, an address
//     that is not loopback (127.0.0.0/8, ::1, localhost) unless a user and
//     password are configured.
//  2. Basic auth: with credentials, every request but /healthz needs them
//     (401 with WWW-Authenticate otherwise). Both the user and the password are
//     compared in constant time, and neither is ever logged.
//  3. Host: without credentials, a request whose Host header is not a loopback
//     name is refused (403), so a web page cannot reach the loopback-only UI
//     through DNS rebinding.
//  4. Cross-origin: a state-changing request that a browser marks as coming
//     from another origin is refused (403; net/http's CrossOriginProtection).
//  5. Read-only: with ReadOnly, any request to River UI other than GET, HEAD or
//     OPTIONS, and any request to a Route whose ReadOnly is false, is refused
//     with 403 and a JSON body {"message": …, "code": "READ_ONLY"}.
//
// # Shutdown
//
// Shutdown (or the cancellation of Start's context) stops accepting connections
// and lets requests in flight finish for up to ShutdownTimeout; the contexts of
// requests still running StreamGrace after shutdown began (event streams) are
// cancelled, so they end too.
package web
