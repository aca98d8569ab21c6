package daemon

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"

	"github.com/corral-sandbox/corral/plugin"
	editorplugin "github.com/corral-sandbox/corral/plugins/editor"
	"github.com/corral-sandbox/corral/sandbox"
)

// KindUnknownRevision is the kind of a 404 for a ref or path that does not
// exist (GET /v1/projects/{id}/git/...).
const KindUnknownRevision = "unknownRevision"

// editorHandlers caches the editor plugin's HTTP handler per editor
// control, so that a reloaded editor plugin is picked up at the next call.
type editorHandlers struct {
	mu sync.Mutex
	ed editorplugin.Domain
	h  http.Handler
}

func (c *editorHandlers) get(ed editorplugin.Domain) http.Handler {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ed != ed {
		c.ed, c.h = ed, editorplugin.Handler(ed, editorActor)
	}
	return c.h
}

// editorActor is the auth function handed to the editor's handler: the
// daemon authenticated the request and checked membership already.
func editorActor(r *http.Request) (sandbox.Actor, error) {
	acct, ok := accountFrom(r.Context())
	if !ok {
		return sandbox.Actor{}, editorplugin.ErrUnauthenticated
	}
	return sandbox.Actor{AccountUserID: acct.ID}, nil
}

// editorGit serves GET /v1/projects/{id}/git/{status,log,diff,show}
// through the editor plugin's handler, resolved at call time: 401/403/404
// are decided by the daemon from the database first; an absent editor
// plugin answers 503. The editor's error bodies are translated into the
// daemon's pinned error body.
func (a *App) editorGit(w http.ResponseWriter, r *http.Request) error {
	if _, _, _, err := a.projectMember(r); err != nil {
		return err
	}
	ed, err := plugin.ResolveCoreAs[editorplugin.Domain](a.core.Registry(), plugin.DomainEditor)
	if err != nil {
		return err
	}
	ew := &editorWriter{w: w}
	a.editor.get(ed).ServeHTTP(ew, r)
	if ew.status >= 400 {
		return editorAPIError(ew.status, ew.body.Bytes())
	}
	return nil
}

// editorKinds maps the editor's error kinds to the daemon's.
var editorKinds = map[string]string{
	editorplugin.KindBadRequest:      KindInvalid,
	editorplugin.KindDenied:          KindForbidden,
	editorplugin.KindUnauthenticated: KindUnauthorized,
	editorplugin.KindNotFound:        KindNotFound,
	editorplugin.KindUnknownRevision: KindUnknownRevision,
	editorplugin.KindUnavailable:     KindUnavailable,
	editorplugin.KindTimeout:         string(sandbox.KindTimeout),
	editorplugin.KindInternal:        KindInternal,
}

func editorAPIError(status int, body []byte) *APIError {
	var v struct {
		Error struct {
			Kind    string `json:"kind"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		return &APIError{Status: status, Kind: KindInternal, Message: "editor: malformed error response", Cause: fmt.Errorf("editor error body %q: %w", body, err)}
	}
	kind, ok := editorKinds[v.Error.Kind]
	if !ok {
		kind = v.Error.Kind
	}
	return &APIError{Status: status, Kind: kind, Message: v.Error.Message, Cause: fmt.Errorf("editor: %d %s: %s", status, v.Error.Kind, v.Error.Message)}
}

// editorWriter passes a successful response through and keeps an error
// response (status 400 and above) for translation.
type editorWriter struct {
	w      http.ResponseWriter
	status int
	body   bytes.Buffer
}

func (e *editorWriter) Header() http.Header { return e.w.Header() }

func (e *editorWriter) WriteHeader(code int) {
	if e.status != 0 {
		return
	}
	e.status = code
	if code < 400 {
		e.w.WriteHeader(code)
	}
}

func (e *editorWriter) Write(p []byte) (int, error) {
	if e.status == 0 {
		e.WriteHeader(http.StatusOK)
	}
	if e.status >= 400 {
		if e.body.Len() < 64<<10 {
			e.body.Write(p)
		}
		return len(p), nil
	}
	return e.w.Write(p)
}
