// Package errdefs classifies errors once, where they arise, so that the
// edges (the daemon's HTTP table, the CLI) translate them in one place
// (containerd's errdefs, Docker's error classes).
//
// An error's class is that of the first error in its chain (the order of
// errors.As) with a method
//
//	Class() string
//
// returning one of the Kind names below. Packages that may import errdefs
// wrap its sentinels (fmt.Errorf("store: %w", errdefs.ErrNotFound)) or
// make their own with New; packages that import nothing of the project
// (sandbox) give their sentinels the method themselves. An error without a
// class is unclassified: the edges treat it as an internal failure.
package errdefs

import "errors"

// Kind is an error class.
type Kind string

// The classes.
const (
	// Invalid: the request is malformed or breaks a rule; retrying it
	// unchanged fails again.
	Invalid Kind = "invalid"
	// NotFound: what the request names does not exist (or the caller may
	// not learn that it does).
	NotFound Kind = "notFound"
	// Forbidden: the caller is known but not allowed.
	Forbidden Kind = "forbidden"
	// Unauthenticated: the caller presented no valid credential.
	Unauthenticated Kind = "unauthorized"
	// Conflict: the request conflicts with the current state (exists
	// already, still in use, moved).
	Conflict Kind = "conflict"
	// Unavailable: a component the request needs is missing or
	// unreachable; retrying later may succeed.
	Unavailable Kind = "unavailable"
	// TooLarge: the request or what it produced exceeds a size bound.
	TooLarge Kind = "tooLarge"
	// Timeout: the work did not finish in the time it had.
	Timeout Kind = "timeout"
	// Busy: a budget is exhausted (admission control); retry after the
	// load went down.
	Busy Kind = "busy"
	// NoSpace: the project's disk (or its quota) is full.
	NoSpace Kind = "noSpace"
)

// Sentinels of each class, for errors.Is and for wrapping.
var (
	ErrInvalid         = New(Invalid, "invalid")
	ErrNotFound        = New(NotFound, "not found")
	ErrForbidden       = New(Forbidden, "forbidden")
	ErrUnauthenticated = New(Unauthenticated, "unauthenticated")
	ErrConflict        = New(Conflict, "conflict")
	ErrUnavailable     = New(Unavailable, "unavailable")
	ErrTooLarge        = New(TooLarge, "too large")
	ErrTimeout         = New(Timeout, "timeout")
	ErrBusy            = New(Busy, "busy")
)

// New returns a new error of class k with message msg. Each call returns a
// distinct error (like errors.New).
func New(k Kind, msg string) error { return &classed{kind: k, msg: msg} }

// Wrap returns err classified as k (its message and chain unchanged). A nil
// err stays nil.
func Wrap(err error, k Kind) error {
	if err == nil {
		return nil
	}
	return &wrapped{kind: k, err: err}
}

type classed struct {
	kind Kind
	msg  string
}

func (e *classed) Error() string { return e.msg }
func (e *classed) Class() string { return string(e.kind) }

type wrapped struct {
	kind Kind
	err  error
}

func (e *wrapped) Error() string { return e.err.Error() }
func (e *wrapped) Class() string { return string(e.kind) }
func (e *wrapped) Unwrap() error { return e.err }

// Classer is implemented by classified errors.
type Classer interface {
	error
	Class() string
}

// KindOf returns err's class, or "" when err is nil or unclassified.
func KindOf(err error) Kind {
	var c Classer
	if errors.As(err, &c) {
		return Kind(c.Class())
	}
	return ""
}

// Is reports whether err is of class k.
func Is(err error, k Kind) bool { return err != nil && KindOf(err) == k }
