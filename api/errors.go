package api

import "net/http"

// ErrorKind is the kind of an error answer (ErrorBody's kind). A command
// that did not complete carries the sandbox's kind of its failure
// (KindPrepare … KindCleanup); every other error answer one of the API's
// kinds (KindUnauthorized …). Each kind has its status (Status), except
// that a command's kind takes its cause's status when the cause says what
// went wrong (a 403 "prepare" for a project the caller may not use, a 429
// "prepare" when a budget is exhausted).
type ErrorKind string

// The kinds of a command that did not complete (the sandbox's
// CommandError).
const (
	// KindPrepare: the input or options were invalid, preparation refused
	// the command, or the prepared target did not match the request.
	// Nothing was started.
	KindPrepare ErrorKind = "prepare"
	// KindStart: the command could not be started (OnStart failed, the
	// program could not be executed). It never ran, so there is no code.
	KindStart ErrorKind = "start"
	// KindTimeout: the command outlived its timeout and was cancelled.
	KindTimeout ErrorKind = "timeout"
	// KindAbort: the caller's context ended and the command was cancelled
	// (or never started).
	KindAbort ErrorKind = "abort"
	// KindOverflow: the command wrote more than its output limit and was
	// cancelled.
	KindOverflow ErrorKind = "overflow"
	// KindTransport: the link to the command was lost (a failed lease
	// heartbeat, a lost worker connection); the command was cancelled.
	KindTransport ErrorKind = "transport"
	// KindCleanup: the command completed but cancelling or releasing it
	// failed. A cleanup failure is a failure.
	KindCleanup ErrorKind = "cleanup"
)

// The API's other kinds.
const (
	KindUnauthorized    ErrorKind = "unauthorized"    // 401: no or unknown bearer token
	KindForbidden       ErrorKind = "forbidden"       // 403: not allowed
	KindNotFound        ErrorKind = "notFound"        // 404: unknown project (or not the caller's), site, file or route
	KindInvalid         ErrorKind = "invalid"         // 400: malformed request
	KindRequestTooLarge ErrorKind = "requestTooLarge" // 413: request body over the cap
	KindConflict        ErrorKind = "conflict"        // 409: exists already, or in use
	KindBusy            ErrorKind = "busy"            // 429: an admission budget is exhausted
	KindUnavailable     ErrorKind = "unavailable"     // 503: a domain or the transport is missing
	KindBadGateway      ErrorKind = "badGateway"      // 502: a site or remote could not be reached
	KindInternal        ErrorKind = "internal"        // 500
	KindUnsupported     ErrorKind = "unsupported"     // 501: a signal the project's sandbox cannot deliver to a whole tree
	KindNoSpace         ErrorKind = "noSpace"         // 507: the project's disk is full
	KindUnknownRevision ErrorKind = "unknownRevision" // 404: an editor Git read of an unknown ref or path
	KindHeadMoved       ErrorKind = "headMoved"       // 409: an exported branch is not at expectedHead
	KindRejected        ErrorKind = "rejected"        // 409: the remote refused the push
	KindNotRepository   ErrorKind = "notRepository"   // 409: the workspace is not a Git repository
	KindTooLarge        ErrorKind = "tooLarge"        // 413: an export's bundle is over the cap
)

// StatusClientClosed is the status recorded when the client went away
// before its command completed (nginx's 499). The client never reads it; it
// shows in logs and metrics.
const StatusClientClosed = 499

// Kinds are every ErrorKind, in the order declared.
var Kinds = []ErrorKind{
	KindPrepare, KindStart, KindTimeout, KindAbort, KindOverflow, KindTransport, KindCleanup,
	KindUnauthorized, KindForbidden, KindNotFound, KindInvalid, KindRequestTooLarge, KindConflict,
	KindBusy, KindUnavailable, KindBadGateway, KindInternal, KindUnsupported, KindNoSpace,
	KindUnknownRevision, KindHeadMoved, KindRejected, KindNotRepository, KindTooLarge,
}

// kindStatus is the status of each kind; a command's kinds have theirs
// when the cause has no class of its own.
var kindStatus = map[ErrorKind]int{
	KindPrepare:         http.StatusBadRequest,
	KindStart:           http.StatusUnprocessableEntity,
	KindTimeout:         http.StatusGatewayTimeout,
	KindAbort:           StatusClientClosed,
	KindOverflow:        http.StatusRequestEntityTooLarge,
	KindTransport:       http.StatusBadGateway,
	KindCleanup:         http.StatusInternalServerError,
	KindUnauthorized:    http.StatusUnauthorized,
	KindForbidden:       http.StatusForbidden,
	KindNotFound:        http.StatusNotFound,
	KindInvalid:         http.StatusBadRequest,
	KindRequestTooLarge: http.StatusRequestEntityTooLarge,
	KindConflict:        http.StatusConflict,
	KindBusy:            http.StatusTooManyRequests,
	KindUnavailable:     http.StatusServiceUnavailable,
	KindBadGateway:      http.StatusBadGateway,
	KindInternal:        http.StatusInternalServerError,
	KindUnsupported:     http.StatusNotImplemented,
	KindNoSpace:         http.StatusInsufficientStorage,
	KindUnknownRevision: http.StatusNotFound,
	KindHeadMoved:       http.StatusConflict,
	KindRejected:        http.StatusConflict,
	KindNotRepository:   http.StatusConflict,
	KindTooLarge:        http.StatusRequestEntityTooLarge,
}

// Status returns the HTTP status of an answer of kind k: for a command's
// kind, the status it has when its cause does not say otherwise. An
// unknown kind's status is 500.
func (k ErrorKind) Status() int {
	if s, ok := kindStatus[k]; ok {
		return s
	}
	return http.StatusInternalServerError
}

// StartReason is why a program could not be executed: the "reason" of a
// KindStart error body, when known.
type StartReason string

// The start reasons (the CLI's exit statuses 127 and 126, as Docker's).
const (
	// ReasonNotFound: there is no such program (not in PATH, no such
	// file).
	ReasonNotFound StartReason = "notFound"
	// ReasonNotExecutable: the file is there but cannot be executed (no
	// permission, not an executable format, a directory).
	ReasonNotExecutable StartReason = "notExecutable"
)
