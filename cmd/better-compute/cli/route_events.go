package cli

import (
	"net/http"

	"github.com/bettercompute/bettercompute/domain/outbox"
	"github.com/bettercompute/bettercompute/platform/pg"
)

// The event stream: Server-Sent Events from the outbox's event log, behind
// serve's listener and credentials (see outbox.NewSSEHandler for the protocol:
// ?topics=a,b, ?from=start|end|TXID:SEQ, Last-Event-ID, ?heartbeat=N).
func init() {
	routes = append(routes, Route{
		Pattern:  "GET /v1/events",
		ReadOnly: true,
		Handler: func(s *Session, db *pg.Pool) http.Handler {
			return outbox.NewSSEHandler(db, outbox.SSEOptions{Log: s.Log.With().Str("component", "events").Logger()})
		},
	})
}
