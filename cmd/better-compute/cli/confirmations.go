package cli

import (
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/web"
)

// defaultPublicListen is the public listener's address under dev when
// BETTER_COMPUTE_PUBLIC_LISTEN is not set (serve has none then).
const defaultPublicListen = "127.0.0.1:8081"

// PublicBase is the base URL of confirmation links: BETTER_COMPUTE_PUBLIC_URL,
// else http://BETTER_COMPUTE_PUBLIC_LISTEN/, else dev's public listener's.
func (s *Session) PublicBase() string {
	switch {
	case s.Config.PublicURL != "":
		return s.Config.PublicURL
	case s.Config.PublicListen != "":
		return "http://" + s.Config.PublicListen + "/"
	}
	return "http://" + defaultPublicListen + "/"
}

// confirmationPublicRoutes are the confirmation links' routes (see
// confirm_http.go).
func confirmationPublicRoutes(s *Session, db *pg.Pool) []web.Route {
	return nil
}
