package cli

import (
	"context"
	"errors"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/bettercompute/bettercompute/domain/workflow/confirmation"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/web"
	"github.com/bettercompute/bettercompute/workers"
)

// defaultPublicListen is the public listener's address under dev when
// BETTER_COMPUTE_PUBLIC_LISTEN is not set (serve has none then); if it is
// taken, dev listens on a free port of loopback instead.
const defaultPublicListen = "127.0.0.1:8081"

// PublicBase is the base URL of confirmation links: BETTER_COMPUTE_PUBLIC_URL,
// else the public listener's once it listens, else
// http://BETTER_COMPUTE_PUBLIC_LISTEN/, else dev's default.
func (s *Session) PublicBase() string {
	switch {
	case s.Config.PublicURL != "":
		return s.Config.PublicURL
	case s.publicURL != "":
		return s.publicURL
	case s.Config.PublicListen != "":
		return "http://" + s.Config.PublicListen + "/"
	}
	return "http://" + defaultPublicListen + "/"
}

// confirmationOutcomes is the session's counter of the confirmation routes'
// answers (serve's /metrics).
func (s *Session) confirmationOutcomes() *prometheus.CounterVec {
	if s.publicOutcomes == nil {
		s.publicOutcomes = newConfirmationOutcomes()
	}
	return s.publicOutcomes
}

// confirmationPublicRoutes are the confirmation links' routes (confirm_http.go).
func confirmationPublicRoutes(s *Session, db *pg.Pool) []web.Route {
	tp, _ := s.TracerProvider(context.Background()) // a bad OTEL_* setting failed serve before
	h := &confirmHandler{
		db: db, log: s.Log.With().Str("component", "confirmations").Logger(), tracer: tp,
		ipHeader: s.Config.PublicClientIPHeader, limiter: newGuessLimiter(guessBurst, guessEvery),
		floor: refusalFloor, outcomes: s.confirmationOutcomes(),
	}
	return h.routes()
}

// startPublic starts the public listener, serving every module's
// PublicRoutes, on BETTER_COMPUTE_PUBLIC_LISTEN (dev: defaultPublicListen,
// or a free port if that is taken); nil when there is none to start.
func (s *Session) startPublic(ctx context.Context, db *pg.Pool) (*web.Public, error) {
	listen := s.Config.PublicListen
	if listen == "" && !s.Dev {
		return nil, nil
	}
	var rs []web.Route
	for _, m := range s.App.modules() {
		if m.PublicRoutes != nil {
			rs = append(rs, m.PublicRoutes(s, db)...)
		}
	}
	if len(rs) == 0 {
		return nil, nil
	}
	o := web.PublicOptions{Listen: listen, Routes: rs, Log: s.Log}
	if listen == "" {
		o.Listen = defaultPublicListen
	}
	p, err := web.StartPublic(ctx, o)
	if err != nil && listen == "" && errors.Is(err, syscall.EADDRINUSE) {
		s.Log.Warn().Str("listen", o.Listen).Msg("dev: the public listener's default address is taken; listening on a free port instead")
		o.Listen = "127.0.0.1:0"
		p, err = web.StartPublic(ctx, o)
	}
	if err != nil {
		return nil, err
	}
	s.publicURL = p.URL()
	return p, nil
}

// confirmationCollector is the bindings by state, read at each scrape.
type confirmationCollector struct {
	db     *pg.Pool
	states *prometheus.Desc
}

func newConfirmationCollector(db *pg.Pool) *confirmationCollector {
	return &confirmationCollector{db: db, states: prometheus.NewDesc("bettercompute_confirmations",
		"Confirmation bindings by state (pending, confirmed, revoked, expired).", []string{"state"}, nil)}
}

func (c *confirmationCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.states }

func (c *confirmationCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), workers.CollectTimeout)
	defer cancel()
	counts, err := confirmation.Counts(ctx, c.db)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.states, err)
		return
	}
	for st, n := range counts {
		ch <- prometheus.MustNewConstMetric(c.states, prometheus.GaugeValue, float64(n), string(st))
	}
}
