package editor

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path"
	"strconv"
	"strings"

	"github.com/corral-sandbox/corral/api"
	"github.com/corral-sandbox/corral/internal/redact"
	"github.com/corral-sandbox/corral/sandbox"
)

// Error kinds: the API's kinds (package api) of a failed read, which the
// daemon's one error translator answers with their statuses.
const (
	KindInvalid         = api.KindInvalid         // a bad query, or a path that is not a file
	KindForbidden       = api.KindForbidden       // not a member of the project
	KindNotFound        = api.KindNotFound        // no such project
	KindUnknownRevision = api.KindUnknownRevision // no such ref or path
	KindUnavailable     = api.KindUnavailable     // no sandbox provider
	KindTimeout         = api.KindTimeout         // git did not finish in time
	KindInternal        = api.KindInternal        // anything else (details for logs only)
)

// reads runs the reads of one domain.
type reads struct {
	e Domain
}

// Serve runs the Git read that r names as actor, whom the caller
// authenticated, and returns its answer ([Status], [Log], [Diff] or [File],
// whose JSON is {"isRepo":false} for a directory that is not a
// repository):
//
//	GET /v1/projects/{id}/git/status
//	GET /v1/projects/{id}/git/log?ref=&skip=&limit=&path=
//	GET /v1/projects/{id}/git/diff?from=&to=&staged=&path=&max=
//	GET /v1/projects/{id}/git/show?ref=&path=&max=
//
// Every failure is an *Error: classified once (its Kind, one of the API's,
// and its Class method, see internal/errdefs), with a redacted message
// that is safe to send and the underlying error kept apart, for logs only
// (it is not in the error's chain). The daemon answers it through its one
// error translator.
func Serve(e Domain, r *http.Request, actor sandbox.Actor) (any, error) {
	h := &reads{e: e}
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
			return nil, &Error{Kind: KindInvalid, Message: "project id is not a positive integer", Cause: err}
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

func (h *reads) status(c *call) (any, error) {
	return h.e.Status(c.ctx, c.actor, c.project)
}

func (h *reads) logPage(c *call) (any, error) {
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

func (h *reads) diff(c *call) (any, error) {
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

func (h *reads) show(c *call) (any, error) {
	ref, path, max := c.q.str("ref"), c.q.str("path"), c.q.int("max")
	if c.q.err != nil {
		return nil, c.q.err
	}
	return h.e.Show(c.ctx, c.actor, c.project, ref, path, max)
}

// Error is a failed Git read as Serve reports it. Message is redacted and
// safe to send; Cause is the underlying error, for logs, and deliberately
// not in the error's chain (it may hold git's unredacted output).
type Error struct {
	Kind    api.ErrorKind // one of the Kind constants
	Message string
	Cause   error
}

func (e *Error) Error() string { return e.Message }

// Class returns the error's class (internal/errdefs): invalid, forbidden,
// unauthorized, notFound (unknownRevision included), unavailable, timeout;
// an internal failure has none.
func (e *Error) Class() string {
	switch e.Kind {
	case KindInvalid:
		return "invalid"
	case KindForbidden:
		return "forbidden"
	case KindNotFound, KindUnknownRevision:
		return "notFound"
	case KindUnavailable:
		return "unavailable"
	case KindTimeout:
		return "timeout"
	}
	return ""
}

// Is reports whether e is the failure target names: ErrUnknownRevision or
// ErrBadInput.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrUnknownRevision:
		return e.Kind == KindUnknownRevision
	case ErrBadInput:
		return e.Kind == KindInvalid
	}
	return false
}

// newError translates err once, here, into a status, a kind and a
// redacted message.
func newError(err error) *Error {
	var kind api.ErrorKind
	var msg string
	switch {
	case errors.Is(err, ErrBadInput), errors.Is(err, ErrNotFile):
		kind, msg = KindInvalid, err.Error()
	case errors.Is(err, ErrUnknownRevision):
		kind, msg = KindUnknownRevision, err.Error()
	case errors.Is(err, sandbox.ErrUnavailable):
		kind, msg = KindUnavailable, "sandbox unavailable: no sandbox provider is loaded"
	case errors.Is(err, sandbox.ErrDenied):
		kind, msg = KindForbidden, "not a member of this project"
	case errors.Is(err, sandbox.ErrNotFound):
		kind, msg = KindNotFound, "no such project"
	case sandbox.KindOf(err) == sandbox.KindTimeout:
		kind, msg = KindTimeout, "git did not finish in time"
	default:
		kind, msg = KindInternal, "git read failed"
	}
	return &Error{Kind: kind, Message: redact.String(msg), Cause: err}
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
