package daemon

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/coder/websocket"

	"github.com/corral-sandbox/corral/plugin"
	"github.com/corral-sandbox/corral/plugins/lsp"
	"github.com/corral-sandbox/corral/sandbox"
)

// Language-server sessions: GET /v1/projects/{id}/lsp/{server} upgrades to
// a WebSocket carrying one language server's LSP JSON-RPC messages. The
// server (configured by name in the lsp plugin) runs in the project's
// machine; host projects are refused (400).
//
//	client → daemon   text   one JSON-RPC message (a JSON object), framed
//	                         with Content-Length onto the server's stdin
//	daemon → client   text   one JSON-RPC message the server wrote
//
// There is no other message: the WebSocket's close frame says how the
// session ended.
//
//	1000  the server exited with code 0 (reason "exited: …")
//	1001  the daemon is shutting down
//	1008  the session lost its authorization (token revoked, account
//	      deleted or removed from the project, lifetime reached)
//	1003  the client sent a binary message
//	1007  the client sent a text message that is not one JSON object
//	1009  the client sent a message over the limit (16 MiB)
//	1011  the server broke the framing, exited otherwise, its lease
//	      heartbeat failed, or its transport failed ("<reason>: <message>")
//
// The close frame is sent once the server has been torn down (its process
// tree cancelled unless it exited, its lease released). The client closing
// the socket tears the server down the same way. The plugin heartbeats the
// session's lease every 5 s while it lives.
//
// Errors before the upgrade are ordinary JSON error responses: 401 and 403
// before any provider is contacted, 404 for an unknown project or server,
// 400 without an upgrade or for a host project or refused preparation, 422
// when the server cannot be started, 503 without the lsp or sandbox domain
// or a privileged transport.

func (a *App) lspSession(w http.ResponseWriter, r *http.Request) error {
	acct, proj, _, err := a.projectMember(r)
	if err != nil {
		return err
	}
	server := r.PathValue("server")
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		return apiErr(http.StatusBadRequest, KindInvalid, "a WebSocket upgrade is required")
	}
	ctl, err := plugin.ResolveCoreAs[lsp.Domain](a.core.Registry(), plugin.DomainLSP)
	if err != nil {
		return err
	}
	if !ctl.HasServer(server) {
		return apiErr(http.StatusNotFound, KindNotFound, "no language server %q (configured: %s)", server, strings.Join(ctl.Servers(), ", "))
	}
	sess, err := ctl.Open(r.Context(), sandbox.Actor{AccountUserID: acct.ID}, projectRef(proj), server)
	if err != nil {
		return err
	}
	conn, err := websocket.Accept(w, r, nil)
	if err != nil {
		if cerr := sess.Close(); cerr != nil {
			a.log.Warn("lsp: close", "lease", sess.LeaseID(), "err", cerr)
		}
		return &APIError{Status: http.StatusBadRequest, Kind: KindInvalid, Message: "WebSocket upgrade failed", Cause: err}
	}
	if !a.enterSession() {
		_ = sess.Close()
		_ = conn.Close(websocket.StatusGoingAway, "the daemon is shutting down")
		return nil
	}
	defer a.wg.Done()
	a.metrics.sessionsTotal.Inc()
	a.metrics.sessionsActive.Inc()
	defer a.metrics.sessionsActive.Dec()
	ctx, untrack := a.trackSession(a.ctx, r, proj.ID)
	defer untrack()
	a.bridgeLSP(ctx, conn, sess, ctl.MaxMessage())
	return nil
}

// errLSPBinary marks a binary message from the client.
var errLSPBinary = errors.New("binary messages are not LSP messages; send JSON-RPC as text")

// bridgeLSP carries messages between conn and sess until either ends, and
// leaves the server torn down and conn closed.
func (a *App) bridgeLSP(parent context.Context, conn *websocket.Conn, sess *lsp.Session, maxMessage int) {
	// As in wsSession.run: the socket's context ends only when the bridge
	// returns, so that the close frame goes first.
	ctx, cancel := context.WithCancel(context.WithoutCancel(parent))
	defer cancel()
	conn.SetReadLimit(int64(maxMessage))

	// Client → server. Returns why it stopped: the socket failed or
	// closed, the client sent a binary message, or the session ended
	// (an error matching lsp.ErrClosed).
	fromClient := make(chan error, 1)
	go func() {
		for {
			typ, data, err := conn.Read(ctx)
			if err != nil {
				fromClient <- err
				return
			}
			if typ != websocket.MessageText {
				fromClient <- errLSPBinary
				return
			}
			if err := sess.Send(data); err != nil {
				fromClient <- err
				return
			}
		}
	}()
	// Server → client, until the session ends or the socket fails.
	toClientDone := make(chan struct{})
	go func() {
		defer close(toClientDone)
		for {
			m, err := sess.ReadMessage(ctx)
			if err != nil {
				return
			}
			if err := conn.Write(ctx, websocket.MessageText, m); err != nil {
				return
			}
		}
	}()

	select {
	case <-sess.Done():
		// The session ended by itself (or because of what the client
		// sent): the server is torn down; say why.
		code, reason := lspCloseStatus(sess.Err())
		_ = conn.Close(code, reason)
	case err := <-fromClient:
		fromClient <- err // for the wait below
		switch {
		case errors.Is(err, errLSPBinary):
			_ = sess.Close()
			_ = conn.Close(websocket.StatusUnsupportedData, clipReason(err.Error()))
		case errors.Is(err, lsp.ErrClosed):
			<-sess.Done()
			code, reason := lspCloseStatus(sess.Err())
			_ = conn.Close(code, reason)
		default:
			// The client went away or broke the WebSocket protocol
			// (coder/websocket already answered, e.g. 1009).
			_ = conn.CloseNow()
			_ = sess.Close()
		}
	case <-parent.Done():
		_ = sess.Close()
		_ = conn.Close(sessionCloseStatus(parent))
	}
	cancel()
	_ = conn.CloseNow()
	<-fromClient
	<-toClientDone
	if err := sess.Close(); err != nil {
		a.log.Warn("lsp: session teardown", "lease", sess.LeaseID(), "err", err)
	}
}

// lspCloseStatus maps why a session ended onto a WebSocket close frame.
func lspCloseStatus(err error) (websocket.StatusCode, string) {
	var ce *lsp.CloseError
	if !errors.As(err, &ce) {
		return websocket.StatusInternalError, "session ended"
	}
	code := websocket.StatusInternalError
	switch ce.Reason {
	case lsp.ReasonExited:
		if ce.Exit != nil && ce.Exit.Code != nil && *ce.Exit.Code == 0 {
			code = websocket.StatusNormalClosure
		}
	case lsp.ReasonClientProtocol:
		code = websocket.StatusInvalidFramePayloadData
		if errors.Is(ce, lsp.ErrTooLarge) {
			code = websocket.StatusMessageTooBig
		}
	case lsp.ReasonClosed:
		code = websocket.StatusNormalClosure
	}
	return code, clipReason(string(ce.Reason) + ": " + ce.Message)
}

// clipReason fits a close reason into a control frame (123 bytes).
func clipReason(s string) string {
	const max = 123
	if len(s) <= max {
		return s
	}
	s = s[:max]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}
