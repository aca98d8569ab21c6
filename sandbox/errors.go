package sandbox

import (
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"

	"github.com/corral-sandbox/corral/api"
)

// ErrorKind classifies a CommandError; see [api.ErrorKind].
type ErrorKind = api.ErrorKind

// The kinds of CommandError (see each one's meaning in package api).
const (
	KindPrepare   = api.KindPrepare
	KindStart     = api.KindStart
	KindTimeout   = api.KindTimeout
	KindAbort     = api.KindAbort
	KindOverflow  = api.KindOverflow
	KindTransport = api.KindTransport
	KindCleanup   = api.KindCleanup
)

// Sentinel errors. CommandError unwraps to its Cause and Cleanup, so
// errors.Is works through it. The sentinels that say what an edge should
// answer carry a class (a Class() string method, see internal/errdefs):
// sandbox imports nothing of the project, so it spells the classes itself.
var (
	// ErrUnavailable reports that no sandbox provider is loaded. Callers
	// report "unavailable" (HTTP 503), never crash.
	ErrUnavailable error = &classedError{"sandbox: unavailable", "unavailable"}
	// ErrNoActor: neither an explicit actor nor a turn scope was given.
	ErrNoActor = errors.New("sandbox: no actor and no turn scope")
	// ErrNotStarted is wrapped by providers when the program could not be
	// executed inside the sandbox (missing, not executable). RunCommand
	// reports it as KindStart.
	ErrNotStarted = errors.New("sandbox: program could not be started")
	// ErrTransport is wrapped by providers when the link to a running
	// command was lost. RunCommand reports it as KindTransport.
	ErrTransport = errors.New("sandbox: transport lost")
	// ErrDenied is wrapped by providers when tenancy refuses the actor
	// (not a member of the project). The daemon answers 403.
	ErrDenied error = &classedError{"sandbox: access denied", "forbidden"}
	// ErrNotFound is wrapped by providers when the project does not exist.
	ErrNotFound error = &classedError{"sandbox: project not found", "notFound"}
	// ErrBusy is wrapped by an Admitter that refuses a command or session
	// because a budget (captured bytes, concurrent commands or sessions,
	// globally or for the account) is exhausted. RunCommand and Open
	// report it as a KindPrepare error: nothing was prepared. The daemon
	// answers 429 with Retry-After.
	ErrBusy error = &classedError{"sandbox: busy", "busy"}
	// ErrWaitDelay is a CommandResult's OutputErr when the command's
	// output was cut by the drain bound (ControlOptions.DrainTimeout)
	// because a process it left behind kept its output open: the output
	// may be incomplete. Like os/exec's ErrWaitDelay.
	ErrWaitDelay = errors.New("sandbox: output still open after the drain timeout: it may be incomplete")
)

// classedError is a sentinel with an error class (see internal/errdefs).
type classedError struct{ msg, class string }

func (e *classedError) Error() string { return e.msg }

// Class returns the error's class name.
func (e *classedError) Class() string { return e.class }

// CommandError is a command that did not complete. It never carries an exit
// code. Stdout and Stderr hold the decoded, sanitized output captured before
// the failure (empty when nothing started). Cause is the underlying error;
// Cleanup holds failures of the cancellation or lease release that followed
// (nil when cleanup succeeded). For KindCleanup, the command completed and
// Cleanup is why the result was withheld.
type CommandError struct {
	Kind    ErrorKind
	Message string
	Stdout  string
	Stderr  string
	// Reason, for KindStart, says why the program could not be executed
	// when that is known: ReasonNotFound or ReasonNotExecutable (the
	// CLI's exit statuses 127 and 126, as Docker's). Empty otherwise.
	Reason  StartReason
	Cause   error
	Cleanup error
}

// StartReason is why a program could not be executed
// (CommandError.Reason); see [api.StartReason].
type StartReason = api.StartReason

// The start reasons.
const (
	ReasonNotFound      = api.ReasonNotFound
	ReasonNotExecutable = api.ReasonNotExecutable
)

// startError is the KindStart error of a program that could not be
// started (err wraps ErrNotStarted or is the provider's start failure):
// one line, the innermost reason without the sentinel prefixes the layers
// added ("sandbox: program could not be started: machine: command not
// started: exec ..." becomes "exec ..."), and its Reason where known.
func startError(err error) *CommandError {
	msg := err.Error()
	leaves := sentinels(err, nil)
	for trimmed := true; trimmed; {
		trimmed = false
		for _, l := range leaves {
			if p := l + ": "; strings.HasPrefix(msg, p) && len(msg) > len(p) {
				msg, trimmed = msg[len(p):], true
			}
		}
	}
	e := newError(KindStart, err, "%s", msg)
	e.Reason = startReason(err, msg)
	return e
}

// sentinels appends the texts of the errors at the ends of err's chain
// (those that wrap nothing: the sentinels the layers wrapped).
func sentinels(err error, out []string) []string {
	switch u := err.(type) {
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			out = sentinels(e, out)
		}
	case interface{ Unwrap() error }:
		if e := u.Unwrap(); e != nil {
			return sentinels(e, out)
		}
		out = append(out, err.Error())
	default:
		if err != nil {
			out = append(out, err.Error())
		}
	}
	return out
}

// startReason classifies a start failure: by its errno where the
// program's exec failed in this process, else by the text of an exec
// failure reported from elsewhere (a machine's init, the confinement
// helper), as Docker classifies its runtime's.
func startReason(err error, msg string) StartReason {
	switch {
	case errors.Is(err, exec.ErrNotFound):
		return ReasonNotFound
	case strings.HasPrefix(msg, "chdir "):
		return ""
	case errors.Is(err, syscall.ENOENT):
		return ReasonNotFound
	case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.ENOEXEC), errors.Is(err, syscall.EISDIR):
		return ReasonNotExecutable
	}
	if !strings.HasPrefix(msg, "exec ") && !strings.HasPrefix(msg, "fork/exec ") {
		return ""
	}
	switch {
	case strings.HasSuffix(msg, "executable file not found in $PATH"), strings.HasSuffix(msg, "no such file or directory"):
		return ReasonNotFound
	case strings.HasSuffix(msg, "permission denied"), strings.HasSuffix(msg, "exec format error"), strings.HasSuffix(msg, "is a directory"):
		return ReasonNotExecutable
	}
	return ""
}

func (e *CommandError) Error() string {
	msg := fmt.Sprintf("sandbox: %s: %s", e.Kind, e.Message)
	if e.Cleanup != nil && e.Kind != KindCleanup {
		msg += fmt.Sprintf(" (cleanup: %v)", e.Cleanup)
	}
	return msg
}

// Unwrap returns Cause and Cleanup, whichever are set.
func (e *CommandError) Unwrap() []error {
	var errs []error
	if e.Cause != nil {
		errs = append(errs, e.Cause)
	}
	if e.Cleanup != nil {
		errs = append(errs, e.Cleanup)
	}
	return errs
}

// KindOf returns the kind of the CommandError in err's chain, or "" if there
// is none.
func KindOf(err error) ErrorKind {
	var ce *CommandError
	if errors.As(err, &ce) {
		return ce.Kind
	}
	return ""
}

func newError(kind ErrorKind, cause error, format string, args ...any) *CommandError {
	return &CommandError{Kind: kind, Message: fmt.Sprintf(format, args...), Cause: cause}
}
