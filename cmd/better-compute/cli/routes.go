package cli

import (
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/web"
)

// routes are the HTTP endpoints that serve (and dev) mount beside River UI,
// behind the same listener and credentials.
func routes(s *Session, db *pg.Pool) []web.Route {
	return []web.Route{
		// The event stream: Server-Sent Events from the outbox's event log
		// (see events.go for the protocol).
		{
			Pattern:  "GET /v1/events",
			ReadOnly: true, // changes nothing: served in read-only mode too
			Handler:  newEventsHandler(db, s.Log.With().Str("component", "events").Logger()),
		},
	}
}
