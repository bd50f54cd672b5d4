package cli

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/bettercompute/bettercompute/domain/tenancy"
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/web"
	"github.com/bettercompute/bettercompute/workers"
)

// The tenancy module's operator surfaces beside the tenant command: /v1/tenants,
// its metrics and its doctor check.

// tenantRoutes are GET /v1/tenants (?state=S) and GET /v1/tenants/{name}.
func tenantRoutes(s *Session, db *pg.Pool) []web.Route {
	log := s.Log.With().Str("component", "tenants").Logger()
	return []web.Route{
		{Pattern: "GET /v1/tenants", ReadOnly: true, Handler: tenantListAPI(db, log)},
		{Pattern: "GET /v1/tenants/{name}", ReadOnly: true, Handler: tenantAPI(db, log)},
	}
}

func tenantListAPI(db *pg.Pool, log zerolog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st := tenancy.State(r.URL.Query().Get("state"))
		switch st {
		case "", tenancy.Active, tenancy.Suspended, tenancy.Deleted:
		default:
			writeAPIError(w, r, log, fault.New(fault.InvalidArgument, "state %q: want active, suspended or deleted", st))
			return
		}
		ts, err := tenancy.List(r.Context(), db, st)
		if err != nil {
			writeAPIError(w, r, log, err)
			return
		}
		if ts == nil {
			ts = []tenancy.Tenant{}
		}
		writeAPIJSON(w, http.StatusOK, map[string]any{"tenants": ts})
	})
}

func tenantAPI(db *pg.Pool, log zerolog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t, err := tenancy.Get(r.Context(), db, r.PathValue("name"))
		if err != nil {
			writeAPIError(w, r, log, err)
			return
		}
		writeAPIJSON(w, http.StatusOK, t)
	})
}

// MaxTenantSeries is how many tenants the tenant metrics name, each scrape:
// those with the most work running and waiting; the others are summed under
// tenant="_other", so a deployment of a million tenants exports at most
// MaxTenantSeries+1 series a metric.
const MaxTenantSeries = 20

// tenantCollector exports bettercompute_tenant_running, _waiting and
// _limit by tenant (bounded: MaxTenantSeries), and bettercompute_tenants by
// state.
type tenantCollector struct {
	db                              *pg.Pool
	running, waiting, limit, states *prometheus.Desc
}

func newTenantCollector(db *pg.Pool) *tenantCollector {
	return &tenantCollector{db: db,
		running: prometheus.NewDesc("bettercompute_tenant_running",
			"Units of the tenant's work running now (River jobs running, reconcile batches in their transaction), for the tenants with the most work; the others summed as tenant=\"_other\".", []string{"tenant"}, nil),
		waiting: prometheus.NewDesc("bettercompute_tenant_waiting",
			"The tenant's River jobs waiting to run and dirty keys (held while it is suspended), for the tenants with the most work; the others summed as tenant=\"_other\".", []string{"tenant"}, nil),
		limit: prometheus.NewDesc("bettercompute_tenant_limit",
			"How many units of the tenant's work may run at once, for the tenants named by bettercompute_tenant_running.", []string{"tenant"}, nil),
		states: prometheus.NewDesc("bettercompute_tenants",
			"Tenants by state (active, suspended, deleted).", []string{"state"}, nil),
	}
}

func (c *tenantCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.running
	ch <- c.waiting
	ch <- c.limit
	ch <- c.states
}

func (c *tenantCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), workers.CollectTimeout)
	defer cancel()
	ts, err := tenancy.List(ctx, c.db, "")
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.running, err)
		return
	}
	byState := map[tenancy.State]int{tenancy.Active: 0, tenancy.Suspended: 0, tenancy.Deleted: 0}
	for _, t := range ts {
		byState[t.State]++
	}
	for st, n := range byState {
		ch <- prometheus.MustNewConstMetric(c.states, prometheus.GaugeValue, float64(n), string(st))
	}
	sort.SliceStable(ts, func(i, j int) bool { return ts[i].Running+ts[i].Waiting > ts[j].Running+ts[j].Waiting })
	var otherRunning, otherWaiting int64
	for i, t := range ts {
		if i >= MaxTenantSeries {
			otherRunning, otherWaiting = otherRunning+t.Running, otherWaiting+t.Waiting
			continue
		}
		ch <- prometheus.MustNewConstMetric(c.running, prometheus.GaugeValue, float64(t.Running), t.Name)
		ch <- prometheus.MustNewConstMetric(c.waiting, prometheus.GaugeValue, float64(t.Waiting), t.Name)
		ch <- prometheus.MustNewConstMetric(c.limit, prometheus.GaugeValue, float64(t.MaxRunning), t.Name)
	}
	if len(ts) > MaxTenantSeries {
		ch <- prometheus.MustNewConstMetric(c.running, prometheus.GaugeValue, float64(otherRunning), "_other")
		ch <- prometheus.MustNewConstMetric(c.waiting, prometheus.GaugeValue, float64(otherWaiting), "_other")
	}
}

// tenantChecks is doctor's look at tenants: the work suspended tenants hold,
// and the tenants at their limit (their work waits for their own units, not
// for the workers). Neither fails doctor: both are what an operator chose.
func tenantChecks(ctx context.Context, _ *Session, db *pg.Pool) []Check {
	ts, err := tenancy.List(ctx, db, "")
	if err != nil {
		return []Check{{Name: "tenants", Detail: err.Error(), Code: fault.CodeOf(err)}}
	}
	var held, full []string
	for _, t := range ts {
		if t.State == tenancy.Suspended && t.Waiting > 0 {
			held = append(held, fmt.Sprintf("%s (%d)", t.Name, t.Waiting))
		}
		if t.State == tenancy.Active && t.Running >= int64(t.MaxRunning) {
			full = append(full, fmt.Sprintf("%s (%d of %d, %d waiting)", t.Name, t.Running, t.MaxRunning, t.Waiting))
		}
	}
	heldDetail := "no suspended tenant holds work"
	if len(held) > 0 {
		heldDetail = fmt.Sprintf("%d suspended tenants hold work until resumed: %s", len(held), strings.Join(held, ", "))
	}
	fullDetail := "no tenant is at its limit"
	if len(full) > 0 {
		fullDetail = fmt.Sprintf("%d tenants at their limit (tenant limit NAME N raises one): %s", len(full), strings.Join(full, ", "))
	}
	return []Check{
		{Name: "held", OK: true, Detail: heldDetail},
		{Name: "limits", OK: true, Detail: fullDetail},
	}
}
