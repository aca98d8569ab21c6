package egress

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/elazarl/goproxy"
)

// HTTPPort and SOCKSPort are the loopback ports of a proxy-mode machine's
// proxies, as sessions' proxy environment names them.
const (
	HTTPPort  = 3128
	SOCKSPort = 1080
)

type dialKey struct{}

// ServeHTTP serves an HTTP proxy on ln for m: CONNECT tunnels (no TLS
// interception) and plain http:// requests, each checked against m's
// policy when it arrives. A refusal is answered 403 with a body naming the
// rule. It returns when ln is closed (by Close or the caller), closing ln.
func (m *Machine) ServeHTTP(ln net.Listener) error {
	if !m.track(ln) {
		return net.ErrClosed
	}
	defer m.untrack(ln)
	return m.serveHTTP(ln)
}

// serveHTTP is ServeHTTP for a tracked listener.
func (m *Machine) serveHTTP(ln net.Listener) error {
	ln = bounded{ln, m}
	p := goproxy.NewProxyHttpServer()
	p.Logger = log.New(io.Discard, "", 0)
	p.Tr = &http.Transport{
		DisableKeepAlives:     true, // one upstream connection, one journal row, per request
		ResponseHeaderTimeout: m.s.opts.IdleTimeout,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if c, ok := ctx.Value(dialKey{}).(net.Conn); ok {
				return c, nil
			}
			return nil, errors.New("egress: unchecked dial")
		},
	}
	p.ConnectionErrHandler = func(w io.Writer, ctx *goproxy.ProxyCtx, err error) {
		_ = refusal(ctx.Req, err).Write(w)
	}
	p.OnRequest().HandleConnectFunc(func(host string, ctx *goproxy.ProxyCtx) (*goproxy.ConnectAction, string) {
		name, port, err := splitHostPort(host, 443)
		if err != nil {
			ctx.Resp = textResponse(ctx.Req, http.StatusBadRequest, err.Error()+"\n")
			return goproxy.RejectConnect, host
		}
		nc, err := m.open(ctx.Req.Context(), "connect", name, port)
		if err != nil {
			ctx.Resp = refusal(ctx.Req, err)
			return goproxy.RejectConnect, host
		}
		used := false
		ctx.Dialer = func(context.Context, string, string) (net.Conn, error) {
			if used {
				return nil, errors.New("egress: second dial for one CONNECT")
			}
			used = true
			return nc, nil
		}
		return goproxy.OkConnect, host
	})
	p.OnRequest().DoFunc(func(r *http.Request, ctx *goproxy.ProxyCtx) (*http.Request, *http.Response) {
		if r.URL.Scheme != "http" || r.URL.Host == "" {
			return r, textResponse(r, http.StatusBadRequest, "corral egress: only http:// URLs and CONNECT are proxied\n")
		}
		name, port, err := splitHostPort(r.URL.Host, 80)
		if err != nil {
			return r, textResponse(r, http.StatusBadRequest, err.Error()+"\n")
		}
		nc, err := m.open(r.Context(), "http", name, port)
		if err != nil {
			return r, refusal(r, err)
		}
		return r.WithContext(context.WithValue(r.Context(), dialKey{}, nc)), nil
	})
	srv := &http.Server{Handler: p, ReadHeaderTimeout: 30 * time.Second, IdleTimeout: m.s.opts.IdleTimeout,
		ErrorLog: log.New(io.Discard, "", 0)}
	err := srv.Serve(ln)
	srv.Close()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

func deniedBody(rule string) string {
	return fmt.Sprintf("corral egress: connection not allowed by the project's network policy (%s)\n", rule)
}

// refusal is the answer to a request the proxy could not connect: 502 with
// the error, or, for a denial, 403 with the reason where clients show it —
// a CONNECT's body is read by few (curl prints only the status code), so
// the reason is also in the status line's reason phrase (Python's and Go's
// clients print it: "Tunnel connection failed: 403 Forbidden by corral
// egress (no allow rule)"), in X-Corral-Egress-Denied (curl -v) and in a
// Proxy-Status header (RFC 9209).
func refusal(r *http.Request, err error) *http.Response {
	rule, ok := IsDenied(err)
	if !ok {
		return textResponse(r, http.StatusBadGateway, fmt.Sprintf("corral egress: %v\n", err))
	}
	resp := textResponse(r, http.StatusForbidden, deniedBody(rule))
	rule = strings.Map(func(c rune) rune {
		if c < 0x20 || c == 0x7f || c == '"' || c == '\\' {
			return '?'
		}
		return c
	}, rule)
	resp.Status = fmt.Sprintf("%d Forbidden by corral egress (%s)", http.StatusForbidden, rule)
	resp.Header.Set("X-Corral-Egress-Denied", rule)
	resp.Header.Set("Proxy-Status", fmt.Sprintf(`corral-egress; error=destination_ip_prohibited; details="not allowed by the project's network policy (%s)"`, rule))
	return resp
}

func textResponse(r *http.Request, status int, body string) *http.Response {
	return &http.Response{
		StatusCode: status, Status: fmt.Sprintf("%d %s", status, http.StatusText(status)),
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Request: r, Close: true,
		Header:        http.Header{"Content-Type": {"text/plain; charset=utf-8"}},
		ContentLength: int64(len(body)), Body: io.NopCloser(bytes.NewReader([]byte(body))),
	}
}

// splitHostPort splits "host[:port]", defaulting the port.
func splitHostPort(s string, def int) (string, int, error) {
	host, ps, err := net.SplitHostPort(s)
	if err != nil {
		if strings.Contains(err.Error(), "missing port") {
			return strings.Trim(s, "[]"), def, nil
		}
		return "", 0, fmt.Errorf("corral egress: bad host %q", s)
	}
	port, err := strconv.Atoi(ps)
	if err != nil || port < 1 || port > 65535 {
		return "", 0, fmt.Errorf("corral egress: bad port in %q", s)
	}
	return host, port, nil
}
