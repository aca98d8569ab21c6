package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/corral-sandbox/corral/internal/errdefs"
	"github.com/corral-sandbox/corral/machine"
	"github.com/corral-sandbox/corral/plugin"
	sitesplugin "github.com/corral-sandbox/corral/plugins/sites"
	"github.com/corral-sandbox/corral/store"
)

// siteHostSuffix marks the upstream host names the gateway's transport
// dials: "<project>-<port>.corral-site". Connections are pooled per
// project and port.
const siteHostSuffix = ".corral-site"

// sitesGateway serves /sites/{name}/…: it is mounted when the app is built
// and never unmounted. On every request it resolves the sites control
// through the registry (503 with the reason when the domain is absent,
// disabled or failed), looks the name up (404), checks that the caller is a
// member of the site's project (401/403), and proxies the request — HTTP or
// a WebSocket upgrade — to the published port on the loopback of the
// project's machine, through the machine gateway's net-dial (503 "no
// privileged transport in this process" without a transport, 502 when the
// port cannot be reached).
type sitesGateway struct {
	a         *App
	transport *http.Transport
	proxy     *httputil.ReverseProxy
}

type siteTargetKey struct{}

func newSitesGateway(a *App) *sitesGateway {
	g := &sitesGateway{a: a}
	g.transport = &http.Transport{
		DialContext:           g.dial,
		MaxIdleConnsPerHost:   8,
		IdleConnTimeout:       30 * time.Second,
		ResponseHeaderTimeout: 5 * time.Minute,
		ForceAttemptHTTP2:     false,
	}
	g.proxy = &httputil.ReverseProxy{
		Rewrite:   g.rewrite,
		Transport: g.transport,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			writeError(w, toAPIError(&siteDialError{err}))
		},
	}
	return g
}

func (g *sitesGateway) close() { g.transport.CloseIdleConnections() }

// dial connects to "<project>-<port>.corral-site" through the worker.
func (g *sitesGateway) dial(ctx context.Context, _, addr string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	spec, ok := strings.CutSuffix(host, siteHostSuffix)
	if !ok {
		return nil, fmt.Errorf("daemon: sites: unexpected upstream %q", addr)
	}
	ps, portS, _ := strings.Cut(spec, "-")
	id, err1 := strconv.ParseInt(ps, 10, 64)
	port, err2 := strconv.Atoi(portS)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("daemon: sites: unexpected upstream %q", addr)
	}
	p, err := g.a.store.GetProject(ctx, id)
	if err != nil {
		return nil, err
	}
	return g.a.core.Gateway().Dial(ctx, machine.Project{ID: p.ID, Workspace: p.Root}, port)
}

// siteDialError is a failure to proxy to a site (see errorRules): a
// missing transport or worker is 503, a client gone 499, anything else 502.
type siteDialError struct{ err error }

func (e *siteDialError) Error() string { return e.err.Error() }
func (e *siteDialError) Unwrap() error { return e.err }

func siteDialFailure(err error) bool {
	var de *siteDialError
	return errors.As(err, &de) && errdefs.KindOf(err) == "" && !errors.Is(err, context.Canceled)
}

func siteDialMessage(err error) string {
	var rej *machine.RejectedError
	if errors.As(err, &rej) {
		return fmt.Sprintf("site unreachable: %s: %s", rej.Code, rej.Message)
	}
	return "site unreachable"
}

type siteTarget struct {
	site   sitesplugin.Site
	prefix string
	rest   string
}

func (g *sitesGateway) rewrite(pr *httputil.ProxyRequest) {
	t := pr.In.Context().Value(siteTargetKey{}).(siteTarget)
	pr.SetURL(&url.URL{Scheme: "http", Host: fmt.Sprintf("%d-%d%s", t.site.Project, t.site.Port, siteHostSuffix)})
	pr.Out.URL.Path = "/" + t.rest
	pr.Out.URL.RawPath = ""
	pr.Out.URL.RawQuery = pr.In.URL.RawQuery
	pr.Out.Host = pr.In.Host
	pr.SetXForwarded()
	pr.Out.Header.Set("X-Forwarded-Prefix", t.prefix)
	// The caller's credentials never reach the machine.
	pr.Out.Header.Del("Authorization")
}

// resolve returns the sites control, through the registry, at call time.
func (g *sitesGateway) resolve() (sitesplugin.Control, error) {
	ctl, err := plugin.ResolveCoreAs[sitesplugin.Control](g.a.core.Registry(), plugin.DomainSites)
	if err != nil {
		msg := "sites are unavailable"
		var re *plugin.ResolveError
		if errors.As(err, &re) && re.Reason != "" {
			msg += ": " + re.Reason
		}
		// A plugin disabled by configuration or failed before it
		// registered owns nothing: say what became of the built-in one.
		if st, ok := g.a.core.Registry().Status(sitesplugin.Name); ok && st.State != plugin.StateLoaded {
			msg = fmt.Sprintf("sites are unavailable: plugin %s is %s: %s", st.Name, st.State, st.Reason)
		}
		return nil, &APIError{Status: http.StatusServiceUnavailable, Kind: KindUnavailable, Message: msg, Cause: err}
	}
	return ctl, nil
}

func (g *sitesGateway) serve(w http.ResponseWriter, r *http.Request) error {
	ctl, err := g.resolve()
	if err != nil {
		return err
	}
	name := r.PathValue("name")
	site, err := ctl.Lookup(r.Context(), name)
	if err != nil {
		return err
	}
	if _, _, _, err := g.a.member(r, site.Project); err != nil {
		var ae *APIError
		if errors.As(err, &ae) && ae.Status == http.StatusNotFound {
			// A non-member learns no more than of a name nobody
			// published (the lookup's own answer), not even the
			// project's id.
			return fmt.Errorf("%w: %q", sitesplugin.ErrNotFound, name)
		}
		return err
	}
	t := siteTarget{site: site, prefix: "/sites/" + name, rest: r.PathValue("path")}
	// A proxied connection (a WebSocket upgrade included: the proxy
	// closes it when the context ends) follows the caller's token.
	ctx, untrack := g.a.trackSession(r.Context(), r, site.Project)
	defer untrack()
	g.proxy.ServeHTTP(w, r.WithContext(context.WithValue(ctx, siteTargetKey{}, t)))
	return nil
}

// Site management under /v1/projects/{id}/sites (members of the project).

func (a *App) listSites(w http.ResponseWriter, r *http.Request) error {
	_, p, _, err := a.projectMember(r)
	if err != nil {
		return err
	}
	ctl, err := a.sites.resolve()
	if err != nil {
		return err
	}
	list, err := ctl.List(r.Context(), p.ID)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, list)
	return nil
}

// SiteRequest is the body of PUT /v1/projects/{id}/sites/{name}.
type SiteRequest struct {
	Port int `json:"port"`
}

func (a *App) publishSite(w http.ResponseWriter, r *http.Request) error {
	acct, p, _, err := a.projectMember(r)
	if err != nil {
		return err
	}
	var req SiteRequest
	if err := a.decodeBody(w, r, &req); err != nil {
		return err
	}
	if p.Kind != store.ProjectManaged {
		return apiErr(http.StatusBadRequest, KindInvalid, "sites are served from managed projects only")
	}
	ctl, err := a.sites.resolve()
	if err != nil {
		return err
	}
	s, err := ctl.Publish(r.Context(), p.ID, r.PathValue("name"), req.Port, acct.ID)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, s)
	return nil
}

func (a *App) unpublishSite(w http.ResponseWriter, r *http.Request) error {
	_, p, _, err := a.projectMember(r)
	if err != nil {
		return err
	}
	ctl, err := a.sites.resolve()
	if err != nil {
		return err
	}
	if err := ctl.Unpublish(r.Context(), p.ID, r.PathValue("name")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
