package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/api"
)

// sitesTestDomain is the sites domain of these tests.
const sitesTestDomain = "sites.test"

// siteClient sends requests to addr (network "unix" or "tcp") whatever
// the URL's host, and does not follow redirects.
func siteClient(network, addr string) *http.Client {
	return &http.Client{
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// siteDo sends method u with the given headers (name, value pairs) and
// returns the response with its body read.
func siteDo(t *testing.T, c *http.Client, method, u string, headers ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

// mintSiteURL asks the API (over the Unix socket) for a signed URL.
func (e *env) mintSiteURL(project int64, name, token string, body any) (int, string) {
	e.t.Helper()
	status, b := e.do(context.Background(), "POST", fmt.Sprintf("/v1/projects/%d/sites/%s/url", project, name), token, body)
	if status != 200 {
		return status, string(b)
	}
	var v api.SiteURL
	if err := json.Unmarshal(b, &v); err != nil || v.URL == "" || v.Expires.IsZero() {
		e.t.Fatalf("signed URL: %s (%v)", b, err)
	}
	return status, v.URL
}

// siteCookieOf returns the gateway cookie a response sets, failing t if
// there is none.
func siteCookieOf(t *testing.T, resp *http.Response, name string) *http.Cookie {
	t.Helper()
	for _, c := range resp.Cookies() {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no %s cookie in %v", name, resp.Header.Values("Set-Cookie"))
	return nil
}

// TestSitesOriginAuth drives the host-routed gateway's authorization
// without a machine: every refusal, and that an accepted credential gets as
// far as the (absent) transport. Requests go over the Unix socket with a
// Host under the sites domain.
func TestSitesOriginAuth(t *testing.T) {
	e := newEnv(t, envOpts{app: AppOptions{Sites: SitesOptions{Domain: sitesTestDomain, Scheme: "http", Port: 8443}}})
	alice, tok := e.account("alice")
	_, stranger := e.account("mallory")
	box := e.managedProject("box", alice)
	other := e.managedProject("other", alice)
	ctx := context.Background()
	for _, s := range []struct {
		p    int64
		name string
	}{{box.ID, "app"}, {box.ID, "twin"}, {other.ID, "elsewhere"}} {
		if status, body := e.do(ctx, "PUT", fmt.Sprintf("/v1/projects/%d/sites/%s", s.p, s.name), tok, map[string]int{"port": 8000}); status != 200 {
			t.Fatalf("publish %s: %d %s", s.name, status, body)
		}
	}
	c := siteClient("unix", e.sock)

	status, u := e.mintSiteURL(box.ID, "app", tok, map[string]any{"path": "/a/b?x=1&y=2"})
	if status != 200 {
		t.Fatalf("mint: %d %s", status, u)
	}
	pu, err := url.Parse(u)
	if err != nil || pu.Scheme != "http" || pu.Host != "app.sites.test:8443" || pu.Path != "/a/b" || pu.Query().Get("x") != "1" || pu.Query().Get(SiteTokenParam) == "" {
		t.Fatalf("signed URL %s", u)
	}
	if cu, err := e.client(tok).SiteURL(ctx, box.ID, "app", "", time.Minute); err != nil || !strings.HasPrefix(cu, "http://app.sites.test:8443/?"+SiteTokenParam+"=") {
		t.Errorf("client.SiteURL: %q %v", cu, err)
	}
	// Minting: members only, the project's own sites, bounded expiry.
	for _, tc := range []struct {
		name, token, site string
		project           int64
		body              any
		status            int
	}{
		{"stranger", stranger, "app", box.ID, nil, 403},
		{"anonymous", "", "app", box.ID, nil, 401},
		{"another project's site", tok, "elsewhere", box.ID, nil, 404},
		{"unknown site", tok, "nope", box.ID, nil, 404},
		{"too long", tok, "app", box.ID, map[string]any{"expiresInSeconds": 7200}, 400},
		{"not a path", tok, "app", box.ID, map[string]any{"path": "https://evil.example/"}, 400},
	} {
		if status, body := e.mintSiteURL(tc.project, tc.site, tc.token, tc.body); status != tc.status {
			t.Errorf("mint, %s: %d %s", tc.name, status, body)
		}
	}

	// The exchange: a cookie of that origin only, and a redirect to the
	// same URL without the token.
	resp, body := siteDo(t, c, "GET", u)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "http://app.sites.test:8443/a/b?x=1&y=2" {
		t.Fatalf("exchange: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	// A path that looks like another host stays on the site.
	resp, _ = siteDo(t, c, "GET", "http://app.sites.test//evil.example/x?"+SiteTokenParam+"="+url.QueryEscape(pu.Query().Get(SiteTokenParam)))
	if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusSeeOther || loc != "http://app.sites.test//evil.example/x" {
		t.Errorf("exchange of //evil.example/x: %d Location %q", resp.StatusCode, loc)
	}
	ck := siteCookieOf(t, resp, siteCookie)
	if !ck.HttpOnly || ck.Secure || ck.SameSite != http.SameSiteLaxMode || ck.Path != "/" || ck.Domain != "" || ck.MaxAge <= 0 {
		t.Errorf("cookie attributes: %s", resp.Header.Get("Set-Cookie"))
	}
	if strings.Contains(strings.ToLower(resp.Header.Get("Set-Cookie")), "domain") {
		t.Errorf("cookie has a Domain: %s", resp.Header.Get("Set-Cookie"))
	}
	cookie := siteCookie + "=" + ck.Value

	tamper := func(s string) string {
		i := len(s) / 2
		ch := byte('A')
		if s[i] == 'A' {
			ch = 'B'
		}
		return s[:i] + string(ch) + s[i+1:]
	}
	q := pu.Query()
	tokVal := q.Get(SiteTokenParam)
	withToken := func(host, v string) string {
		return fmt.Sprintf("http://%s/?%s=%s", host, SiteTokenParam, url.QueryEscape(v))
	}
	expired, err := e.app.sites.key.sign(siteClaims{purpose: purposeURL, site: "app", project: box.ID, account: alice.ID, token: 1, expires: time.Now().Add(-time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		u       string
		headers []string
		status  int
	}{
		{"anonymous", "http://app.sites.test/", nil, 401},
		{"tampered URL token", withToken("app.sites.test", tamper(tokVal)), nil, 403},
		{"expired URL token", withToken("app.sites.test", expired), nil, 403},
		{"site A's URL token on site B", withToken("twin.sites.test", tokVal), nil, 403},
		{"URL token as a cookie", "http://app.sites.test/", []string{"Cookie", siteCookie + "=" + tokVal}, 403},
		{"cookie as a URL token", withToken("app.sites.test", ck.Value), nil, 403},
		{"tampered cookie", "http://app.sites.test/", []string{"Cookie", siteCookie + "=" + tamper(ck.Value)}, 403},
		{"site A's cookie on site B", "http://twin.sites.test/", []string{"Cookie", cookie}, 403},
		{"stranger's bearer", "http://app.sites.test/", []string{"Authorization", "Bearer " + stranger}, 403},
		{"cookie, cross-site fetch", "http://app.sites.test/", []string{"Cookie", cookie, "Sec-Fetch-Site", "same-site", "Sec-Fetch-Mode", "cors"}, 403},
		// Issue 24 attack 10: a framed navigation is no top-level one.
		{"cookie, iframe navigation from another site", "http://app.sites.test/", []string{"Cookie", cookie, "Sec-Fetch-Site", "same-site", "Sec-Fetch-Mode", "navigate", "Sec-Fetch-Dest", "iframe"}, 403},
		{"cookie, frame navigation from another site", "http://app.sites.test/", []string{"Cookie", cookie, "Sec-Fetch-Site", "cross-site", "Sec-Fetch-Mode", "navigate", "Sec-Fetch-Dest", "frame"}, 403},
		{"unknown site", "http://nope.sites.test/", []string{"Authorization", "Bearer " + tok}, 404},
		// Accepted: as far as the missing transport.
		{"cookie", "http://app.sites.test/x", []string{"Cookie", "mine=1; " + cookie}, 503},
		{"cookie, cross-site navigation", "http://app.sites.test/", []string{"Cookie", cookie, "Sec-Fetch-Site", "cross-site", "Sec-Fetch-Mode", "navigate"}, 503},
		{"cookie, cross-site top-level navigation", "http://app.sites.test/", []string{"Cookie", cookie, "Sec-Fetch-Site", "cross-site", "Sec-Fetch-Mode", "navigate", "Sec-Fetch-Dest", "document"}, 503},
		{"bearer", "http://APP.sites.test.:1234/", []string{"Authorization", "Bearer " + tok}, 503},
		// The API is not served under the sites domain.
		{"API under the domain", "http://sites.test/v1/whoami", []string{"Authorization", "Bearer " + tok}, 404},
		{"API under a deeper name", "http://a.b.sites.test/v1/whoami", []string{"Authorization", "Bearer " + tok}, 404},
		{"API under a site", "http://app.sites.test/v1/projects", []string{"Authorization", "Bearer " + stranger}, 403},
	} {
		resp, body := siteDo(t, c, "GET", tc.u, tc.headers...)
		if resp.StatusCode != tc.status {
			t.Errorf("%s: %d %s", tc.name, resp.StatusCode, body)
		}
		if strings.Contains(body, `"name":"alice"`) || strings.Contains(body, `"name":"box"`) {
			t.Errorf("%s: the API answered: %s", tc.name, body)
		}
	}

	// The cookie stops working as soon as its token is revoked.
	toks, err := e.st.ListTokens(ctx, alice.ID)
	if err != nil || len(toks) != 1 {
		t.Fatal(toks, err)
	}
	if err := e.st.RevokeToken(ctx, toks[0].ID); err != nil {
		t.Fatal(err)
	}
	if resp, body := siteDo(t, c, "GET", "http://app.sites.test/", "Cookie", cookie); resp.StatusCode != 403 || !strings.Contains(body, "revoked") {
		t.Errorf("cookie of a revoked token: %d %s", resp.StatusCode, body)
	}
}

// TestSitesPathRoutingUnixOnly: with a sites domain, /sites/NAME/ is not
// served on TCP (the API's origin), and the API still is.
func TestSitesPathRoutingUnixOnly(t *testing.T) {
	e := newEnv(t, envOpts{app: AppOptions{Sites: SitesOptions{Domain: sitesTestDomain}}})
	alice, tok := e.account("alice")
	box := e.managedProject("box", alice)
	ctx := context.Background()
	if status, body := e.do(ctx, "PUT", fmt.Sprintf("/v1/projects/%d/sites/app", box.ID), tok, map[string]int{"port": 8000}); status != 200 {
		t.Fatalf("publish: %d %s", status, body)
	}
	addr := e.serveTCP()
	tc := siteClient("tcp", addr)
	if resp, body := siteDo(t, tc, "GET", "http://"+addr+"/sites/app/", "Authorization", "Bearer "+tok); resp.StatusCode != 404 || !strings.Contains(body, "app.sites.test") {
		t.Errorf("path routing on TCP: %d %s", resp.StatusCode, body)
	}
	if resp, body := siteDo(t, tc, "GET", "http://"+addr+"/v1/whoami", "Authorization", "Bearer "+tok); resp.StatusCode != 200 {
		t.Errorf("API on TCP: %d %s", resp.StatusCode, body)
	}
	// On the socket, path routing stays (here: as far as the transport).
	if status, body := e.do(ctx, "GET", "/sites/app/", tok, nil); status != 503 {
		t.Errorf("path routing on the socket: %d %s", status, body)
	}
}

// serveTCP serves the env's app on a loopback TCP listener too, until the
// test ends, and returns its address.
func (e *env) serveTCP() string {
	e.t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		e.t.Fatal(err)
	}
	return e.serveOn(ln)
}

func (e *env) serveOn(ln net.Listener) string {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, e.app, []net.Listener{ln}, testLogger(e.t)) }()
	// Registered after newEnv's: runs before the app closes.
	e.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("Serve TCP: %v", err)
		}
	})
	return ln.Addr().String()
}

// TestSitesSurviveRestart: publications and the signing key outlive the
// daemon: after a restart on the same state directory the name is still
// the project's (another project gets 409), and a URL signed before the
// restart still opens the site.
func TestSitesSurviveRestart(t *testing.T) {
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	opts := envOpts{dir: dir, app: AppOptions{Sites: SitesOptions{Domain: sitesTestDomain, Scheme: "http"}}}
	var signed string
	t.Run("before", func(t *testing.T) {
		e := newEnv(t, opts)
		alice, tok := e.account("alice")
		bob, _ := e.account("bob")
		box := e.managedProject("box", alice)
		e.managedProject("theirs", bob)
		if status, body := e.do(context.Background(), "PUT", fmt.Sprintf("/v1/projects/%d/sites/app", box.ID), tok, map[string]int{"port": 8000}); status != 200 {
			t.Fatalf("publish: %d %s", status, body)
		}
		var status int
		if status, signed = e.mintSiteURL(box.ID, "app", tok, nil); status != 200 {
			t.Fatalf("mint: %d %s", status, signed)
		}
		st, err := os.Stat(filepath.Join(dir, SitesKeyFile))
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("key file: %v %v", st, err)
		}
	})
	e := newEnv(t, opts)
	ctx := context.Background()
	bob, err := e.st.AccountByName(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	bobTok, _, err := e.st.CreateToken(ctx, bob.ID, "again")
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := e.st.ProjectByName(ctx, "theirs")
	if err != nil {
		t.Fatal(err)
	}
	box, err := e.st.ProjectByName(ctx, "box")
	if err != nil {
		t.Fatal(err)
	}
	status, body := e.do(ctx, "PUT", fmt.Sprintf("/v1/projects/%d/sites/app", theirs.ID), bobTok, map[string]int{"port": 9000})
	if status != http.StatusConflict {
		t.Errorf("another project takes the name after a restart: %d %s", status, body)
	}
	// Bob is no member of box: he can neither unpublish nor list it.
	if status, body := e.do(ctx, "DELETE", fmt.Sprintf("/v1/projects/%d/sites/app", box.ID), bobTok, nil); status != 403 {
		t.Errorf("unpublish by a stranger: %d %s", status, body)
	}
	pub, err := e.st.GetPublication(ctx, "app")
	if err != nil || pub.Project != box.ID || pub.Port != 8000 {
		t.Errorf("publication after restart: %+v %v", pub, err)
	}
	resp, body2 := siteDo(t, siteClient("unix", e.sock), "GET", signed)
	if resp.StatusCode != http.StatusSeeOther {
		t.Errorf("URL signed before the restart: %d %s", resp.StatusCode, body2)
	}
}

// TestSiteKeyRefused: a signing key others can read is not used.
func TestSiteKeyRefused(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, SitesKeyFile)
	if err := os.WriteFile(path, make([]byte, 32), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	k := &siteKey{path: path}
	if _, err := k.sign(siteClaims{purpose: purposeURL, site: "x", expires: time.Now().Add(time.Minute)}); err == nil || !strings.Contains(err.Error(), "mode") {
		t.Errorf("world-readable key: %v", err)
	}
	k2 := &siteKey{path: filepath.Join(dir, "new.key")}
	v, err := k2.sign(siteClaims{purpose: purposeURL, site: "x", expires: time.Now().Add(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	// A second loader reads the same key from the file.
	if _, err := (&siteKey{path: k2.path}).verify(v, purposeURL, "x", time.Now()); err != nil {
		t.Errorf("key not persisted: %v", err)
	}
}
