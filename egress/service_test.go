package egress

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeResolver maps names to addresses; other names do not exist.
type fakeResolver map[string][]string

func (f fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	var out []netip.Addr
	for _, s := range f[host] {
		out = append(out, netip.MustParseAddr(s))
	}
	if out == nil {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return out, nil
}

type recorder struct {
	mu   sync.Mutex
	recs []Record
	ch   chan Record
}

func (r *recorder) add(x Record) {
	r.mu.Lock()
	r.recs = append(r.recs, x)
	r.mu.Unlock()
	r.ch <- x
}

// next returns the next record, waiting for it.
func (r *recorder) next(t *testing.T) Record {
	t.Helper()
	select {
	case x := <-r.ch:
		return x
	case <-time.After(10 * time.Second):
		t.Fatal("no audit record")
		return Record{}
	}
}

type fixture struct {
	m          *Machine
	rec        *recorder
	httpProxy  string // host:port
	socksProxy string
	upstream   *httptest.Server
	port       int // the upstream's port
}

// newFixture serves m's proxies on host loopback (the real service gets its
// listeners from the machine; a listener is a listener), with an upstream
// HTTP server on 127.0.0.1, reachable as up.test and evil.test, the floor
// opened for 127.0.0.0/8.
func newFixture(t *testing.T, p Policy, mod func(*Options)) *fixture {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n := r.URL.Query().Get("bytes"); n != "" {
			var k int
			fmt.Sscan(n, &k)
			w.Write(make([]byte, k))
			return
		}
		if r.URL.Path == "/host" {
			fmt.Fprint(w, r.Host)
			return
		}
		fmt.Fprintf(w, "hello from upstream %s", r.URL.Path)
	}))
	t.Cleanup(up.Close)
	floor, err := NewFloor([]string{"127.0.0.0/8"}, false)
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{ch: make(chan Record, 100)}
	opts := Options{Floor: floor, Audit: rec.add, Resolver: fakeResolver{
		"up.test": {"127.0.0.1"}, "also.test": {"127.0.0.2"}, "evil.test": {"169.254.169.254"},
		"mixed.test": {"127.0.0.1", "10.0.0.1"},
	}}
	if mod != nil {
		mod(&opts)
	}
	s, err := NewService(opts)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.NewMachine(7, 42, p)
	if err != nil {
		t.Fatal(err)
	}
	hl, _ := net.Listen("tcp", "127.0.0.1:0")
	sl, _ := net.Listen("tcp", "127.0.0.1:0")
	go m.ServeHTTP(hl)
	go m.ServeSOCKS5(sl)
	t.Cleanup(func() { m.Close() })
	_, ps, _ := net.SplitHostPort(up.Listener.Addr().String())
	var port int
	fmt.Sscan(ps, &port)
	return &fixture{m: m, rec: rec, httpProxy: hl.Addr().String(), socksProxy: sl.Addr().String(), upstream: up, port: port}
}

func (f *fixture) client() *http.Client {
	u, _ := url.Parse("http://" + f.httpProxy)
	return &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(u), DisableKeepAlives: true}, Timeout: 10 * time.Second}
}

func (f *fixture) get(t *testing.T, host, path string) (int, string) {
	t.Helper()
	resp, err := f.client().Get(fmt.Sprintf("http://%s:%d%s", host, f.port, path))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// connect opens a CONNECT tunnel and returns the status line and the
// connection.
func (f *fixture) connect(t *testing.T, target string) (string, net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", f.httpProxy)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		return resp.Status + " " + string(b) + "X-Corral-Egress-Denied: " + resp.Header.Get("X-Corral-Egress-Denied"), c, br
	}
	return resp.Status, c, br
}

// socks sends a SOCKS5 CONNECT for host:port and returns the reply code
// and the connection.
func (f *fixture) socks(t *testing.T, host string, port int) (byte, net.Conn) {
	t.Helper()
	c, err := net.Dial("tcp", f.socksProxy)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	c.Write([]byte{5, 1, 0})
	var sel [2]byte
	if _, err := io.ReadFull(c, sel[:]); err != nil || sel != [2]byte{5, 0} {
		t.Fatalf("method selection %v, %v", sel, err)
	}
	req := []byte{5, 1, 0}
	if a, err := netip.ParseAddr(host); err == nil && a.Is4() {
		req = append(append(req, 1), a.AsSlice()...)
	} else {
		req = append(append(req, 3, byte(len(host))), host...)
	}
	req = binary.BigEndian.AppendUint16(req, uint16(port))
	c.Write(req)
	var rep [10]byte
	if _, err := io.ReadFull(c, rep[:]); err != nil {
		t.Fatalf("socks reply: %v", err)
	}
	return rep[1], c
}

// proxyPolicy is a proxy-mode policy: allow is comma-separated.
func proxyPolicy(allow string, deny ...string) Policy {
	return Policy{Mode: ModeProxy, Allow: strings.Split(allow, ","), Deny: deny}
}

func TestHTTPAllowedAndJournaled(t *testing.T) {
	f := newFixture(t, proxyPolicy("up.test"), nil)
	code, body := f.get(t, "up.test", "/x")
	if code != 200 || body != "hello from upstream /x" {
		t.Fatalf("GET = %d %q", code, body)
	}
	r := f.rec.next(t)
	if r.Verdict != VerdictAllowed || r.Rule != "up.test" || r.Name != "up.test" || r.Addr != "127.0.0.1" ||
		r.Port != f.port || r.Protocol != "http" || r.Account != 7 || r.Project != 42 || r.BytesIn == 0 || r.BytesOut == 0 {
		t.Errorf("record %+v", r)
	}
}

func TestConnectAllowed(t *testing.T) {
	f := newFixture(t, proxyPolicy("up.test"), nil)
	status, c, br := f.connect(t, fmt.Sprintf("up.test:%d", f.port))
	if !strings.HasPrefix(status, "200") {
		t.Fatalf("CONNECT: %s", status)
	}
	fmt.Fprintf(c, "GET /tunnel HTTP/1.1\r\nHost: up.test\r\nConnection: close\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if string(b) != "hello from upstream /tunnel" {
		t.Errorf("through the tunnel: %q", b)
	}
	c.Close()
	if r := f.rec.next(t); r.Verdict != VerdictAllowed || r.Protocol != "connect" || r.BytesIn == 0 {
		t.Errorf("record %+v", r)
	}
}

func TestDeniedAndNotAllowed(t *testing.T) {
	f := newFixture(t, proxyPolicy("*.test", "also.test"), nil)
	// also.test is denied (deny wins over *.test); other.test is allowed by
	// name but does not resolve; 127.0.0.9 has no allow rule.
	for _, tt := range []struct{ host, rule string }{{"also.test", "also.test"}, {"127.0.0.9", ReasonNoAllowRule}} {
		code, body := f.get(t, tt.host, "/")
		if code != 403 || !strings.Contains(body, "not allowed") || !strings.Contains(body, tt.rule) {
			t.Errorf("GET %s = %d %q", tt.host, code, body)
		}
		if r := f.rec.next(t); r.Verdict != VerdictDenied || r.Rule != tt.rule {
			t.Errorf("record %+v", r)
		}
		status, _, _ := f.connect(t, fmt.Sprintf("%s:%d", tt.host, f.port))
		// The reason in the status line, where clients print it.
		if want := "403 Forbidden by corral egress (" + tt.rule + ") "; !strings.HasPrefix(status, want) || !strings.Contains(status, "not allowed") ||
			!strings.HasSuffix(status, "X-Corral-Egress-Denied: "+tt.rule) {
			t.Errorf("CONNECT %s: %q, want %q…", tt.host, status, want)
		}
		if r := f.rec.next(t); r.Verdict != VerdictDenied || r.Protocol != "connect" {
			t.Errorf("record %+v", r)
		}
		if code, _ := f.socks(t, tt.host, f.port); code != socksNotAllowed {
			t.Errorf("SOCKS5 %s: reply %d, want 2", tt.host, code)
		}
		if r := f.rec.next(t); r.Verdict != VerdictDenied || r.Protocol != "socks5" {
			t.Errorf("record %+v", r)
		}
	}
}

func TestSOCKS5Allowed(t *testing.T) {
	f := newFixture(t, proxyPolicy("up.test,127.0.0.0/8"), nil)
	for _, host := range []string{"up.test", "127.0.0.1"} {
		code, c := f.socks(t, host, f.port)
		if code != socksOK {
			t.Fatalf("SOCKS5 %s: reply %d", host, code)
		}
		fmt.Fprintf(c, "GET /s HTTP/1.1\r\nHost: up.test\r\nConnection: close\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		if string(b) != "hello from upstream /s" {
			t.Errorf("through SOCKS5: %q", b)
		}
		c.Close()
		if r := f.rec.next(t); r.Verdict != VerdictAllowed || r.Protocol != "socks5" {
			t.Errorf("record %+v", r)
		}
	}
}

// TestFloorBeatsAllow: a name the policy allows that resolves onto the
// floor (rebinding onto the metadata address, or onto loopback when the
// operator has not opened it) is refused; so is a name with one bad
// address among good ones.
func TestFloorBeatsAllow(t *testing.T) {
	f := newFixture(t, proxyPolicy("evil.test,mixed.test,up.test,0.0.0.0/0"), nil)
	for _, host := range []string{"evil.test", "mixed.test", "169.254.169.254"} {
		code, body := f.get(t, host, "/")
		if code != 403 || !strings.Contains(body, ReasonFloor) {
			t.Errorf("GET %s = %d %q", host, code, body)
		}
		if r := f.rec.next(t); r.Verdict != VerdictDenied || r.Rule != ReasonFloor || r.Addr == "" {
			t.Errorf("record %+v", r)
		}
	}
	closed := newFixture(t, proxyPolicy("up.test"), func(o *Options) {
		o.Floor, _ = NewFloor(nil, false)
	})
	if code, _ := closed.get(t, "up.test", "/"); code != 403 {
		t.Errorf("up.test (127.0.0.1) without the allow-cidr: %d", code)
	}
	if code, _ := closed.socks(t, "up.test", closed.port); code != socksNotAllowed {
		t.Errorf("SOCKS5 to loopback without the allow-cidr: reply %d", code)
	}
}

func TestModeNoneRefuses(t *testing.T) {
	f := newFixture(t, Policy{}, nil)
	if code, _ := f.get(t, "up.test", "/"); code != 403 {
		t.Errorf("mode none: %d", code)
	}
	if r := f.rec.next(t); r.Rule != ReasonModeNone {
		t.Errorf("record %+v", r)
	}
}

func TestPolicyChangeAppliesToNextConnection(t *testing.T) {
	f := newFixture(t, proxyPolicy("up.test"), nil)
	status, c, _ := f.connect(t, fmt.Sprintf("up.test:%d", f.port))
	if !strings.HasPrefix(status, "200") {
		t.Fatal(status)
	}
	if err := f.m.SetPolicy(proxyPolicy("up.test", "up.test")); err != nil {
		t.Fatal(err)
	}
	if code, _ := f.get(t, "up.test", "/"); code != 403 {
		t.Errorf("after deny: %d", code)
	}
	// The open tunnel still works.
	fmt.Fprintf(c, "GET /still HTTP/1.1\r\nHost: up.test\r\nConnection: close\r\n\r\n")
	b, _ := io.ReadAll(c)
	if !strings.Contains(string(b), "hello from upstream /still") {
		t.Errorf("open tunnel after the change: %q", b)
	}
	if err := f.m.SetPolicy(Policy{Mode: ModeProxy, Allow: []string{"bad rule"}}); err == nil {
		t.Error("SetPolicy accepted a bad policy")
	}
}

func TestConnectionLimit(t *testing.T) {
	f := newFixture(t, proxyPolicy("up.test"), func(o *Options) { o.MaxConns = 1 })
	status, c, _ := f.connect(t, fmt.Sprintf("up.test:%d", f.port))
	if !strings.HasPrefix(status, "200") {
		t.Fatal(status)
	}
	// The second connection, while the first is open, is refused.
	if code, body := f.get(t, "up.test", "/"); code != 403 || !strings.Contains(body, "limit") {
		t.Errorf("second connection: %d %q", code, body)
	}
	if r := f.rec.next(t); r.Verdict != VerdictDenied || !strings.HasPrefix(r.Rule, "limit") {
		t.Errorf("record %+v", r)
	}
	c.Close()
	if r := f.rec.next(t); r.Verdict != VerdictAllowed { // the tunnel's end frees the slot
		t.Errorf("record %+v", r)
	}
	if code, _ := f.get(t, "up.test", "/"); code != 200 {
		t.Errorf("after the first closed: %d", code)
	}
}

// TestByteRate: a machine limited to 64 KiB/s takes at least two seconds
// (less its one-second burst) to move 192 KiB. A lower bound only.
func TestByteRate(t *testing.T) {
	f := newFixture(t, proxyPolicy("up.test"), func(o *Options) { o.BytesPerSecond = 64 << 10 })
	start := time.Now()
	code, body := f.get(t, "up.test", "/?bytes=196608")
	if code != 200 || len(body) != 196608 {
		t.Fatalf("GET = %d, %d bytes", code, len(body))
	}
	if d := time.Since(start); d < 1900*time.Millisecond {
		t.Errorf("192 KiB at 64 KiB/s took %v", d)
	}
}

func TestIdleTimeout(t *testing.T) {
	silent, _ := net.Listen("tcp", "127.0.0.1:0")
	defer silent.Close()
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			defer c.Close() // says nothing, ever
		}
	}()
	f := newFixture(t, proxyPolicy("127.0.0.0/8"), func(o *Options) { o.IdleTimeout = 200 * time.Millisecond })
	status, c, _ := f.connect(t, silent.Addr().String())
	if !strings.HasPrefix(status, "200") {
		t.Fatal(status)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadAll(c); err != nil {
		t.Errorf("tunnel not closed by the idle timeout: %v", err)
	}
	if r := f.rec.next(t); r.Verdict != VerdictAllowed || r.Duration < 200*time.Millisecond {
		t.Errorf("record %+v", r)
	}
}

// TestHostHeaderIgnored: a plain HTTP request that names an allowed host in
// its URI and another in its Host header reaches the allowed host under
// the allowed name (the URI wins, RFC 9112 §3.2.2): no virtual host the
// policy never saw.
func TestHostHeaderIgnored(t *testing.T) {
	f := newFixture(t, proxyPolicy("up.test"), nil)
	c, err := net.Dial("tcp", f.httpProxy)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET http://up.test:%d/host HTTP/1.1\r\nHost: evil.test\r\nConnection: close\r\n\r\n", f.port)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if want := fmt.Sprintf("up.test:%d", f.port); resp.StatusCode != 200 || string(b) != want {
		t.Errorf("the upstream saw Host %q (%s), want %q", b, resp.Status, want)
	}
}

// TestIdleClientsBounded is an attack: a guest opening connections to its
// proxies and sending nothing held one accepted descriptor (and a
// goroutine) each in the process that serves the egress — the daemon —
// for the 30 s handshake deadline, again and again: twenty thousand of
// them exhaust the daemon's descriptors, and every tenant's API calls and
// database opens fail. A machine's proxies hold at most 2×MaxConns
// accepted connections together; one beyond that is closed at once.
func TestIdleClientsBounded(t *testing.T) {
	f := newFixture(t, proxyPolicy("up.test"), func(o *Options) { o.MaxConns = 4 })
	const limit = 8
	greet := func(addr string) (net.Conn, error) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(10 * time.Second))
		c.Write([]byte{5, 1, 0})
		var sel [2]byte
		_, err = io.ReadFull(c, sel[:])
		return c, err
	}
	// The limit's worth idle in SOCKS5 handshakes, each being served.
	for range limit {
		if _, err := greet(f.socksProxy); err != nil {
			t.Fatalf("a connection within the limit: %v", err)
		}
	}
	// Beyond it, connections to either proxy are closed unserved.
	for i := range 20 {
		addr := f.socksProxy
		if i%2 == 1 {
			addr = f.httpProxy
		}
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if addr == f.socksProxy {
			c.Write([]byte{5, 1, 0})
		} else {
			fmt.Fprintf(c, "GET http://up.test:%d/ HTTP/1.1\r\nHost: up.test\r\n\r\n", f.port)
		}
		if n, err := c.Read(make([]byte, 64)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("connection %d beyond the limit was served: %d bytes, %v", i, n, err)
		}
	}
}
