package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/corral-sandbox/corral/api"
	"github.com/corral-sandbox/corral/export"
	"github.com/corral-sandbox/corral/internal/errdefs"
	"github.com/corral-sandbox/corral/plugins/editor"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/store"
)

// StatusClientClosed is the status recorded when the client went away
// before its command completed (nginx's 499).
const StatusClientClosed = api.StatusClientClosed

// The kinds of APIError that are not sandbox.ErrorKind values, as the
// strings APIError carries: package api declares them (api.ErrorKind),
// with their statuses. A command that failed carries its sandbox.ErrorKind
// ("prepare", "start", "timeout", "abort", "overflow", "transport",
// "cleanup") instead.
const (
	KindUnauthorized    = string(api.KindUnauthorized)
	KindForbidden       = string(api.KindForbidden)
	KindNotFound        = string(api.KindNotFound)
	KindInvalid         = string(api.KindInvalid)
	KindRequestTooLarge = string(api.KindRequestTooLarge)
	KindConflict        = string(api.KindConflict)
	KindBusy            = string(api.KindBusy)
	KindUnavailable     = string(api.KindUnavailable)
	KindBadGateway      = string(api.KindBadGateway)
	KindInternal        = string(api.KindInternal)
	KindUnsupported     = string(api.KindUnsupported)
	KindNoSpace         = string(api.KindNoSpace)
	KindUnknownRevision = string(api.KindUnknownRevision)
	KindHeadMoved       = string(api.KindHeadMoved)
	KindRejected        = string(api.KindRejected)
	KindNotRepository   = string(api.KindNotRepository)
	KindTooLarge        = string(api.KindTooLarge)
)

// RetryAfter is the Retry-After of a 429 answer (an admission budget
// exhausted): commands settle in seconds.
const RetryAfter = time.Second

// APIError is every error the API answers with. Errors are translated into
// an APIError once, at the HTTP boundary (see toAPIError); its JSON form is
// the pinned body (sandbox.ErrorBody)
//
//	{"error":{"kind":K,"message":S,"stdout":S,"stderr":S}}
//
// where stdout and stderr are the partial output of a command that did not
// complete (empty otherwise).
type APIError struct {
	Status  int
	Kind    string
	Message string
	Stdout  string
	Stderr  string
	// Reason is a start error's reason (sandbox.CommandError.Reason):
	// "notFound", "notExecutable" or empty (not sent).
	Reason string
	// Base64 answers Stdout and Stderr as the base64 of their bytes (a
	// command request's "encoding":"base64").
	Base64 bool
	// Cause is the translated error, for logs; it is never sent.
	Cause error
}

func (e *APIError) Error() string {
	return fmt.Sprintf("%d %s: %s", e.Status, e.Kind, e.Message)
}

func (e *APIError) Unwrap() error { return e.Cause }

// MarshalJSON writes the pinned error body.
func (e *APIError) MarshalJSON() ([]byte, error) {
	if e.Base64 {
		var buf bytes.Buffer
		err := e.body().WriteJSONBase64(&buf, false)
		return buf.Bytes(), err
	}
	return e.body().MarshalJSON()
}

// streamer is e's pinned body as written (its output base64 when
// e.Base64), streamed.
func (e *APIError) streamer() jsonStreamer {
	if e.Base64 {
		return base64Body{e.body()}
	}
	return e.body()
}

// base64Body streams an error body with its output base64.
type base64Body struct{ sandbox.ErrorBody }

func (b base64Body) WriteJSON(w io.Writer, escapeHTML bool) error {
	return b.WriteJSONBase64(w, escapeHTML)
}

func (e *APIError) body() sandbox.ErrorBody {
	return sandbox.ErrorBody{Kind: e.Kind, Message: e.Message, Stdout: e.Stdout, Stderr: e.Stderr, Reason: e.Reason}
}

func apiErr(status int, kind, format string, args ...any) *APIError {
	return &APIError{Status: status, Kind: kind, Message: fmt.Sprintf(format, args...)}
}

// classKind is the kind of each error class (internal/errdefs); its
// status is the kind's (api.ErrorKind.Status).
var classKind = map[errdefs.Kind]api.ErrorKind{
	errdefs.Invalid:         api.KindInvalid,
	errdefs.NotFound:        api.KindNotFound,
	errdefs.Forbidden:       api.KindForbidden,
	errdefs.Unauthenticated: api.KindUnauthorized,
	errdefs.Conflict:        api.KindConflict,
	errdefs.Unavailable:     api.KindUnavailable,
	errdefs.TooLarge:        api.KindTooLarge,
	errdefs.Timeout:         api.KindTimeout,
	errdefs.Busy:            api.KindBusy,
	errdefs.NoSpace:         api.KindNoSpace,
}

// rule is a row of errorRules: errors that need a kind of their own (more
// precise than their class) or that no class covers.
type rule struct {
	match   func(error) bool
	status  int
	kind    string
	message func(error) string // nil: err.Error()
}

func is(target error) func(error) bool { return func(err error) bool { return errors.Is(err, target) } }

func as[T error]() func(error) bool {
	return func(err error) bool {
		var t T
		return errors.As(err, &t)
	}
}

// errorRules are tried in order, before the classes.
var errorRules = []rule{
	{as[*export.HeadMovedError](), http.StatusConflict, KindHeadMoved, func(err error) string {
		var hm *export.HeadMovedError
		errors.As(err, &hm)
		return fmt.Sprintf("branch %s is at %s, not at %s", hm.Branch, hm.Actual, hm.Expected)
	}},
	{is(export.ErrNotRepository), http.StatusConflict, KindNotRepository, func(error) string {
		return "the project's workspace is not a git repository"
	}},
	{is(export.ErrRejected), http.StatusConflict, KindRejected, nil},
	{is(export.ErrPush), http.StatusBadGateway, KindBadGateway, nil},
	// Redacted git output of the export: worth showing.
	{as[*export.GitError](), http.StatusInternalServerError, KindInternal, nil},
	// A site's port could not be reached through the worker.
	{siteDialFailure, http.StatusBadGateway, KindBadGateway, siteDialMessage},
	// Session errors outside a CommandError (language servers).
	{is(sandbox.ErrNotStarted), http.StatusUnprocessableEntity, string(sandbox.KindStart), nil},
	{is(sandbox.ErrTransport), http.StatusBadGateway, string(sandbox.KindTransport), nil},
}

// toAPIError translates any error into the API's form. It is the only place
// where errors of the layers below become statuses:
//
//   - an *APIError passes through;
//   - a *sandbox.CommandError keeps its kind, message and partial output;
//     its status is its cause's class's (403 forbidden, 404 not found, 429
//     busy, 503 unavailable, …) if the cause has one, else its kind's;
//     one whose cause is the store's unavailability (store.ErrUnavailable)
//     is 503 "unavailable";
//   - an *editor.Error (a Git read) keeps the API kind the editor gave it
//     and its redacted message, with the kind's status;
//   - an error matching a row of errorRules gets that row's status and
//     kind (export's headMoved, notRepository, rejected; a site's bad
//     gateway; language-server start and transport failures);
//   - a classified error (internal/errdefs) gets its class's status and
//     kind: store.ErrNotFound 404, store.ErrExists 409,
//     machine.ErrNoPrivilegedTransport 503, sandbox.ErrBusy 429, …;
//   - a client that went away (context.Canceled) is 499 "abort";
//   - anything else is 500 "internal", its message withheld.
func toAPIError(err error) *APIError {
	var ae *APIError
	if errors.As(err, &ae) {
		return ae
	}
	class, classed := classKind[errdefs.KindOf(err)]
	var ce *sandbox.CommandError
	if errors.As(err, &ce) {
		out := &APIError{Status: ce.Kind.Status(), Kind: string(ce.Kind), Message: ce.Message, Stdout: ce.Stdout, Stderr: ce.Stderr, Reason: string(ce.Reason), Cause: err}
		if classed {
			out.Status = class.Status()
		}
		if errors.Is(err, store.ErrUnavailable) {
			// The store went away under the command (its lease could not
			// be taken, kept or released): the daemon's unavailability.
			out.Status, out.Kind = http.StatusServiceUnavailable, string(KindUnavailable)
		}
		return out
	}
	var ee *editor.Error
	if errors.As(err, &ee) {
		return &APIError{Status: ee.Kind.Status(), Kind: string(ee.Kind), Message: ee.Message, Cause: err}
	}
	for _, r := range errorRules {
		if r.match(err) {
			msg := err.Error()
			if r.message != nil {
				msg = r.message(err)
			}
			return &APIError{Status: r.status, Kind: r.kind, Message: msg, Cause: err}
		}
	}
	if classed {
		return &APIError{Status: class.Status(), Kind: string(class), Message: err.Error(), Cause: err}
	}
	if errors.Is(err, context.Canceled) {
		return &APIError{Status: StatusClientClosed, Kind: string(sandbox.KindAbort), Message: "client went away", Cause: err}
	}
	return &APIError{Status: http.StatusInternalServerError, Kind: KindInternal, Message: "internal error", Cause: err}
}

// writeError writes e's pinned body with e's status (and the headers its
// status calls for: WWW-Authenticate on 401, Retry-After on 429).
func writeError(w http.ResponseWriter, e *APIError) {
	switch e.Status {
	case http.StatusUnauthorized:
		w.Header().Set("WWW-Authenticate", `Bearer realm="corral"`)
	case http.StatusTooManyRequests:
		w.Header().Set("Retry-After", strconv.Itoa(int(RetryAfter/time.Second)))
	}
	writeJSON(w, e.Status, e.streamer())
}
