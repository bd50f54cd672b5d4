package cli

import (
	"net/http"

	"github.com/bettercompute/bettercompute/platform/pg"
)

// Route is an HTTP endpoint that serve (and dev) mount beside River UI, behind
// the same listener and credentials. Each route's file adds itself to routes in an
// init function.
type Route struct {
	// Pattern is an http.ServeMux pattern, e.g. "GET /v1/events".
	Pattern string
	// ReadOnly routes are served in read-only mode too (they change nothing).
	ReadOnly bool
	// Handler builds the handler once the database is open.
	Handler func(s *Session, db *pg.Pool) http.Handler
}

var routes []Route
