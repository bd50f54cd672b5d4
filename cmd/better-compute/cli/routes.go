package cli

import (
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/web"
)

// routes are the HTTP endpoints that serve (and dev) mount beside River UI,
// behind the same listener and credentials: each module's Routes, the
// built-in modules' first (the outbox's event stream, the workflows' API and
// pages), then the application's.
func routes(s *Session, db *pg.Pool) []web.Route {
	var rs []web.Route
	for _, m := range s.App.modules() {
		if m.Routes != nil {
			rs = append(rs, m.Routes(s, db)...)
		}
	}
	return rs
}

// outboxRoutes is the outbox module's endpoint: the event stream, Server-Sent
// Events from the event log (see events.go for the protocol).
func outboxRoutes(s *Session, db *pg.Pool) []web.Route {
	return []web.Route{{
		Pattern:  "GET /v1/events",
		ReadOnly: true, // changes nothing: served in read-only mode too
		Handler:  newEventsHandler(db, s.Log.With().Str("component", "events").Logger()),
	}}
}

// workflowRoutes are the workflow module's endpoints, read-only: the JSON API
// and the HTML pages (see workflows_http.go). {id...}: a child's id holds
// slashes.
func workflowRoutes(s *Session, db *pg.Pool) []web.Route {
	log := s.Log.With().Str("component", "workflows").Logger()
	return []web.Route{
		{Pattern: "GET /v1/workflows", ReadOnly: true, Handler: workflowListAPI(db, log)},
		{Pattern: "GET /v1/workflows/{id...}", ReadOnly: true, Handler: workflowAPI(db, log)},
		{Pattern: "GET /workflows", ReadOnly: true, Handler: workflowsPage(s, db, log)},
		{Pattern: "GET /workflows/{id...}", ReadOnly: true, Handler: workflowPage(db, log)},
	}
}
