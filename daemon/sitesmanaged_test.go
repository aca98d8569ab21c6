package daemon

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/testenv"
	"github.com/corral-sandbox/corral/internal/testworker"
	"github.com/corral-sandbox/corral/machine"
	"github.com/corral-sandbox/corral/projects"
	"github.com/corral-sandbox/corral/worker"
)

// siteServer is the site of TestSitesOwnOriginManaged, run inside the
// machine: /echo answers with the Cookie and Authorization headers it
// received, /set sets cookies (one trying to widen itself to the sites
// domain, one to the API's host, one shadowing the gateway's), /slow
// streams for a minute, / is a page for the browser.
const siteServer = `
import http.server, time
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    def log_message(self, *a): pass
    def send(self, body, extra=()):
        b = body.encode()
        self.send_response(200)
        for k, v in extra:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)
    def do_GET(self):
        if self.path.startswith("/echo"):
            self.send("cookie=[%s] auth=[%s] path=%s" % (self.headers.get("Cookie", ""), self.headers.get("Authorization", ""), self.path))
        elif self.path == "/set":
            self.send("set", [("Set-Cookie", "own=1; Path=/; HttpOnly"),
                              ("Set-Cookie", "wide=1; Domain=sites.test; Path=/"),
                              ("Set-Cookie", "api=1; Path=/; domain=127.0.0.1"),
                              ("Set-Cookie", "corral-site=forged; Path=/"),
                              ("Clear-Site-Data", '"cookies"')])
        elif self.path == "/slow":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(600):
                self.wfile.write(b"1\r\nx\r\n")
                self.wfile.flush()
                time.sleep(0.1)
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.send("<html><body><h1 id=hello>hello from the site</h1></body></html>", [("Content-Type", "text/html")])
http.server.ThreadingHTTPServer(("127.0.0.1", 8000), H).serve_forever()
`

// TestSitesOwnOriginManaged: a real daemon on a TCP listener with a sites
// domain, a real worker, and a site process in a managed machine. The
// site never receives the visitor's bearer token, the gateway's cookie or
// (by path) the API origin's cookies; it cannot set cookies beyond its own
// host; a signed URL opens it in headless Chromium without a bearer
// header; revoking the token closes a streaming connection within seconds.
func TestSitesOwnOriginManaged(t *testing.T) {
	requireRoot(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	e := newManagedEnvWith(t, AppOptions{Sites: SitesOptions{Domain: sitesTestDomain, Scheme: "http", Port: port}})
	addr := e.serveOn(ln)
	alice, tok := e.account("alice")
	p := e.managedProject("box", alice)
	if err := os.WriteFile(filepath.Join(p.Root, "site.py"), []byte(siteServer), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	srv, _, err := e.dialSession(ctx, tok, p.ID, "python3", "site.py")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.CloseNow()
	go func() { _ = readSession(ctx, srv) }()
	if status, body := e.do(ctx, "PUT", fmt.Sprintf("/v1/projects/%d/sites/app", p.ID), tok, map[string]int{"port": 8000}); status != 200 {
		t.Fatalf("publish: %d %s", status, body)
	}
	tcp := siteClient("tcp", addr)
	site := fmt.Sprintf("http://app.%s:%d", sitesTestDomain, port)
	bearer := []string{"Authorization", "Bearer " + tok}
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, _ := siteDo(t, tcp, "GET", site+"/echo", bearer...)
		if resp.StatusCode != http.StatusBadGateway || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}

	// Bearer and API-origin credentials stay out of the site.
	resp, body := siteDo(t, tcp, "GET", site+"/echo?q=1", "Authorization", "Bearer "+tok, "Cookie", "mine=1")
	if resp.StatusCode != 200 || body != "cookie=[mine=1] auth=[] path=/echo?q=1" {
		t.Fatalf("echo with a bearer: %d %s", resp.StatusCode, body)
	}
	_, u := e.mintSiteURL(p.ID, "app", tok, map[string]any{"path": "/echo"})
	resp, body = siteDo(t, tcp, "GET", u)
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("exchange: %d %s", resp.StatusCode, body)
	}
	ck := siteCookieOf(t, resp, siteCookie)
	cookie := []string{"Cookie", "mine=1; " + siteCookie + "=" + ck.Value + "; theirs=2"}
	resp, body = siteDo(t, tcp, "GET", resp.Header.Get("Location"), cookie...)
	if resp.StatusCode != 200 || body != "cookie=[mine=1; theirs=2] auth=[] path=/echo" {
		t.Errorf("echo with the cookie: %d %s", resp.StatusCode, body)
	}
	// The site's cookies stay host-only on its origin; it cannot shadow
	// the gateway's.
	resp, _ = siteDo(t, tcp, "GET", site+"/set", cookie...)
	got := resp.Header.Values("Set-Cookie")
	want := []string{"own=1; Path=/; HttpOnly", "wide=1; Path=/", "api=1; Path=/"}
	if !slices.Equal(got, want) {
		t.Errorf("Set-Cookie by host:\n got %q\nwant %q", got, want)
	}
	// By path (the API's origin, the Unix socket): no cookie reaches the
	// site, none comes back.
	req, _ := http.NewRequest("GET", "http://corral/sites/app/echo", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Cookie", "api-session=secret")
	presp, err := e.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	pbody := readAll(t, presp)
	if presp.StatusCode != 200 || pbody != "cookie=[] auth=[] path=/echo" {
		t.Errorf("echo by path: %d %s", presp.StatusCode, pbody)
	}
	req, _ = http.NewRequest("GET", "http://corral/sites/app/set", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	presp, err = e.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, presp)
	if sc := presp.Header.Values("Set-Cookie"); len(sc) != 0 || presp.Header.Get("Clear-Site-Data") != "" {
		t.Errorf("by path the site set %q / cleared %q on the API origin", sc, presp.Header.Get("Clear-Site-Data"))
	}
	// And not by path on TCP at all.
	if resp, body := siteDo(t, tcp, "GET", "http://"+addr+"/sites/app/echo", bearer...); resp.StatusCode != 404 {
		t.Errorf("path routing on TCP: %d %s", resp.StatusCode, body)
	}

	t.Run("chromium", func(t *testing.T) {
		bin, err := exec.LookPath("chromium")
		if err != nil {
			t.Skip("chromium is not installed (Debian package chromium; .ci/run installs it)")
		}
		_, u := e.mintSiteURL(p.ID, "app", tok, nil)
		cctx, ccancel := context.WithTimeout(ctx, 60*time.Second)
		defer ccancel()
		cmd := exec.CommandContext(cctx, bin, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
			"--disable-component-update", "--no-first-run", "--user-data-dir="+t.TempDir(),
			"--host-resolver-rules=MAP *."+sitesTestDomain+" 127.0.0.1", "--dump-dom", u)
		cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("chromium: %v\n%s", err, out)
		}
		if !strings.Contains(string(out), `<h1 id="hello">hello from the site</h1>`) {
			t.Errorf("chromium did not show the site:\n%s", out)
		}
		// Without the signed URL, the browser is refused.
		cmd = exec.CommandContext(cctx, bin, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
			"--disable-component-update", "--no-first-run", "--user-data-dir="+t.TempDir(),
			"--host-resolver-rules=MAP *."+sitesTestDomain+" 127.0.0.1", "--dump-dom", site+"/")
		cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
		out, _ = cmd.Output()
		if strings.Contains(string(out), "hello from the site") || !strings.Contains(string(out), "unauthorized") {
			t.Errorf("chromium without a signed URL:\n%s", out)
		}
	})

	// Revoking the token closes a streaming response it authorized (the
	// session checker), and refuses the cookie from then on.
	sreq, _ := http.NewRequestWithContext(ctx, "GET", site+"/slow", nil)
	sreq.Header.Set(cookie[0], cookie[1])
	sresp, err := tcp.Do(sreq)
	if err != nil || sresp.StatusCode != 200 {
		t.Fatalf("slow: %v %v", sresp, err)
	}
	defer sresp.Body.Close()
	br := bufio.NewReader(sresp.Body)
	if _, err := br.ReadByte(); err != nil {
		t.Fatal(err)
	}
	toks, err := e.st.ListTokens(ctx, alice.ID)
	if err != nil || len(toks) != 1 {
		t.Fatal(toks, err)
	}
	revoked := time.Now()
	if err := e.st.RevokeToken(ctx, toks[0].ID); err != nil {
		t.Fatal(err)
	}
	n := 0
	for {
		if _, err := br.ReadByte(); err != nil {
			break
		}
		n++
	}
	if took := time.Since(revoked); took > 5*time.Second {
		t.Errorf("the stream outlived its token by %v (%d bytes)", took, n)
	}
	t.Logf("stream closed %v after the revocation", time.Since(revoked))
	if resp, body := siteDo(t, tcp, "GET", site+"/echo", cookie...); resp.StatusCode != 403 {
		t.Errorf("cookie after the revocation: %d %s", resp.StatusCode, body)
	}
	srv.CloseNow()
	testenv.WaitFor(t, 5*time.Second, "the server's lease to be released", func() bool { return e.liveLeases() == 0 })
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	var b strings.Builder
	if _, err := bufio.NewReader(resp.Body).WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// newManagedEnvWith is newManagedEnv with app options.
func newManagedEnvWith(t *testing.T, app AppOptions) *env {
	t.Helper()
	requireRoot(t)
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(projects.WorkspacesDir(dir), 0o711); err != nil {
		t.Fatal(err)
	}
	w := testworker.Start(t, testworker.Options{
		ProjectsRoot: projects.WorkspacesDir(dir),
		Limits:       worker.Limits{Memory: 256 << 20, Pids: 128},
		Logger:       testLogger(t),
	})
	return newEnv(t, envOpts{dir: dir, transport: machine.SocketTransport{Path: w.Socket}, app: app})
}
