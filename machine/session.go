package machine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/wire"
)

// ExecRequest describes a command to run in a project's machine.
type ExecRequest struct {
	// ID names the session on the connection. Empty means a fresh random
	// id. An id still in use on the connection is refused.
	ID string
	// Project is the machine's project.
	Project Project
	// Account is the account the command runs for; Lease the lease id
	// covering it. Both are recorded by the worker.
	Account int64
	Lease   string
	// Argv is the program and its arguments; Argv[0] is looked up in the
	// machine's PATH by the worker. It must not be empty.
	Argv []string
	// Cwd is the working directory as the machine sees it (under
	// /workspace).
	Cwd string
	// Env is the command's complete environment; nil means empty.
	Env map[string]string
	// User is who the command runs as: a user name of the machine's image
	// or a numeric uid. Empty means the image's default user. A worker that
	// does not support users refuses a non-empty User (ErrUnsupported); an
	// unknown user is a *RejectedError with code "bad-user".
	User string
	// TTY, when set, runs the command on a pseudo-terminal allocated in
	// the machine (its own devpts) of this initial size: the terminal is
	// the command's controlling terminal and its descriptors 0, 1 and 2,
	// and the Session's TTY is its master. A worker that does not support
	// terminals refuses it (ErrUnsupported).
	TTY *TTY
}

// TTY is a terminal's size in character cells; a zero field leaves the
// kernel's default (0).
type TTY struct {
	Rows, Cols uint16
}

// Exit is a session's observed outcome: exactly one of Code (the exit
// status) and Signal (the name of the signal that killed it, "SIGKILL") is
// set. Nothing is ever invented: no status is reported for a session whose
// end was not observed.
type Exit struct {
	Code   *int
	Signal string
	// OOMKilled is set with Signal when the kernel's OOM killer killed the
	// command (the machine ran out of memory).
	OOMKilled bool
}

// Session is a command running in a machine. Its three streams are the
// near ends of socketpairs whose far ends are the command's descriptors 0,
// 1 and 2 in the machine.
type Session struct {
	// ID is the session's id on the worker connection.
	ID string
	// Stdin is the command's standard input. Close delivers EOF to the
	// command (it shuts down the writing direction); the descriptor itself
	// is released when the session ends or on Session.Close.
	Stdin io.WriteCloser
	// Stdout and Stderr are the command's output streams (their dynamic
	// type is *os.File, in the runtime's poller: deadlines work). They reach EOF when every
	// process holding the far end has ended; they stay readable after the
	// session ends until closed. The caller closes them, or calls Close.
	Stdout io.ReadCloser
	Stderr io.ReadCloser
	// TTY is a terminal session's pseudo-terminal master (ExecRequest.TTY),
	// nil otherwise. Then Stdin writes to it (its Close does nothing: a
	// terminal's end of input is a character, ^D, that the caller writes),
	// Stdout reads from it (reaching EOF once no process in the machine
	// holds the terminal: the master's EIO) and Stderr is at EOF at once
	// (a terminal has one output). It is in the runtime's poller
	// (deadlines work); Close closes it.
	TTY *os.File

	c      *conn
	events chan wire.Message // exec-started or a refusal, from the reader

	mu       sync.Mutex
	stdin    *stdinEnd   // near end of stdin; guarded by mu
	out      [2]*os.File // near ends of stdout, stderr; guarded by mu
	tty      *os.File    // a terminal session's master; guarded by mu
	finished bool        // guarded by mu
	closed   bool        // streams released; guarded by mu
	wantTTY  bool        // a terminal was asked for; set before exec-start

	// startedByWorker is set by the reader on exec-started.
	startedByWorker bool
	// accepted is set by the reader on exec-accepted, or by Exec when it
	// sends exec-run (whose acceptance no frame announces).
	accepted atomic.Bool

	done       chan struct{}
	finishOnce sync.Once
	exit       Exit
	err        error

	cancelOnce sync.Once
	cancelErr  error
	closeOnce  sync.Once
}

func newSession(id string, c *conn) *Session {
	return &Session{ID: id, c: c, events: make(chan wire.Message, 4), done: make(chan struct{})}
}

// post delivers a start-phase frame without blocking the reader; a worker
// that sends more than a handful is not heard.
func (s *Session) post(m wire.Message) {
	select {
	case s.events <- m:
	default:
		s.c.g.log.Warn("too many start frames for session ignored", "id", s.ID, "type", m.Type())
	}
}

// finish settles the session once: the exit or error Wait returns. The
// stdin descriptor is released then, as os/exec's Wait closes a stdin pipe.
func (s *Session) finish(e Exit, err error) {
	s.finishOnce.Do(func() {
		s.exit, s.err = e, err
		s.mu.Lock()
		s.finished = true
		if s.stdin != nil {
			s.stdin.Close()
		}
		s.mu.Unlock()
		close(s.done)
	})
}

// Exec starts argv in the project's machine. It sends exec-start, makes
// three socketpairs, sends their far ends with exec-attach (closing them
// here right after) — or, to a worker that announced wire.FeatureExecRun,
// makes the pairs first and sends the start and the far ends as one
// exec-run frame —, and waits for the worker's answer: a refusal is
// returned as a *RejectedError and nothing was started. Once accepted, it
// returns when the worker reports the command started (exec-started) or
// already ended.
//
// ctx bounds only the start, not the session: when ctx ends first Exec
// asks the worker to cancel the session, releases every descriptor and
// returns ctx's error. A connection lost before the session started gives
// an error wrapping ErrInterrupted (after OnInterrupted was called with the
// id); a worker that cannot be reached, ErrUnavailable. On every error all
// descriptors Exec made are closed.
//
// A program that could not be executed is not an Exec error: Exec returns
// the session and its Wait reports ErrNotStarted.
func (g *Gateway) Exec(ctx context.Context, req ExecRequest) (*Session, error) {
	c, err := g.connection(ctx)
	if err != nil {
		return nil, err
	}
	id := req.ID
	if id == "" {
		id = newSessionID()
	}
	project, err := req.Project.wire(c.hello)
	if err != nil {
		return nil, err
	}
	if req.User != "" && !c.hello.Has(wire.FeatureUser) {
		return nil, fmt.Errorf("%w: a session user (feature %q)", ErrUnsupported, wire.FeatureUser)
	}
	var tty *wire.TTY
	if req.TTY != nil {
		if !c.hello.Has(wire.FeatureTTY) {
			return nil, fmt.Errorf("%w: a terminal (feature %q)", ErrUnsupported, wire.FeatureTTY)
		}
		tty = &wire.TTY{Rows: req.TTY.Rows, Cols: req.TTY.Cols}
	}
	s := newSession(id, c)
	s.wantTTY = tty != nil
	if err := c.addSession(s); err != nil {
		return nil, err
	}
	start := &wire.ExecStart{ID: id, Project: project, Account: req.Account, Lease: req.Lease,
		Argv: req.Argv, Cwd: req.Cwd, Env: req.Env, User: req.User, TTY: tty}
	var stdin *stdinEnd
	var out [2]*os.File
	if c.hello.Has(wire.FeatureExecRun) {
		// One frame, exec-run, carries the start and its descriptors, and
		// the worker answers exec-started with no exec-accepted before it:
		// three frames per command instead of five, one wake-up of the
		// worker and one of this side's reader fewer.
		if stdin, out, err = s.run(start); err != nil {
			return nil, err
		}
	} else if stdin, out, err = s.startAttach(ctx, start); err != nil {
		return nil, err
	}

	if testHookAfterAttach != nil {
		testHookAfterAttach()
	}
	// Wait for the start's outcome: exec-started, a refusal, or the end of
	// the session. exec-accepted wakes no one (the reader only records it):
	// one goroutine hand-off less per command.
	for {
		select {
		case m := <-s.events:
			switch m := m.(type) {
			case *wire.ExecStarted:
				s.setStdio(stdin, out)
				return s, nil
			case *wire.ExecRejected:
				s.closeStreams()
				return nil, rejected(m.Code, m.Message)
			case *wire.Error:
				s.closeStreams()
				return nil, rejected(m.Code, m.Message)
			}
		case <-s.done:
			// A fast command's whole life (accepted, started, exit) may be
			// read before this loop looks.
			var rej *RejectedError
			switch {
			case errors.Is(s.err, ErrInterrupted) || errors.As(s.err, &rej):
				s.closeStreams()
				return nil, s.err
			case !s.accepted.Load():
				s.closeStreams()
				if s.err != nil {
					return nil, s.err
				}
				return nil, fmt.Errorf("machine: exec %s: worker ended the session before it was accepted", id)
			}
			s.setStdio(stdin, out)
			return s, nil // exited (or not started): Wait reports it
		case <-ctx.Done():
			_ = s.Cancel(context.WithoutCancel(ctx))
			s.closeStreams()
			return nil, ctx.Err()
		}
	}
}

// run sends exec-run: the start with the far ends of three new stdio
// pairs, closed here once sent. It returns the near ends. exec-exit then
// implies acceptance (no exec-accepted comes). On error the session is
// forgotten and every descriptor closed.
func (s *Session) run(start *wire.ExecStart) (stdin *stdinEnd, out [2]*os.File, err error) {
	stdin, out, far, err := stdioPairs()
	if err != nil {
		s.c.session(s.ID, true)
		s.finish(Exit{}, err)
		return nil, out, err
	}
	s.setStreams(stdin, out)
	s.accepted.Store(true)
	err = s.sendFDs((*wire.ExecRun)(start), far[:]...)
	closeFDs(far[:])
	if err != nil {
		s.closeStreams()
		return nil, out, err
	}
	return stdin, out, nil
}

// startAttach sends exec-start, then exec-attach with the far ends of
// three new stdio pairs (closed here once sent), for a worker without
// wire.FeatureExecRun. It returns the near ends. On error it has closed
// every descriptor and cancelled what the worker may have accepted.
func (s *Session) startAttach(ctx context.Context, start *wire.ExecStart) (stdin *stdinEnd, out [2]*os.File, err error) {
	// exec-attach follows exec-start without waiting for exec-accepted: the
	// worker handles a connection's frames in order and holds a pipelined
	// attach until the session is accepted, which saves a round trip (a
	// rejected start makes the worker close the attached ends). The stdio
	// pairs are made in between, while the worker wakes up and checks the
	// start, which takes their cost (a few dozen system calls) off the
	// command's path.
	if err := s.send(start); err != nil {
		return nil, out, err
	}
	stdin, out, far, err := stdioPairs()
	s.setStreams(stdin, out)
	if err != nil {
		// The worker may have accepted the start: it ends the session on
		// exec-cancel (an exec-exit follows, or the rejection did).
		s.closeStreams()
		_ = s.Cancel(context.WithoutCancel(ctx))
		return nil, out, err
	}
	err = s.sendFDs(&wire.ExecAttach{ID: s.ID}, far[:]...)
	closeFDs(far[:])
	if err != nil {
		_ = s.Cancel(context.WithoutCancel(ctx))
		s.closeStreams()
		return nil, out, err
	}
	return stdin, out, nil
}

// setStdio exposes the near ends as the session's streams, or, for a
// terminal session, its master.
func (s *Session) setStdio(stdin *stdinEnd, out [2]*os.File) {
	s.mu.Lock()
	tty := s.tty
	s.mu.Unlock()
	if tty != nil {
		s.TTY = tty
		s.Stdin = ttyWriter{tty}
		s.Stdout = ttyReader{tty}
		s.Stderr = out[1] // its far end was closed unused: EOF
		stdin.Close()
		out[0].Close()
		return
	}
	s.Stdin = stdinWriter{stdin}
	s.Stdout = out[0]
	s.Stderr = out[1]
}

// setTTY records the master a terminal session's exec-tty carried; one
// arriving twice, or after Close, is closed.
func (s *Session) setTTY(f *os.File) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tty != nil || s.closed || !s.wantTTY {
		f.Close()
		return
	}
	s.tty = f
}

// Resize sets a terminal session's size (TIOCSWINSZ on the master): the
// command's foreground process group receives SIGWINCH. It fails for a
// session without a terminal and after Close.
func (s *Session) Resize(rows, cols uint16) error {
	s.mu.Lock()
	tty := s.tty
	s.mu.Unlock()
	if tty == nil {
		return fmt.Errorf("machine: resize %s: not a terminal session", s.ID)
	}
	rc, err := tty.SyscallConn()
	if err != nil {
		return fmt.Errorf("machine: resize %s: %w", s.ID, err)
	}
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		ierr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
	}); err != nil {
		return fmt.Errorf("machine: resize %s: %w", s.ID, err)
	}
	if ierr != nil {
		return fmt.Errorf("machine: resize %s: %w", s.ID, ierr)
	}
	return nil
}

// send sends a frame about s. An encoding error is returned as is and the
// session forgotten; an I/O error ends the connection, and send returns
// the session's interruption after OnInterrupted has run.
func (s *Session) send(m wire.Message) error { return s.sendFDs(m) }

// sendFDs is send with descriptors.
func (s *Session) sendFDs(m wire.Message, fds ...int) error {
	err := s.c.wc.SendFDs(m, fds...)
	if err == nil {
		return nil
	}
	var pe *wire.ProtocolError
	if errors.As(err, &pe) {
		s.c.session(s.ID, true)
		s.finish(Exit{}, err)
		return fmt.Errorf("machine: exec %s: %w", s.ID, err)
	}
	s.c.fail(err)
	<-s.done
	if s.err == nil { // the session had ended just before
		return fmt.Errorf("machine: exec %s: %w: %w", s.ID, ErrInterrupted, err)
	}
	return s.err
}

// setStreams records the near ends; stdin's is released at once if the
// session already ended.
func (s *Session) setStreams(stdin *stdinEnd, out [2]*os.File) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stdin, s.out = stdin, out
	if s.finished && stdin != nil {
		stdin.Close()
	}
}

// closeStreams releases every near end and the terminal's master.
func (s *Session) closeStreams() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if s.tty != nil {
		s.tty.Close()
	}
	if s.stdin != nil {
		s.stdin.Close()
	}
	for _, n := range s.out {
		if n != nil {
			n.Close()
		}
	}
}

// Close releases the session's three streams (and its terminal's master).
// It does not stop the command (see Cancel). It is idempotent and returns
// nil.
func (s *Session) Close() error {
	s.closeOnce.Do(s.closeStreams)
	return nil
}

// Done returns a channel closed when the session has ended (Wait would not
// block).
func (s *Session) Done() <-chan struct{} { return s.done }

// Wait blocks until the session ends and returns its outcome. err is nil
// whenever the worker observed the command's end: a nonzero status or a
// signal is in Exit, not an error. Otherwise Exit is zero and err wraps
// ErrNotStarted (the program was never executed), ErrInterrupted (the
// connection to the worker was lost, also wrapping ErrClosed after Close;
// the worker cancels the command and its outcome is unknown),
// ErrMachineFailed (the machine died under the started command, whose
// outcome is unknown), or is a
// *RejectedError (the worker refused the session). Wait may be called any
// number of times, from any goroutine, and returns the same result.
func (s *Session) Wait() (Exit, error) {
	<-s.done
	return s.exit, s.err
}

// Cancel asks the worker to kill the session's whole process tree
// (exec-cancel); Wait then reports how it ended (usually its signal). It
// does not wait for that. Cancel is idempotent: only the first call sends,
// later calls return the first call's result; after the session ended it
// sends nothing and returns nil. ctx is checked before sending.
func (s *Session) Cancel(ctx context.Context) error {
	select {
	case <-s.done:
		return nil
	default:
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	s.cancelOnce.Do(func() {
		if err := s.c.wc.Send(&wire.ExecCancel{ID: s.ID}); err != nil {
			s.c.fail(err)
			s.cancelErr = fmt.Errorf("machine: cancel %s: %w: %w", s.ID, ErrInterrupted, err)
		}
	})
	return s.cancelErr
}

// CanSignal reports whether Signal can reach the session's tree: the
// worker announced wire.FeatureExecSignal.
func (s *Session) CanSignal() bool { return s.c.hello.Has(wire.FeatureExecSignal) }

// Signal asks the worker to send sig to every process of the session's
// tree (exec-signal): its main process and whatever it forked, orphans
// included. It does not wait for delivery. A worker that did not announce
// wire.FeatureExecSignal gets nothing and Signal returns an error wrapping
// ErrUnsupported; after the session ended it sends nothing and returns nil.
// Processes forked while the signal is delivered may miss it; Cancel kills
// the tree without that race.
func (s *Session) Signal(sig syscall.Signal) error {
	if !s.CanSignal() {
		return fmt.Errorf("%w: signals to a session's tree (feature %q)", ErrUnsupported, wire.FeatureExecSignal)
	}
	name := unix.SignalName(sig)
	if name == "" {
		return fmt.Errorf("machine: signal %s: unknown signal %d", s.ID, int(sig))
	}
	select {
	case <-s.done:
		return nil
	default:
	}
	if err := s.c.wc.Send(&wire.ExecSignal{ID: s.ID, Signal: name}); err != nil {
		s.c.fail(err)
		return fmt.Errorf("machine: signal %s: %w: %w", s.ID, ErrInterrupted, err)
	}
	return nil
}

// stdinEnd is the near end of a session's stdin. It stays a bare
// descriptor until the first Write wraps it in an *os.File, which
// registers it with the runtime's poller: most sessions never write their
// input (they close it at once, or leave it), and registering a socket
// costs system calls and a wake-up of the poller's thread at once (a new
// socket is writable) and again when the command ends (its hang-up).
type stdinEnd struct {
	mu     sync.Mutex
	fd     int      // the bare descriptor; -1 once wrapped or released
	f      *os.File // the wrapped descriptor, after the first Write
	closed bool     // released
}

func newStdinEnd(fd int) *stdinEnd { return &stdinEnd{fd: fd} }

// file returns the wrapped descriptor, wrapping it first if need be; nil
// once released.
func (e *stdinEnd) file() *os.File {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil
	}
	if e.f == nil {
		e.f, e.fd = os.NewFile(uintptr(e.fd), "session-stdin"), -1
	}
	return e.f
}

// shutdown shuts down the writing direction: the command reads EOF.
func (e *stdinEnd) shutdown() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case e.closed:
		return os.ErrClosed
	case e.f == nil:
		return unix.Shutdown(e.fd, unix.SHUT_WR)
	}
	rc, err := e.f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.Shutdown(int(fd), unix.SHUT_WR) }); err != nil {
		return err
	}
	return serr
}

// Close releases the descriptor (a Write in progress on it fails).
// Idempotent.
func (e *stdinEnd) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil
	}
	e.closed = true
	if e.f != nil {
		return e.f.Close()
	}
	err := unix.Close(e.fd)
	e.fd = -1
	return err
}

// stdinWriter is the session's Stdin: writes go to the near end of stdin
// (a socket in the poller from the first write on); Close shuts down
// writing so the command reads EOF.
type stdinWriter struct{ e *stdinEnd }

func (w stdinWriter) Write(p []byte) (int, error) {
	f := w.e.file()
	if f == nil {
		return 0, fmt.Errorf("machine: write stdin: %w", os.ErrClosed)
	}
	return f.Write(p)
}

func (w stdinWriter) Close() error {
	if err := w.e.shutdown(); err != nil {
		return fmt.Errorf("machine: close stdin: %w", err)
	}
	return nil
}

// testHookAfterAttach, if set by a test, runs between sending exec-attach
// and looking at the worker's answers.
var testHookAfterAttach func()

// ttyWriter writes a terminal session's input to its master. Closing it
// does nothing: the master stays the session's output until Close.
type ttyWriter struct{ f *os.File }

func (w ttyWriter) Write(p []byte) (int, error) { return w.f.Write(p) }
func (w ttyWriter) Close() error                { return nil }

// ttyReader reads a terminal session's output from its master, where the
// kernel reports EIO once no process holds the slave: that is its EOF.
type ttyReader struct{ f *os.File }

func (r ttyReader) Read(p []byte) (int, error) {
	n, err := r.f.Read(p)
	if err != nil && errors.Is(err, unix.EIO) {
		err = io.EOF
	}
	return n, err
}

func (r ttyReader) Close() error { return r.f.Close() }
