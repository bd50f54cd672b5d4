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
		// Durable workflows, read-only: the JSON API and the HTML pages
		// (see workflows_http.go). {id...}: a child's id holds slashes.
		{Pattern: "GET /v1/workflows", ReadOnly: true, Handler: workflowListAPI(db, s.Log.With().Str("component", "workflows").Logger())},
		{Pattern: "GET /v1/workflows/{id...}", ReadOnly: true, Handler: workflowAPI(db, s.Log.With().Str("component", "workflows").Logger())},
		{Pattern: "GET /workflows", ReadOnly: true, Handler: workflowsPage(s, db, s.Log.With().Str("component", "workflows").Logger())},
		{Pattern: "GET /workflows/{id...}", ReadOnly: true, Handler: workflowPage(db, s.Log.With().Str("component", "workflows").Logger())},
	}
}
