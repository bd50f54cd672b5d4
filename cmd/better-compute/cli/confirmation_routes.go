package cli

import (
	"net/http"
	"strconv"

	"github.com/rs/zerolog"

	"github.com/bettercompute/bettercompute/domain/workflow/confirmation"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/web"
)

// The confirmations module's operator endpoints, beside the confirmation
// command, on serve's operator listener (its credentials, its read-only mode).
// Neither holds a token: the database has none, only their hashes.
//
//	GET  /v1/confirmations?workflow=ID&state=S&limit=N   {"confirmations": [...]}, newest first
//	POST /v1/confirmations/{id}/revoke                   the binding, revoked
//
// The links themselves (/confirm/{token}, POST /v1/confirmations/{token}) are
// the public listener's: see confirmations.go.

// confirmationRoutes are the operator's confirmation endpoints.
func confirmationRoutes(s *Session, db *pg.Pool) []web.Route {
	log := s.Log.With().Str("component", "confirmations").Logger()
	return []web.Route{
		{Pattern: "GET /v1/confirmations", ReadOnly: true, Handler: confirmationListAPI(db, log)},
		{Pattern: "POST /v1/confirmations/{id}/revoke", Handler: confirmationRevokeAPI(db, log)},
	}
}

// confirmationListAPI is GET /v1/confirmations.
func confirmationListAPI(db *pg.Pool, log zerolog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		o := confirmation.ListOpts{WorkflowID: q.Get("workflow"), Limit: confirmationsListLimit}
		st, err := parseConfirmationState(q.Get("state"))
		if err != nil {
			writeAPIError(w, r, log, err)
			return
		}
		o.State = st
		if l := q.Get("limit"); l != "" {
			n, err := strconv.Atoi(l)
			if err != nil || n < 1 || n > 1000 {
				writeAPIError(w, r, log, fault.New(fault.InvalidArgument, "limit=%q: want 1 to 1000", l))
				return
			}
			o.Limit = n
		}
		bs, err := confirmation.List(r.Context(), db, o)
		if err != nil {
			writeAPIError(w, r, log, err)
			return
		}
		if bs == nil {
			bs = []confirmation.Binding{}
		}
		writeAPIJSON(w, http.StatusOK, map[string]any{"confirmations": bs})
	})
}

// confirmationRevokeAPI is POST /v1/confirmations/{id}/revoke: 200 with the
// binding (revoked, or expired and now revoked; revoking a revoked one again
// changes nothing), 409 CONFLICT for a confirmed one (its signal was
// delivered), 404 for an unknown id, 400 for one that is not a number.
func confirmationRevokeAPI(db *pg.Pool, log zerolog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := parseConfirmationID(r.PathValue("id"))
		if err != nil {
			writeAPIError(w, r, log, err)
			return
		}
		b, err := confirmation.Revoke(r.Context(), db, id)
		if fault.Has(err, fault.Conflict) {
			// httpStatusOf answers 503 for anything but a client's mistake;
			// this one is the caller's to know.
			writeAPIJSON(w, http.StatusConflict, map[string]string{"message": messageOf(revokeError(id, b, err)), "code": string(fault.Conflict)})
			return
		}
		if err != nil {
			writeAPIError(w, r, log, err)
			return
		}
		writeAPIJSON(w, http.StatusOK, b)
	})
}
