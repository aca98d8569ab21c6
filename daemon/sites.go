package daemon

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/corral-sandbox/corral/api"
	"github.com/corral-sandbox/corral/internal/errdefs"
	"github.com/corral-sandbox/corral/machine"
	"github.com/corral-sandbox/corral/plugin"
	"github.com/corral-sandbox/corral/plugins/sites"
	"github.com/corral-sandbox/corral/store"
)

// siteHostSuffix marks the upstream host names the gateway's transport
// dials: "<project>-<port>.corral-site". Connections are pooled per
// project and port.
const siteHostSuffix = ".corral-site"

// Defaults and bounds of SitesOptions.
const (
	DefaultSiteURLTTL    = 5 * time.Minute
	MaxSiteURLTTL        = time.Hour
	DefaultSiteCookieTTL = 8 * time.Hour
)

// SitesOptions configure the Sites gateway's own origins. The zero value
// serves sites by path only (/sites/{name}/…, on every listener).
type SitesOptions struct {
	// Domain D, if non-empty, serves site NAME at the origin NAME.D: a
	// request whose Host is NAME.D (any port) goes to that site, and the
	// API refuses every request whose Host is D or under it. Path routing
	// then stays on the Unix socket only. D must resolve (by wildcard) to
	// the daemon's TCP listener or to a proxy in front of it; it should
	// not be a parent of the API's host name.
	Domain string
	// Scheme of signed URLs: "https" (the default: TLS terminated in
	// front of the daemon) or "http". With https the site cookie is
	// Secure and named __Host-corral-site.
	Scheme string
	// Port, if non-zero, is written in signed URLs (NAME.D:Port).
	Port int
	// URLTTL is the default lifetime of a signed URL; zero means
	// DefaultSiteURLTTL (5 min). A request may ask for up to MaxSiteURLTTL.
	URLTTL time.Duration
	// CookieTTL is the lifetime of the site cookie a signed URL is
	// exchanged for; zero means DefaultSiteCookieTTL. Whatever it is, the
	// cookie works only while its bearer token is live and its account a
	// member of the site's project.
	CookieTTL time.Duration
}

func (o *SitesOptions) normalize() error {
	o.Domain = strings.TrimSuffix(strings.ToLower(strings.TrimSpace(o.Domain)), ".")
	if o.Domain != "" {
		for _, l := range strings.Split(o.Domain, ".") {
			if !sites.ValidName(l) {
				return fmt.Errorf("daemon: sites domain %q is not a DNS name", o.Domain)
			}
		}
	}
	switch o.Scheme {
	case "":
		o.Scheme = "https"
	case "http", "https":
	default:
		return fmt.Errorf("daemon: sites scheme %q: want http or https", o.Scheme)
	}
	if o.Port < 0 || o.Port > 65535 {
		return fmt.Errorf("daemon: sites port %d is not in 0-65535", o.Port)
	}
	if o.URLTTL <= 0 {
		o.URLTTL = DefaultSiteURLTTL
	}
	o.URLTTL = min(o.URLTTL, MaxSiteURLTTL)
	if o.CookieTTL <= 0 {
		o.CookieTTL = DefaultSiteCookieTTL
	}
	return nil
}

// sitesGateway serves sites: by Host (NAME.D, when a sites domain is set)
// and by path (/sites/{name}/…). It is mounted when the app is built and
// never unmounted. On every request it resolves the sites control through
// the registry (503 with the reason when the domain is absent, disabled or
// failed), authorizes the visitor (401/403), looks the name up (404),
// checks that the visitor is a member of the site's project (403), and
// proxies the request — HTTP or a WebSocket upgrade — to the published port
// on the loopback of the project's machine, through the machine gateway's
// net-dial (503 "no privileged transport in this process" without a
// transport, 502 when the port cannot be reached).
//
// What crosses to the site: never the Authorization header nor the
// gateway's own cookie; by path (the API's origin) no Cookie header at all,
// and no Set-Cookie, Clear-Site-Data or Service-Worker-Allowed back; by
// host, the site's own cookies both ways, its Set-Cookie made host-only
// (a Domain attribute is removed, so a site cannot set cookies on D, on
// other sites or on the API's domain).
type sitesGateway struct {
	a         *App
	opts      SitesOptions
	key       *siteKey
	transport *http.Transport
	proxy     *httputil.ReverseProxy
	host      http.Handler // wrap of serveHost
}

type siteTargetKey struct{}

func newSitesGateway(a *App, opts SitesOptions) *sitesGateway {
	g := &sitesGateway{a: a, opts: opts, key: &siteKey{}}
	if a.opts.StateDir != "" {
		g.key.path = filepath.Join(a.opts.StateDir, SitesKeyFile)
	}
	g.transport = &http.Transport{
		DialContext:           g.dial,
		MaxIdleConnsPerHost:   8,
		IdleConnTimeout:       30 * time.Second,
		ResponseHeaderTimeout: 5 * time.Minute,
		ForceAttemptHTTP2:     false,
	}
	g.proxy = &httputil.ReverseProxy{
		Rewrite:        g.rewrite,
		Transport:      g.transport,
		ModifyResponse: g.modifyResponse,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			var ended *sessionEnded
			if c := context.Cause(r.Context()); errors.As(c, &ended) {
				writeError(w, &APIError{Status: http.StatusForbidden, Kind: KindForbidden, Message: "site access ended: " + ended.reason, Cause: c})
				return
			}
			writeError(w, toAPIError(&siteDialError{err}))
		},
	}
	g.host = a.wrap(Route{Pattern: "{site}." + cmp.Or(opts.Domain, "-") + "/{path...}", handler: g.serveHost})
	return g
}

func (g *sitesGateway) close() { g.transport.CloseIdleConnections() }

// cookieName is the name of the gateway's cookie on site origins.
func (g *sitesGateway) cookieName() string {
	if g.opts.Scheme == "https" {
		return siteCookieSecure
	}
	return siteCookie
}

// hostSite reports whether host is under the sites domain, and the site
// name it names ("" when it is the domain itself or deeper than one label).
func (g *sitesGateway) hostSite(host string) (name string, under bool) {
	d := g.opts.Domain
	if d == "" {
		return "", false
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if host == d {
		return "", true
	}
	name, ok := strings.CutSuffix(host, "."+d)
	if !ok {
		return "", false
	}
	if !sites.ValidName(name) {
		return "", true
	}
	return name, true
}

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
		return fmt.Sprintf("site unreachable: %s", rej.Message)
	}
	return "site unreachable"
}

type siteTarget struct {
	site   sites.Site
	byHost bool
	prefix string // by path: "/sites/NAME"
	rest   string // by path: the path below the prefix
}

func (g *sitesGateway) rewrite(pr *httputil.ProxyRequest) {
	t := pr.In.Context().Value(siteTargetKey{}).(siteTarget)
	pr.SetURL(&url.URL{Scheme: "http", Host: fmt.Sprintf("%d-%d%s", t.site.Project, t.site.Port, siteHostSuffix)})
	if t.byHost {
		pr.Out.URL.Path, pr.Out.URL.RawPath = pr.In.URL.Path, pr.In.URL.RawPath
	} else {
		pr.Out.URL.Path = "/" + t.rest
		pr.Out.URL.RawPath = ""
	}
	pr.Out.URL.RawQuery = pr.In.URL.RawQuery
	pr.Out.Host = pr.In.Host
	pr.SetXForwarded()
	if !t.byHost {
		pr.Out.Header.Set("X-Forwarded-Prefix", t.prefix)
	}
	// The visitor's credentials never reach the machine: not its bearer
	// token, not the gateway's cookie, and by path (the API's origin) no
	// cookie at all.
	pr.Out.Header.Del("Authorization")
	if t.byHost {
		stripCookies(pr.Out.Header, siteCookie, siteCookieSecure)
	} else {
		pr.Out.Header.Del("Cookie")
	}
}

// stripCookies removes the named cookies from h's Cookie headers, keeping
// the others.
func stripCookies(h http.Header, names ...string) {
	var keep []string
	for _, line := range h.Values("Cookie") {
		var parts []string
		for _, c := range strings.Split(line, ";") {
			n, _, _ := strings.Cut(strings.TrimSpace(c), "=")
			if n == "" || slices.Contains(names, n) {
				continue
			}
			parts = append(parts, strings.TrimSpace(c))
		}
		if len(parts) > 0 {
			keep = append(keep, strings.Join(parts, "; "))
		}
	}
	h.Del("Cookie")
	if len(keep) > 0 {
		h.Set("Cookie", strings.Join(keep, "; "))
	}
}

// modifyResponse keeps the site's response from reaching beyond its
// origin.
func (g *sitesGateway) modifyResponse(resp *http.Response) error {
	t, _ := resp.Request.Context().Value(siteTargetKey{}).(siteTarget)
	h := resp.Header
	if !t.byHost {
		// The site shares the API's origin: it may not set or clear
		// anything there.
		h.Del("Set-Cookie")
		h.Del("Clear-Site-Data")
		h.Del("Service-Worker-Allowed")
		return nil
	}
	var out []string
	for _, sc := range h.Values("Set-Cookie") {
		if c, ok := hostOnlyCookie(sc); ok {
			out = append(out, c)
		}
	}
	h.Del("Set-Cookie")
	for _, c := range out {
		h.Add("Set-Cookie", c)
	}
	return nil
}

// hostOnlyCookie returns a Set-Cookie value without its Domain attribute
// (a cookie then belongs to the exact host that set it), and false for a
// cookie that would shadow the gateway's own.
func hostOnlyCookie(sc string) (string, bool) {
	attrs := strings.Split(sc, ";")
	name, _, _ := strings.Cut(strings.TrimSpace(attrs[0]), "=")
	if name == siteCookie || name == siteCookieSecure {
		return "", false
	}
	kept := attrs[:1]
	for _, a := range attrs[1:] {
		k, _, _ := strings.Cut(strings.TrimSpace(a), "=")
		if strings.EqualFold(strings.TrimSpace(k), "domain") {
			continue
		}
		kept = append(kept, a)
	}
	return strings.Join(kept, ";"), true
}

// resolve returns the sites control, through the registry, at call time.
func (g *sitesGateway) resolve() (sites.Control, error) {
	ctl, err := plugin.ResolveCoreAs[sites.Control](g.a.core.Registry(), plugin.DomainSites)
	if err != nil {
		msg := "sites are unavailable"
		var re *plugin.ResolveError
		if errors.As(err, &re) && re.Reason != "" {
			msg += ": " + re.Reason
		}
		// A plugin disabled by configuration or failed before it
		// registered owns nothing: say what became of the built-in one.
		if st, ok := g.a.core.Registry().Status(sites.Name); ok && st.State != plugin.StateLoaded {
			msg = fmt.Sprintf("sites are unavailable: plugin %s is %s: %s", st.Name, st.State, st.Reason)
		}
		return nil, &APIError{Status: http.StatusServiceUnavailable, Kind: KindUnavailable, Message: msg, Cause: err}
	}
	return ctl, nil
}

// viaUnix reports whether r came over a Unix socket.
func viaUnix(r *http.Request) bool {
	addr, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	return ok && addr.Network() == "unix"
}

// serve serves /sites/{name}/{path...}: by path, on the API's origin. With
// a sites domain, only on the Unix socket (a browser reaches a site on its
// own origin instead).
func (g *sitesGateway) serve(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	if g.opts.Domain != "" && !viaUnix(r) {
		return apiErr(http.StatusNotFound, KindNotFound, "sites are served on their own origin: %s.%s", name, g.opts.Domain)
	}
	ctl, err := g.resolve()
	if err != nil {
		return err
	}
	site, err := ctl.Lookup(r.Context(), name)
	if err != nil {
		return err
	}
	acct, _, _, err := g.a.member(r, site.Project)
	if err != nil {
		var ae *APIError
		if errors.As(err, &ae) && ae.Status == http.StatusNotFound {
			// A non-member learns no more than of a name nobody
			// published (the lookup's own answer), not even the
			// project's id.
			return fmt.Errorf("%w: %q", sites.ErrNotFound, name)
		}
		return err
	}
	// The token's id, to close the connection if it is revoked.
	tok, _ := bearerToken(r)
	_, tokenID, err := g.a.store.AuthenticateToken(r.Context(), tok)
	if err != nil {
		return apiErr(http.StatusUnauthorized, KindUnauthorized, "the bearer token is not valid")
	}
	t := siteTarget{site: site, prefix: "/sites/" + name, rest: r.PathValue("path")}
	g.forward(w, r, t, tokenID, acct.ID)
	return nil
}

// forward proxies r to t's site, tracked under the token and account that
// authorized it.
func (g *sitesGateway) forward(w http.ResponseWriter, r *http.Request, t siteTarget, token, account int64) {
	// A session of its own: the checker ends it when the token is
	// revoked or the account leaves the site's project (follow.go).
	ctx, done := g.a.track(r.Context(), account, token, t.site.Project)
	defer done()
	g.proxy.ServeHTTP(w, r.WithContext(context.WithValue(ctx, siteTargetKey{}, t)))
}

// siteVisitor is who a site request is authorized for.
type siteVisitor struct {
	account, token int64
	project        int64 // from a signed value; 0 for a bearer token
	byCookie       bool
}

// serveHost serves a request whose Host is NAME.D.
func (g *sitesGateway) serveHost(w http.ResponseWriter, r *http.Request) error {
	name, _ := g.hostSite(r.Host)
	if name == "" {
		return apiErr(http.StatusNotFound, KindNotFound, "no site at %q: the sites domain %s serves no API", r.Host, g.opts.Domain)
	}
	ctx := r.Context()
	now := time.Now()
	if q := r.URL.Query(); q.Has(SiteTokenParam) {
		return g.exchange(w, r, name, q.Get(SiteTokenParam), now)
	}
	v, err := g.visitor(r, name, now)
	if err != nil {
		return err
	}
	if v.byCookie && crossSite(r) {
		return apiErr(http.StatusForbidden, KindForbidden, "site %s refuses a %s %s request from another site with its cookie", name, r.Header.Get("Sec-Fetch-Mode"), r.Method)
	}
	site, err := g.authorize(ctx, name, v)
	if err != nil {
		return err
	}
	r = r.WithContext(withAccount(ctx, store.Account{ID: v.account}))
	g.forward(w, r, siteTarget{site: site, byHost: true}, v.token, v.account)
	return nil
}

// crossSite reports whether a browser says r comes from another origin
// (Sec-Fetch-Site) for anything but a top-level GET navigation: mode
// "navigate" with destination "document" (a browser that sends no
// Sec-Fetch-Dest is taken at its mode's word; "iframe", "frame",
// "embed" and "object" are framed, not top-level). Sites are same-site to
// one another under D, so SameSite=Lax alone would let one site's page
// send requests carrying another site's cookie, or frame another site.
func crossSite(r *http.Request) bool {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "", "same-origin", "none":
		return false
	}
	switch r.Header.Get("Sec-Fetch-Dest") {
	case "", "document":
	default:
		return true
	}
	return !(r.Header.Get("Sec-Fetch-Mode") == "navigate" && (r.Method == http.MethodGet || r.Method == http.MethodHead))
}

// visitor authenticates a site request: a bearer token (non-browser
// clients), else the gateway's cookie for this site.
func (g *sitesGateway) visitor(r *http.Request, name string, now time.Time) (siteVisitor, error) {
	if tok, ok := bearerToken(r); ok {
		acct, id, err := g.a.store.AuthenticateToken(r.Context(), tok)
		if errors.Is(err, store.ErrNotFound) {
			return siteVisitor{}, apiErr(http.StatusUnauthorized, KindUnauthorized, "the bearer token is not valid")
		}
		if err != nil {
			return siteVisitor{}, err
		}
		return siteVisitor{account: acct.ID, token: id}, nil
	}
	var found bool
	for _, c := range r.Cookies() {
		if c.Name != g.cookieName() {
			continue
		}
		found = true
		cl, err := g.key.verify(c.Value, purposeCookie, name, now)
		if err == nil {
			return siteVisitor{account: cl.account, token: cl.token, project: cl.project, byCookie: true}, nil
		}
		if !errors.Is(err, errBadSiteCredential) {
			return siteVisitor{}, err
		}
	}
	if found {
		return siteVisitor{}, apiErr(http.StatusForbidden, KindForbidden, "the site cookie is not valid for %s (expired or altered): open a new signed URL", name)
	}
	return siteVisitor{}, apiErr(http.StatusUnauthorized, KindUnauthorized, "a signed site URL or a bearer token is required")
}

// authorize checks v may visit site name now: the site exists (and is
// still the project's the credential was signed for), the token is live,
// the account a member of the project.
func (g *sitesGateway) authorize(ctx context.Context, name string, v siteVisitor) (sites.Site, error) {
	ctl, err := g.resolve()
	if err != nil {
		return sites.Site{}, err
	}
	site, err := ctl.Lookup(ctx, name)
	if err != nil {
		return sites.Site{}, err
	}
	if v.project != 0 && v.project != site.Project {
		return sites.Site{}, apiErr(http.StatusForbidden, KindForbidden, "site %s is now published by another project: open a new signed URL", name)
	}
	if _, err := g.a.store.LiveToken(ctx, v.token); errors.Is(err, store.ErrNotFound) {
		return sites.Site{}, apiErr(http.StatusForbidden, KindForbidden, "the token this access was granted with was revoked")
	} else if err != nil {
		return sites.Site{}, err
	}
	if _, err := g.a.store.GetMember(ctx, site.Project, v.account); errors.Is(err, store.ErrNotFound) {
		return sites.Site{}, apiErr(http.StatusForbidden, KindForbidden, "account %d is not a member of project %d", v.account, site.Project)
	} else if err != nil {
		return sites.Site{}, err
	}
	return site, nil
}

// exchange turns a signed URL's token into the site's cookie and redirects
// to the same URL without the token.
func (g *sitesGateway) exchange(w http.ResponseWriter, r *http.Request, name, tok string, now time.Time) error {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return apiErr(http.StatusMethodNotAllowed, KindInvalid, "a signed site URL is opened with GET")
	}
	cl, err := g.key.verify(tok, purposeURL, name, now)
	if errors.Is(err, errBadSiteCredential) {
		return apiErr(http.StatusForbidden, KindForbidden, "the signed URL is not valid for site %s (expired, altered or for another site)", name)
	}
	if err != nil {
		return err
	}
	if _, err := g.authorize(r.Context(), name, siteVisitor{account: cl.account, token: cl.token, project: cl.project}); err != nil {
		return err
	}
	cl.purpose, cl.expires = purposeCookie, now.Add(g.opts.CookieTTL)
	val, err := g.key.sign(cl)
	if err != nil {
		return err
	}
	http.SetCookie(w, &http.Cookie{
		Name:     g.cookieName(),
		Value:    val,
		Path:     "/",
		MaxAge:   int(g.opts.CookieTTL / time.Second),
		HttpOnly: true,
		Secure:   g.opts.Scheme == "https",
		SameSite: http.SameSiteLaxMode,
	})
	// An absolute URL on the same host: a path such as //evil.example/
	// stays a path of this site.
	u := url.URL{Scheme: g.opts.Scheme, Host: r.Host, Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: withoutParam(r.URL.RawQuery, SiteTokenParam)}
	if u.Path == "" {
		u.Path = "/"
	}
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Referrer-Policy", "no-referrer")
	http.Redirect(w, r, u.String(), http.StatusSeeOther)
	return nil
}

// withoutParam removes parameter name from a raw query, keeping the rest
// as it was written.
func withoutParam(raw, name string) string {
	var keep []string
	for _, kv := range strings.Split(raw, "&") {
		k, _, _ := strings.Cut(kv, "=")
		if uk, err := url.QueryUnescape(k); kv == "" || (err == nil && uk == name) {
			continue
		}
		keep = append(keep, kv)
	}
	return strings.Join(keep, "&")
}

// signURL returns a signed URL of site opening path, valid for ttl.
func (g *sitesGateway) signURL(site sites.Site, path string, account, token int64, ttl time.Duration) (string, time.Time, error) {
	ref, err := url.Parse(path)
	if err != nil || ref.Scheme != "" || ref.Host != "" || ref.User != nil || !strings.HasPrefix(ref.Path, "/") {
		return "", time.Time{}, apiErr(http.StatusBadRequest, KindInvalid, "path %q: want an absolute path (with an optional query)", path)
	}
	exp := time.Now().Add(ttl).Truncate(time.Second)
	tok, err := g.key.sign(siteClaims{purpose: purposeURL, site: site.Name, project: site.Project, account: account, token: token, expires: exp})
	if err != nil {
		return "", time.Time{}, err
	}
	host := site.Name + "." + g.opts.Domain
	if g.opts.Port != 0 {
		host = net.JoinHostPort(host, strconv.Itoa(g.opts.Port))
	}
	q := withoutParam(ref.RawQuery, SiteTokenParam)
	if q != "" {
		q += "&"
	}
	u := url.URL{Scheme: g.opts.Scheme, Host: host, Path: ref.Path, RawPath: ref.RawPath, RawQuery: q + SiteTokenParam + "=" + url.QueryEscape(tok), Fragment: ref.Fragment}
	return u.String(), exp, nil
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
	out := make([]api.Site, 0, len(list))
	for _, s := range list {
		out = append(out, siteJSON(s))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// siteJSON is s as the API shows it.
func siteJSON(s sites.Site) api.Site {
	return api.Site{Name: s.Name, ProjectID: s.Project, Port: s.Port, PublishedBy: s.By, Published: s.Published}
}

func (a *App) publishSite(w http.ResponseWriter, r *http.Request) error {
	acct, p, _, err := a.projectMember(r)
	if err != nil {
		return err
	}
	var req api.SiteRequest
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
	writeJSON(w, http.StatusOK, siteJSON(s))
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

// siteURL mints a signed URL of a site of the project, for the caller's
// account and bearer token.
func (a *App) siteURL(w http.ResponseWriter, r *http.Request) error {
	acct, p, _, err := a.projectMember(r)
	if err != nil {
		return err
	}
	var req api.SiteURLRequest
	if r.ContentLength != 0 {
		if err := a.decodeBody(w, r, &req); err != nil {
			return err
		}
	}
	if a.sites.opts.Domain == "" {
		return apiErr(http.StatusServiceUnavailable, KindUnavailable, "this daemon serves sites by path only: signed URLs need a sites domain (corral daemon --sites-domain)")
	}
	ttl := a.sites.opts.URLTTL
	if req.ExpiresInSeconds < 0 || time.Duration(req.ExpiresInSeconds)*time.Second > MaxSiteURLTTL {
		return apiErr(http.StatusBadRequest, KindInvalid, "expiresInSeconds %d is not in 0-%d", req.ExpiresInSeconds, int(MaxSiteURLTTL/time.Second))
	} else if req.ExpiresInSeconds > 0 {
		ttl = time.Duration(req.ExpiresInSeconds) * time.Second
	}
	ctl, err := a.sites.resolve()
	if err != nil {
		return err
	}
	site, err := ctl.Lookup(r.Context(), r.PathValue("name"))
	if err != nil {
		return err
	}
	if site.Project != p.ID {
		return apiErr(http.StatusNotFound, KindNotFound, "project %d publishes no site %q", p.ID, site.Name)
	}
	tok, _ := bearerToken(r)
	_, tokenID, err := a.store.AuthenticateToken(r.Context(), tok)
	if err != nil {
		return apiErr(http.StatusUnauthorized, KindUnauthorized, "the bearer token is not valid")
	}
	u, exp, err := a.sites.signURL(site, cmp.Or(req.Path, "/"), acct.ID, tokenID, ttl)
	if err != nil {
		return err
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, api.SiteURL{URL: u, Expires: exp})
	return nil
}
