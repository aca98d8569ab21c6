package daemon

import (
	"bytes"
	"net/http"
	"strings"
)

// Bounds of MCP requests (POST /v1/mcp) in flight at once: each holds its
// body (up to mcpserver.MaxRequest) for as long as its tool call runs.
const (
	MaxAccountMCPRequests = 8   // per account that is not an admin
	MaxMCPRequests        = 128 // for the whole daemon
)

// serveMCP serves POST /v1/mcp: corral's MCP tools over streamable HTTP
// (package mcpserver), statelessly. Each tool call acts as the account of
// the bearer token its request carried, through this app over in-process
// connections: it is authenticated and checked again like any request.
// The transport's own refusals (plain text: a wrong Accept or Content-Type,
// a body over mcpserver.MaxRequest) are answered with the API's error body.
func (a *App) serveMCP(w http.ResponseWriter, r *http.Request) error {
	acct, _ := accountFrom(r.Context())
	done, err := a.mcpCalls.start(acct, a.isAdmin(acct))
	if err != nil {
		return err
	}
	defer done()
	rw := &mcpRefusal{ResponseWriter: w}
	a.mcp.ServeHTTP(rw, r)
	if rw.status == 0 {
		return nil
	}
	kind := KindInvalid
	switch {
	case rw.status == http.StatusRequestEntityTooLarge:
		kind = KindRequestTooLarge
	case rw.status == http.StatusForbidden:
		kind = KindForbidden
	case rw.status >= 500:
		kind = KindInternal
	}
	return apiErr(rw.status, kind, "%s", strings.TrimSpace(rw.msg.String()))
}

// mcpRefusal holds back a plain-text error answer (http.Error's) of the
// MCP transport, for serveMCP to answer in the API's form; it passes
// everything else through.
type mcpRefusal struct {
	http.ResponseWriter
	status int
	msg    bytes.Buffer
}

func (w *mcpRefusal) WriteHeader(code int) {
	if code >= 400 && strings.HasPrefix(w.Header().Get("Content-Type"), "text/plain") {
		w.status = code
		return
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *mcpRefusal) Write(p []byte) (int, error) {
	if w.status == 0 {
		return w.ResponseWriter.Write(p)
	}
	if n := 512 - w.msg.Len(); n > 0 {
		w.msg.Write(p[:min(len(p), n)])
	}
	return len(p), nil
}

func (w *mcpRefusal) Flush() {
	if w.status == 0 {
		_ = http.NewResponseController(w.ResponseWriter).Flush()
	}
}

func (w *mcpRefusal) Unwrap() http.ResponseWriter { return w.ResponseWriter }
