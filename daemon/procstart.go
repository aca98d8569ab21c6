package daemon

import (
	"context"
	"io"
	"syscall"

	"github.com/corral-sandbox/corral/sandbox"
)

// procSession is a started background command as the process manager
// drives it: its output streams, its settlement, a signal for its whole
// tree, and Close. A sandbox.Session is one (openProc adapts its stream
// fields).
type procSession interface {
	// LeaseID is the lease that covers the command.
	LeaseID() string
	// Stdout and Stderr are its output; for a terminal, Stdout carries
	// everything and Stderr is empty.
	Stdout() io.Reader
	Stderr() io.Reader
	// Done is closed when the session settled.
	Done() <-chan struct{}
	// Wait blocks until Done and reports how it ended: an Exit, or a
	// *sandbox.CommandError (KindTransport when the lease or the machine
	// was lost, KindStart when the program never ran, …).
	Wait() (sandbox.Exit, error)
	// Signal sends sig to every process of the command's tree; an error
	// wrapping errors.ErrUnsupported means the provider cannot (Close
	// still kills the tree). After the session settled it does nothing.
	Signal(sig syscall.Signal) error
	// Close kills the tree if it still runs, waits for it to end (bounded),
	// releases the lease and closes the streams. It is idempotent.
	Close(ctx context.Context) error
}

// startProcSession opens in as actor: core's one session lifecycle
// (sandbox.Control.Open) prepares, starts and keeps the lease alive until
// the session settles. The session outlives the request that starts it,
// so its context does not end with the request's. A refused preparation
// or a failed start returns an error and leaves nothing running, no lease
// live.
func (a *App) startProcSession(ctx context.Context, ctl *sandbox.Control, in sandbox.ExecInput, actor *sandbox.Actor) (procSession, error) {
	s, err := ctl.Open(context.WithoutCancel(ctx), in, actor, nil)
	if err != nil {
		return nil, err
	}
	if in.TTY == nil {
		// Nobody writes a background command's input: it reads EOF.
		_ = s.Stdin.Close()
	}
	return openProc{s}, nil
}

// openProc is a procSession over a sandbox.Session.
type openProc struct{ *sandbox.Session }

func (p openProc) Stdout() io.Reader { return p.Session.Stdout }
func (p openProc) Stderr() io.Reader { return p.Session.Stderr }

func (p openProc) Signal(sig syscall.Signal) error {
	select {
	case <-p.Done():
		return nil // it ended: its tree went with it
	default:
	}
	return p.Session.Signal(sig)
}
