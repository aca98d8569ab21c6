package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/corral-sandbox/corral/machine"
	"github.com/corral-sandbox/corral/plugin"
	"github.com/corral-sandbox/corral/plugins/sites"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/store"
)

// StatusClientClosed is the status recorded when the client went away
// before its command completed (nginx's 499). The client never reads it; it
// shows in logs and metrics.
const StatusClientClosed = 499

// Kinds of APIError that are not sandbox.ErrorKind values. A command that
// failed carries its sandbox.ErrorKind ("prepare", "start", "timeout",
// "abort", "overflow", "transport", "cleanup") instead.
const (
	KindUnauthorized    = "unauthorized"    // 401: no or unknown bearer token
	KindForbidden       = "forbidden"       // 403: not a member, or not allowed
	KindNotFound        = "notFound"        // 404: unknown project, site or route
	KindInvalid         = "invalid"         // 400: malformed request
	KindRequestTooLarge = "requestTooLarge" // 413: request body over the cap
	KindConflict        = "conflict"        // 409: exists already, or busy
	KindUnavailable     = "unavailable"     // 503: a domain or the transport is missing
	KindBadGateway      = "badGateway"      // 502: a site could not be reached
	KindInternal        = "internal"        // 500
)

// APIError is every error the API answers with. Errors are translated into
// an APIError once, at the HTTP boundary (see toAPIError); its JSON form is
// the pinned body
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
	// Cause is the translated error, for logs; it is never sent.
	Cause error
}

func (e *APIError) Error() string {
	return fmt.Sprintf("%d %s: %s", e.Status, e.Kind, e.Message)
}

func (e *APIError) Unwrap() error { return e.Cause }

// MarshalJSON writes the pinned error body.
func (e *APIError) MarshalJSON() ([]byte, error) {
	type detail struct {
		Kind    string `json:"kind"`
		Message string `json:"message"`
		Stdout  string `json:"stdout"`
		Stderr  string `json:"stderr"`
	}
	return json.Marshal(struct {
		Error detail `json:"error"`
	}{detail{e.Kind, e.Message, e.Stdout, e.Stderr}})
}

func apiErr(status int, kind, format string, args ...any) *APIError {
	return &APIError{Status: status, Kind: kind, Message: fmt.Sprintf(format, args...)}
}

// commandStatus is the HTTP status of each sandbox.ErrorKind. A prepare
// error's status depends on its cause (see toAPIError).
var commandStatus = map[sandbox.ErrorKind]int{
	sandbox.KindPrepare:   http.StatusBadRequest,
	sandbox.KindStart:     http.StatusUnprocessableEntity,
	sandbox.KindTimeout:   http.StatusGatewayTimeout,
	sandbox.KindAbort:     StatusClientClosed,
	sandbox.KindOverflow:  http.StatusRequestEntityTooLarge,
	sandbox.KindTransport: http.StatusBadGateway,
	sandbox.KindCleanup:   http.StatusInternalServerError,
}

// toAPIError translates any error into the API's form. It is the only place
// where errors of the layers below become statuses:
//
//   - an *APIError passes through;
//   - a *sandbox.CommandError keeps its kind, message and partial output;
//     its status comes from its kind, except that a cause of
//     sandbox.ErrDenied is 403, sandbox.ErrNotFound 404, and
//     sandbox.ErrUnavailable, machine.ErrNoPrivilegedTransport or
//     machine.ErrUnavailable (the worker cannot be reached) 503, whatever
//     the kind;
//   - sandbox.ErrUnavailable, plugin.ErrAbsent and
//     machine.ErrNoPrivilegedTransport are 503 "unavailable";
//   - store.ErrNotFound is 404, store.ErrExists 409, store.ErrProjectBusy 409;
//   - anything else is 500 "internal".
func toAPIError(err error) *APIError {
	var ae *APIError
	if errors.As(err, &ae) {
		return ae
	}
	var ce *sandbox.CommandError
	if errors.As(err, &ce) {
		out := &APIError{Status: commandStatus[ce.Kind], Kind: string(ce.Kind), Message: ce.Message, Stdout: ce.Stdout, Stderr: ce.Stderr, Cause: err}
		switch {
		case errors.Is(err, sandbox.ErrDenied):
			out.Status = http.StatusForbidden
		case errors.Is(err, sandbox.ErrNotFound):
			out.Status = http.StatusNotFound
		case errors.Is(err, machine.ErrNoPrivilegedTransport), errors.Is(err, sandbox.ErrUnavailable),
			errors.Is(err, machine.ErrUnavailable):
			// Nothing was sent to a worker: try again later.
			out.Status = http.StatusServiceUnavailable
		}
		if out.Status == 0 {
			out.Status = http.StatusInternalServerError
		}
		return out
	}
	switch {
	case errors.Is(err, machine.ErrNoPrivilegedTransport):
		return &APIError{Status: http.StatusServiceUnavailable, Kind: KindUnavailable, Message: machine.ErrNoPrivilegedTransport.Error(), Cause: err}
	case errors.Is(err, sandbox.ErrUnavailable), errors.Is(err, plugin.ErrAbsent):
		return &APIError{Status: http.StatusServiceUnavailable, Kind: KindUnavailable, Message: err.Error(), Cause: err}
	case errors.Is(err, store.ErrNotFound), errors.Is(err, sandbox.ErrNotFound):
		return &APIError{Status: http.StatusNotFound, Kind: KindNotFound, Message: err.Error(), Cause: err}
	case errors.Is(err, sandbox.ErrDenied):
		return &APIError{Status: http.StatusForbidden, Kind: KindForbidden, Message: err.Error(), Cause: err}
	case errors.Is(err, store.ErrExists), errors.Is(err, store.ErrProjectBusy):
		return &APIError{Status: http.StatusConflict, Kind: KindConflict, Message: err.Error(), Cause: err}
	case errors.Is(err, sitesplugin.ErrUnavailable):
		return &APIError{Status: http.StatusServiceUnavailable, Kind: KindUnavailable, Message: err.Error(), Cause: err}
	case errors.Is(err, sitesplugin.ErrNotFound):
		return &APIError{Status: http.StatusNotFound, Kind: KindNotFound, Message: err.Error(), Cause: err}
	case errors.Is(err, sitesplugin.ErrTaken):
		return &APIError{Status: http.StatusConflict, Kind: KindConflict, Message: err.Error(), Cause: err}
	case errors.Is(err, errInvalid), errors.Is(err, ErrInvalidProject), errors.Is(err, sitesplugin.ErrInvalid):
		return &APIError{Status: http.StatusBadRequest, Kind: KindInvalid, Message: err.Error(), Cause: err}
	}
	return &APIError{Status: http.StatusInternalServerError, Kind: KindInternal, Message: "internal error", Cause: err}
}

// errInvalid marks errors of the daemon's own validation (400).
var errInvalid = errors.New("invalid request")
