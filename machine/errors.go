package machine

import (
	"errors"
	"fmt"
	"strings"

	"github.com/corral-sandbox/corral/internal/errdefs"
	"github.com/corral-sandbox/corral/wire"
)

// The worker's refusals, as a *RejectedError wraps them (test with
// errors.Is). A refusal of a file call also carries its class (package
// internal/errdefs: the HTTP edge answers 404, 403, 409, 400 or 507 from
// it); a refused command or dial carries none of its own.
var (
	// File calls.
	ErrNotFound     = errdefs.New(errdefs.NotFound, "machine: no such file or directory")
	ErrPermission   = errdefs.New(errdefs.Forbidden, "machine: permission denied")
	ErrExists       = errdefs.New(errdefs.Conflict, "machine: file exists")
	ErrNotDirectory = errdefs.New(errdefs.Invalid, "machine: not a directory")
	ErrIsDirectory  = errdefs.New(errdefs.Invalid, "machine: is a directory")
	ErrNotEmpty     = errdefs.New(errdefs.Conflict, "machine: directory not empty")
	ErrNoSpace      = errdefs.New(errdefs.NoSpace, "machine: the project's disk is full")
	// ErrBadPath: a path that is not clean, leads through a magic link,
	// into procfs, sysfs or cgroupfs, or to a file of the wrong kind.
	ErrBadPath = errdefs.New(errdefs.Invalid, "machine: path refused")

	// ErrBadUser: the user named is not one of the machine's (a command's
	// start or a file call).
	ErrBadUser = errors.New("machine: no such user")
	// ErrBadRequest: the worker refused a field of the request (its
	// workspace, cwd, argv, environment, image, an unknown file op, a
	// request too large).
	ErrBadRequest = errors.New("machine: request refused")
	// ErrBusy: the machine is in use (a reset while it has sessions) or the
	// worker is at a bound (too many sessions).
	ErrBusy = errors.New("machine: busy")
	// ErrDialFailed: nothing could be reached or listened on at the port
	// (net-dial, net-listen).
	ErrDialFailed = errors.New("machine: dial failed")
	// ErrNoMachine: the project has no running machine, which a dial or a
	// listen does not start (a session does). It wraps ErrDialFailed.
	ErrNoMachine = fmt.Errorf("%w: no running machine", ErrDialFailed)
	// ErrMachineStart: the worker could not start the project's machine.
	ErrMachineStart = errors.New("machine: the machine could not be started")
	// ErrRefused: any other refusal (an unknown session, a duplicate id, a
	// failure inside the worker).
	ErrRefused = errors.New("machine: refused")
)

// RejectedError is the worker's refusal of a request (exec-rejected, or an
// error frame answering an exec, a dial, a listen, a reset or a file
// call). Nothing was started. It wraps the sentinel of its reason
// (ErrNotFound, ErrBusy, ErrMachineStart, …), so that callers test it with errors.Is and never see the
// protocol's codes.
type RejectedError struct {
	// Message is the worker's explanation.
	Message string
	// Err is the reason's sentinel; never nil.
	Err  error
	code string // the protocol's, for the message
}

func (e *RejectedError) Error() string {
	return fmt.Sprintf("machine: worker refused: %s: %s", e.code, e.Message)
}

// Unwrap returns the reason's sentinel.
func (e *RejectedError) Unwrap() error { return e.Err }

// rejected returns the refusal with the worker's code and message.
func rejected(code, msg string) *RejectedError {
	return &RejectedError{Message: msg, Err: reason(code, msg), code: code}
}

// reason is the sentinel of a worker's code: the one place that reads
// protocol 2's codes.
func reason(code, msg string) error {
	switch code {
	case wire.CodeNotFound:
		return ErrNotFound
	case wire.CodePermission:
		return ErrPermission
	case wire.CodeExists:
		return ErrExists
	case wire.CodeNotDirectory:
		return ErrNotDirectory
	case wire.CodeIsDirectory:
		return ErrIsDirectory
	case wire.CodeNotEmpty:
		return ErrNotEmpty
	case wire.CodeNoSpace:
		return ErrNoSpace
	case wire.CodeBadPath:
		return ErrBadPath
	case wire.CodeBadUser:
		return ErrBadUser
	case wire.CodeBadField, wire.CodeBadWorkspace, wire.CodeBadCwd, wire.CodeBadArgv, wire.CodeBadEnv,
		wire.CodeBadImage, wire.CodeTooLarge:
		return ErrBadRequest
	case wire.CodeBusy, wire.CodeTooManySessions:
		return ErrBusy
	case wire.CodeMachineFailed:
		return ErrMachineStart
	case wire.CodeDialFailed:
		// The worker says so only in words (protocol 2 has one code for
		// every failed dial).
		if strings.Contains(msg, "no running machine") {
			return ErrNoMachine
		}
		return ErrDialFailed
	}
	return ErrRefused
}

// fileRefusal classes a file call's refusal that the worker's code leaves
// unclassed: a user or a field it refused is the request's fault.
func fileRefusal(err error) error {
	if errors.Is(err, ErrBadUser) || errors.Is(err, ErrBadRequest) {
		return errdefs.Wrap(err, errdefs.Invalid)
	}
	return err
}
