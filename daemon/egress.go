package daemon

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/corral-sandbox/corral/api"
	"github.com/corral-sandbox/corral/egress"
	"github.com/corral-sandbox/corral/store"
)

// Egress API: a project's network policy (owners and daemon admins set
// it; members read it) and the journal of its machine's connections
// (members).
//
//	GET /v1/projects/{id}/egress      → EgressPolicyJSON
//	PUT /v1/projects/{id}/egress      EgressPolicyJSON → EgressPolicyJSON
//	GET /v1/projects/{id}/egress/log  ?limit=N (≤ 1000, default 100) → [EgressLogJSON], newest first

func policyJSON(p egress.Policy) api.EgressPolicy {
	out := api.EgressPolicy{Mode: string(p.Mode), Allow: p.Allow, Deny: p.Deny}
	if out.Allow == nil {
		out.Allow = []string{}
	}
	if out.Deny == nil {
		out.Deny = []string{}
	}
	return out
}

// egressAccess returns the project of the request if its account is a
// member, or a daemon admin; owner reports whether it may change the
// policy (an owner or an admin).
func (a *App) egressAccess(r *http.Request) (store.Account, store.Project, bool, error) {
	acct, p, m, err := a.projectMember(r)
	var ae *APIError
	if err != nil && errors.As(err, &ae) && ae.Status == http.StatusForbidden && a.isAdmin(acct) {
		if p.ID == 0 { // no such project: admins may know
			id, _ := pathID(r)
			return acct, p, false, apiErr(http.StatusNotFound, KindNotFound, "project %d does not exist", id)
		}
		return acct, p, true, nil
	}
	if err != nil {
		return acct, p, false, err
	}
	return acct, p, m.Role == store.RoleOwner || a.isAdmin(acct), nil
}

func (a *App) getEgress(w http.ResponseWriter, r *http.Request) error {
	_, p, _, err := a.egressAccess(r)
	if err != nil {
		return err
	}
	pol, err := egress.LoadPolicy(r.Context(), a.store, p.ID)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, policyJSON(pol))
	return nil
}

func (a *App) putEgress(w http.ResponseWriter, r *http.Request) error {
	_, p, owner, err := a.egressAccess(r)
	if err != nil {
		return err
	}
	if !owner {
		return apiErr(http.StatusForbidden, KindForbidden, "only an owner of project %d or an admin may set its network policy", p.ID)
	}
	var req api.EgressPolicy
	if err := a.decodeBody(w, r, &req); err != nil {
		return err
	}
	pol, err := egress.StorePolicy(r.Context(), a.store, p.ID, egress.Policy{Mode: egress.Mode(req.Mode), Allow: req.Allow, Deny: req.Deny})
	if errors.Is(err, egress.ErrBadPolicy) {
		return apiErr(http.StatusBadRequest, KindInvalid, "%v", err)
	}
	if err != nil {
		return err
	}
	if mg := a.core.Egress(); mg != nil {
		mg.PolicyChanged(r.Context(), p.ID)
	}
	writeJSON(w, http.StatusOK, policyJSON(pol))
	return nil
}

func (a *App) egressLog(w http.ResponseWriter, r *http.Request) error {
	_, p, _, err := a.egressAccess(r)
	if err != nil {
		return err
	}
	limit := 100
	if s := r.URL.Query().Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 1000 {
			return apiErr(http.StatusBadRequest, KindInvalid, "limit must be 1 to 1000")
		}
		limit = n
	}
	rows, err := a.store.EgressLog(r.Context(), p.ID, limit)
	if err != nil {
		return err
	}
	out := make([]api.EgressLogEntry, 0, len(rows))
	for _, e := range rows {
		out = append(out, api.EgressLogEntry{ID: e.ID, Account: e.Account, Protocol: e.Protocol, Name: e.Name, Addr: e.Addr,
			Port: e.Port, Verdict: e.Verdict, Rule: e.Rule, Error: e.Error, BytesIn: e.BytesIn, BytesOut: e.BytesOut,
			StartedAt: e.StartedAt.UTC(), DurationMS: e.Duration.Milliseconds()})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// egressMetrics count the egress service's connections (see Metrics).
type egressMetrics struct {
	conns *prometheus.CounterVec
	bytes *prometheus.CounterVec
}

func newEgressMetrics(reg *prometheus.Registry) egressMetrics {
	e := egressMetrics{
		conns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "corral_egress_connections_total",
			Help: "Outbound connection attempts of machines through the egress proxies, by verdict: allowed, denied, failed.",
		}, []string{"verdict"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "corral_egress_bytes_total",
			Help: "Bytes through the egress proxies, by direction: in (to machines), out (from machines).",
		}, []string{"direction"}),
	}
	reg.MustRegister(e.conns, e.bytes)
	return e
}

// ObserveEgress counts one journaled connection attempt. Install it as
// core.Options.Egress.Service.Audit. It is safe for concurrent use.
func (m *Metrics) ObserveEgress(r egress.Record) {
	m.egress.conns.WithLabelValues(r.Verdict).Inc()
	m.egress.bytes.WithLabelValues("in").Add(float64(r.BytesIn))
	m.egress.bytes.WithLabelValues("out").Add(float64(r.BytesOut))
}
