package mcpserver

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/corral-sandbox/corral/client"
)

// Handler serves the tools over MCP's streamable HTTP transport for a
// daemon, statelessly: every POST is one exchange, answered with JSON; the
// server keeps no session between requests (nothing for a tenant to pile
// up, no session id another caller could present).
//
// A tool call acts as the account of the bearer token of the HTTP request
// that carried it: the call's API is the Go client with that token,
// talking to the daemon's API handler over in-process connections (no
// socket). Each of its requests is therefore authenticated, checked for
// membership and bounded like any other request of that account, and a
// revoked token fails the next call. The in-process connections are on a
// network of their own ("pipe"): none of the privileges of the daemon's
// Unix socket apply to them.
type Handler struct {
	mcp  http.Handler
	ln   *pipeListener
	srv  *http.Server
	tr   *http.Transport
	done chan struct{}
}

// NewHandler returns the MCP handler of the daemon whose API is api. The
// handler serves api over in-process connections until Close.
func NewHandler(api http.Handler, opts Options) *Handler {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ln := &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
	h := &Handler{
		ln:   ln,
		srv:  &http.Server{Handler: api, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)},
		tr:   &http.Transport{DialContext: ln.dial},
		done: make(chan struct{}),
	}
	go func() {
		defer close(h.done)
		_ = h.srv.Serve(ln)
	}()
	// client.New cannot fail on a URL.
	base, _ := client.New("http://corral", "")
	base = base.WithHTTPClient(&http.Client{Transport: h.tr})
	server := New(func(_ context.Context, req *mcp.CallToolRequest) (API, error) {
		tok, ok := bearerToken(req.Extra)
		if !ok {
			return nil, errors.New("the request carried no bearer token")
		}
		return base.WithToken(tok), nil
	}, opts)
	h.mcp = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, &mcp.StreamableHTTPOptions{
		Stateless:           true,
		JSONResponse:        true,
		MaxRequestBodyBytes: MaxRequest,
		Logger:              log,
	})
	return h
}

// ServeHTTP serves one MCP exchange (POST). The caller has authenticated
// the request's bearer token; the tools authenticate it again, on every
// call.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mcp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), requestKey{}, r.Context())))
}

// requestKey holds the context of the HTTP request that carries a call.
type requestKey struct{}

// withRequest returns ctx, ended also when the HTTP request that carried
// the call ends (its client went away): the SDK keeps the values of that
// request's context in its calls' contexts but, for protocol versions
// before 2026-07-28, not its cancellation. stop releases the link.
func withRequest(ctx context.Context) (_ context.Context, stop func()) {
	rc, ok := ctx.Value(requestKey{}).(context.Context)
	if !ok {
		return ctx, func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	unlink := context.AfterFunc(rc, cancel)
	return ctx, func() { unlink(); cancel() }
}

// Close ends the in-process API connections (tool calls in flight fail) and
// waits for their server to stop. Idempotent.
func (h *Handler) Close() error {
	err := h.srv.Close()
	<-h.done
	h.tr.CloseIdleConnections()
	return err
}

// bearerToken returns the token of the "Authorization: Bearer" header of
// the HTTP request that carried a call.
func bearerToken(extra *mcp.RequestExtra) (string, bool) {
	if extra == nil {
		return "", false
	}
	scheme, tok, ok := strings.Cut(extra.Header.Get("Authorization"), " ")
	tok = strings.TrimSpace(tok)
	return tok, ok && strings.EqualFold(scheme, "Bearer") && tok != ""
}

// pipeListener is a net.Listener of in-process connections (net.Pipe).
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

// dial returns the client's end of a new connection, once the server has
// taken the other.
func (l *pipeListener) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	c, s := net.Pipe()
	select {
	case l.conns <- s:
		return c, nil
	case <-l.done:
		err := net.ErrClosed
		c.Close()
		s.Close()
		return nil, err
	case <-ctx.Done():
		c.Close()
		s.Close()
		return nil, ctx.Err()
	}
}

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "mcp" }
