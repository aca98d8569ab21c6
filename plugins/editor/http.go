package editor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path"
	"strconv"
	"strings"

	"github.com/corral-sandbox/corral/internal/redact"
	"github.com/corral-sandbox/corral/sandbox"
)

// ErrUnauthenticated may be wrapped by a Handler's auth function for a
// request without valid credentials (HTTP 401). Any auth error that does
// not wrap sandbox.ErrDenied is answered 401.
var ErrUnauthenticated = errors.New("editor: unauthenticated")

// Error kinds of HTTP error bodies.
const (
	KindUnauthenticated = "unauthenticated" // 401
	KindDenied          = "denied"          // 403
	KindNotFound        = "notFound"        // 404: no such project
	KindUnknownRevision = "unknownRevision" // 404: no such ref or path
	KindBadRequest      = "badRequest"      // 400
	KindUnavailable     = "unavailable"     // 503: no sandbox provider
	KindTimeout         = "timeout"         // 504
	KindInternal        = "internal"        // 500
)

// Handler returns the HTTP handler of e's Git reads, for the daemon to
// mount under /v1/projects/ (it matches full paths):
//
//	GET /v1/projects/{id}/git/status
//	GET /v1/projects/{id}/git/log?ref=&skip=&limit=&path=
//	GET /v1/projects/{id}/git/diff?from=&to=&staged=&path=&max=
//	GET /v1/projects/{id}/git/show?ref=&path=&max=
//
// Each answers 200 with the JSON of [Status], [Log], [Diff] or [File]
// ({"isRepo":false} for a directory that is not a repository). auth
// authenticates every request before anything else is done; its error
// answers 403 if it wraps sandbox.ErrDenied, else 401. Errors are
// {"error":{"kind":K,"message":M}}: 400 badRequest, 401 unauthenticated,
// 403 denied (not a member), 404 notFound (no such project) or
// unknownRevision, 503 unavailable (no sandbox provider), 504 timeout, 500
// internal (details are logged to the editor's logger, not sent).
//
// Handler logs to slog.Default() unless e has a Logger() *slog.Logger
// method (as *Editor has).
func Handler(e Domain, auth func(*http.Request) (sandbox.Actor, error)) http.Handler {
	log := slog.Default()
	if l, ok := e.(interface{ Logger() *slog.Logger }); ok && l.Logger() != nil {
		log = l.Logger()
	}
	h := &handler{e: e, auth: auth, log: log}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/projects/{id}/git/status", h.serve(h.status))
	mux.HandleFunc("GET /v1/projects/{id}/git/log", h.serve(h.logPage))
	mux.HandleFunc("GET /v1/projects/{id}/git/diff", h.serve(h.diff))
	mux.HandleFunc("GET /v1/projects/{id}/git/show", h.serve(h.show))
	return mux
}

type handler struct {
	e    Domain
	auth func(*http.Request) (sandbox.Actor, error)
	log  *slog.Logger
}

func (h *handler) serve(fn func(c *call) (any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		actor, err := h.auth(r)
		if err != nil {
			if errors.Is(err, sandbox.ErrDenied) {
				writeError(w, http.StatusForbidden, KindDenied, "access denied")
			} else {
				writeError(w, http.StatusUnauthorized, KindUnauthenticated, "authentication required")
			}
			return
		}
		v, err := serve(h.e, r, actor, fn)
		if err != nil {
			var e *Error
			errors.As(err, &e)
			if e.Status >= 500 {
				h.log.Warn("editor: git read failed", "path", r.URL.Path, "status", e.Status, "err", e.Cause)
			}
			writeError(w, e.Status, e.Kind, e.Message)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		if err := json.NewEncoder(w).Encode(v); err != nil {
			h.log.Debug("editor: write response", "err", err)
		}
	}
}

// Serve runs the Git read that r names — GET /v1/projects/{id}/git/status,
// log, diff or show, with the query parameters Handler documents — as
// actor, whom the caller authenticated, and returns the value Handler
// would encode as JSON. Every failure is an *Error: classified once (its
// Class method, see internal/errdefs), with a redacted message that is
// safe to send and the underlying error kept apart, for logs only (it is
// not in the error's chain).
func Serve(e Domain, r *http.Request, actor sandbox.Actor) (any, error) {
	h := &handler{e: e}
	var fn func(c *call) (any, error)
	switch path.Base(r.URL.Path) {
	case "status":
		fn = h.status
	case "log":
		fn = h.logPage
	case "diff":
		fn = h.diff
	case "show":
		fn = h.show
	default:
		return nil, newError(fmt.Errorf("%w: no git read %q", ErrBadInput, path.Base(r.URL.Path)))
	}
	return serve(e, r, actor, fn)
}

func serve(e Domain, r *http.Request, actor sandbox.Actor, fn func(c *call) (any, error)) (any, error) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		if id, err = projectIDFromPath(r.URL.Path); err != nil {
			return nil, &Error{Status: http.StatusBadRequest, Kind: KindBadRequest, Message: "project id is not a positive integer", Cause: err}
		}
	}
	c := &call{ctx: r.Context(), actor: actor, project: id, q: queryReader{r: r}}
	v, err := fn(c)
	if err != nil {
		return nil, newError(err)
	}
	return v, nil
}

// projectIDFromPath reads the id of /v1/projects/{id}/git/… (for callers
// whose mux did not set the path value).
func projectIDFromPath(p string) (int64, error) {
	rest, ok := strings.CutPrefix(p, "/v1/projects/")
	if !ok {
		return 0, fmt.Errorf("path %q is not under /v1/projects/", p)
	}
	s, _, _ := strings.Cut(rest, "/")
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 {
		return 0, fmt.Errorf("project id %q is not a positive integer", s)
	}
	return id, nil
}

type call struct {
	ctx     context.Context
	actor   sandbox.Actor
	project int64
	q       queryReader
}

func (h *handler) status(c *call) (any, error) {
	return h.e.Status(c.ctx, c.actor, c.project)
}

func (h *handler) logPage(c *call) (any, error) {
	opts := LogOptions{
		Ref:   c.q.str("ref"),
		Skip:  int(c.q.int("skip")),
		Limit: int(c.q.int("limit")),
		Path:  c.q.str("path"),
	}
	if c.q.err != nil {
		return nil, c.q.err
	}
	return h.e.Log(c.ctx, c.actor, c.project, opts)
}

func (h *handler) diff(c *call) (any, error) {
	opts := DiffOptions{
		From:     c.q.str("from"),
		To:       c.q.str("to"),
		Staged:   c.q.bool("staged"),
		Path:     c.q.str("path"),
		MaxBytes: c.q.int("max"),
	}
	if c.q.err != nil {
		return nil, c.q.err
	}
	return h.e.Diff(c.ctx, c.actor, c.project, opts)
}

func (h *handler) show(c *call) (any, error) {
	ref, path, max := c.q.str("ref"), c.q.str("path"), c.q.int("max")
	if c.q.err != nil {
		return nil, c.q.err
	}
	return h.e.Show(c.ctx, c.actor, c.project, ref, path, max)
}

// Error is a failed Git read as Serve reports it. Message is redacted and
// safe to send; Cause is the underlying error, for logs, and deliberately
// not in the error's chain (it may hold git's unredacted output). Status
// is the HTTP status Handler answers with.
type Error struct {
	Status  int
	Kind    string // one of the Kind constants
	Message string
	Cause   error
}

func (e *Error) Error() string { return e.Message }

// Class returns the error's class (internal/errdefs): invalid, forbidden,
// unauthorized, notFound (unknownRevision included), unavailable, timeout;
// an internal failure has none.
func (e *Error) Class() string {
	switch e.Kind {
	case KindBadRequest:
		return "invalid"
	case KindDenied:
		return "forbidden"
	case KindUnauthenticated:
		return "unauthorized"
	case KindNotFound, KindUnknownRevision:
		return "notFound"
	case KindUnavailable:
		return "unavailable"
	case KindTimeout:
		return "timeout"
	}
	return ""
}

// Is reports whether e is the failure target names: ErrUnknownRevision,
// ErrBadInput or ErrUnauthenticated.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrUnknownRevision:
		return e.Kind == KindUnknownRevision
	case ErrBadInput:
		return e.Kind == KindBadRequest
	case ErrUnauthenticated:
		return e.Kind == KindUnauthenticated
	}
	return false
}

// newError translates err once, here, into a status, a kind and a
// redacted message.
func newError(err error) *Error {
	var status int
	var kind, msg string
	switch {
	case errors.Is(err, ErrBadInput):
		status, kind, msg = http.StatusBadRequest, KindBadRequest, err.Error()
	case errors.Is(err, ErrNotFile):
		status, kind, msg = http.StatusBadRequest, KindBadRequest, err.Error()
	case errors.Is(err, ErrUnknownRevision):
		status, kind, msg = http.StatusNotFound, KindUnknownRevision, err.Error()
	case errors.Is(err, sandbox.ErrUnavailable):
		status, kind, msg = http.StatusServiceUnavailable, KindUnavailable, "sandbox unavailable: no sandbox provider is loaded"
	case errors.Is(err, sandbox.ErrDenied):
		status, kind, msg = http.StatusForbidden, KindDenied, "not a member of this project"
	case errors.Is(err, sandbox.ErrNotFound):
		status, kind, msg = http.StatusNotFound, KindNotFound, "no such project"
	case sandbox.KindOf(err) == sandbox.KindTimeout:
		status, kind, msg = http.StatusGatewayTimeout, KindTimeout, "git did not finish in time"
	default:
		status, kind, msg = http.StatusInternalServerError, KindInternal, "git read failed"
	}
	return &Error{Status: status, Kind: kind, Message: redact.String(msg), Cause: err}
}

func writeError(w http.ResponseWriter, status int, kind, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	var body struct {
		Error struct {
			Kind    string `json:"kind"`
			Message string `json:"message"`
		} `json:"error"`
	}
	body.Error.Kind, body.Error.Message = kind, msg
	_ = json.NewEncoder(w).Encode(body)
}

// queryReader reads query parameters, keeping the first error.
type queryReader struct {
	r   *http.Request
	err error
}

func (q *queryReader) str(name string) string {
	return q.r.URL.Query().Get(name)
}

func (q *queryReader) int(name string) int64 {
	s := q.str(name)
	if s == "" {
		return 0
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil && q.err == nil {
		q.err = fmt.Errorf("%w: query parameter %s is not an integer", ErrBadInput, name)
	}
	return n
}

func (q *queryReader) bool(name string) bool {
	s := q.str(name)
	if s == "" {
		return false
	}
	b, err := strconv.ParseBool(s)
	if err != nil && q.err == nil {
		q.err = fmt.Errorf("%w: query parameter %s is not a boolean", ErrBadInput, name)
	}
	return b
}
