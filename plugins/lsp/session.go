package lspplugin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/corral-sandbox/corral/sandbox"
)

// Reason says why a session ended.
type Reason string

// The reasons a session ends.
const (
	// ReasonClosed: the caller closed the session.
	ReasonClosed Reason = "closed"
	// ReasonExited: the server exited (or closed its output and was then
	// torn down).
	ReasonExited Reason = "exited"
	// ReasonServerProtocol: the server wrote something that is not a
	// framed JSON-RPC message (see ErrFraming).
	ReasonServerProtocol Reason = "serverProtocol"
	// ReasonClientProtocol: Send was given something that is not one
	// JSON-RPC message (see CheckMessage).
	ReasonClientProtocol Reason = "clientProtocol"
	// ReasonHeartbeat: the lease heartbeat failed (the lease expired or
	// was released, or the lease store is unreachable).
	ReasonHeartbeat Reason = "heartbeat"
	// ReasonTransport: the server's input could not be written, or the
	// session's transport failed.
	ReasonTransport Reason = "transport"
)

// ErrClosed is matched (errors.Is) by every *CloseError: the session has
// ended.
var ErrClosed = errors.New("lsp: session closed")

// CloseError says why a session ended.
type CloseError struct {
	Reason  Reason
	Message string
	// Exit is how the server ended, when Reason is ReasonExited and it was
	// observed; nil otherwise.
	Exit *sandbox.Exit
	// Err is the underlying error, if any.
	Err error
}

func (e *CloseError) Error() string { return "lsp: session closed: " + e.Message }

// Unwrap returns the underlying error.
func (e *CloseError) Unwrap() error { return e.Err }

// Is reports whether target is ErrClosed.
func (e *CloseError) Is(target error) bool { return target == ErrClosed }

// Session is one running language server. Its methods are safe for
// concurrent use; ReadMessage should have one caller at a time to keep the
// server's messages in order, and so should Send.
type Session struct {
	c      *Control
	server string
	prep   *sandbox.ManagedPrepared
	exec   *sandbox.ManagedExecutionSession
	lease  sandbox.Lease
	log    *slog.Logger

	msgs       chan []byte
	readerDone chan error    // receives the reader's end, once
	stderrDone chan struct{} // closed when stderr is drained
	wmu        sync.Mutex    // serializes writes to the server's input

	mu      sync.Mutex
	reason  *CloseError
	dying   chan struct{} // closed when reason is set
	done    chan struct{} // closed when teardown finished
	cleanup error         // set before done is closed
}

func newSession(c *Control, server string, mp *sandbox.ManagedPrepared, exec *sandbox.ManagedExecutionSession) *Session {
	s := &Session{
		c:          c,
		server:     server,
		prep:       mp,
		exec:       exec,
		lease:      mp.Lease,
		log:        c.log.With("server", server, "lease", mp.Lease.ID()),
		msgs:       make(chan []byte),
		readerDone: make(chan error, 1),
		stderrDone: make(chan struct{}),
		dying:      make(chan struct{}),
		done:       make(chan struct{}),
	}
	go s.read()
	go s.drainStderr()
	go s.supervise()
	return s
}

// Server returns the server's configured name.
func (s *Session) Server() string { return s.server }

// LeaseID returns the ID of the lease covering the session.
func (s *Session) LeaseID() string { return s.lease.ID() }

// ReadMessage returns the server's next message: one JSON object, as the
// server framed it. It blocks until a message arrives, the session ends
// (the *CloseError of Err, which matches ErrClosed), or ctx ends (ctx's
// error; the session goes on). Messages the server wrote before it exited
// are delivered (within the drain bound) before the end is reported.
func (s *Session) ReadMessage(ctx context.Context) ([]byte, error) {
	select {
	case m := <-s.msgs:
		return m, nil
	case <-s.dying:
		return nil, s.Err()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Send frames msg onto the server's input. msg must be one JSON-RPC
// message: a JSON object of at most the control's MaxMessage bytes;
// anything else ends the session (ReasonClientProtocol) and Send returns
// its *CloseError. A failed write ends it too (ReasonTransport, unless the
// server was exiting). Send blocks while the server does not read its
// input; closing the session unblocks it. After the session ended, Send
// returns its *CloseError.
func (s *Session) Send(msg []byte) error {
	select {
	case <-s.dying:
		return s.Err()
	default:
	}
	if err := CheckMessage(msg, s.c.opts.MaxMessage); err != nil {
		return s.fail(&CloseError{Reason: ReasonClientProtocol, Message: "invalid message from the client: " + err.Error(), Err: err})
	}
	s.wmu.Lock()
	err := WriteMessage(s.exec.Stdin, msg)
	s.wmu.Unlock()
	if err == nil {
		return nil
	}
	// The server closed its input: most likely it is exiting. Let its
	// exit be the reason if it comes soon.
	t := time.NewTimer(s.c.opts.Drain)
	defer t.Stop()
	select {
	case <-s.dying:
	case <-t.C:
	}
	return s.fail(&CloseError{Reason: ReasonTransport, Message: "cannot write to the server: " + err.Error(), Err: err})
}

// Close ends the session (ReasonClosed, unless it already ended for
// another reason) and blocks until the server was torn down: its process
// tree cancelled, unless it had exited, and its lease released. It returns
// what failed in that teardown (nil if nothing did). It may be called any
// number of times and concurrently; every call returns the same result.
func (s *Session) Close() error {
	s.fail(&CloseError{Reason: ReasonClosed, Message: "closed by the client"})
	<-s.done
	return s.cleanup
}

// Done is closed once the session ended and the server was torn down.
func (s *Session) Done() <-chan struct{} { return s.done }

// Err returns why the session ended (a *CloseError), or nil while it runs.
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reason == nil {
		return nil
	}
	return s.reason
}

// CleanupErr returns what failed in the teardown once Done is closed (nil
// if nothing did, or while the session runs).
func (s *Session) CleanupErr() error {
	select {
	case <-s.done:
		return s.cleanup
	default:
		return nil
	}
}

// fail ends the session with ce unless it already ended, and returns the
// reason that won.
func (s *Session) fail(ce *CloseError) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reason == nil {
		s.reason = ce
		close(s.dying)
	}
	return s.reason
}

// read turns the server's output into messages until it ends.
func (s *Session) read() {
	r := NewReader(s.exec.Stdout, s.c.opts.MaxMessage)
	for {
		m, err := r.ReadMessage()
		if err != nil {
			if errors.Is(err, ErrFraming) {
				// The message is the framing error itself ("lsp: bad message
				// framing: …"), short enough for a WebSocket close reason.
				s.fail(&CloseError{Reason: ReasonServerProtocol, Message: err.Error(), Err: err})
			}
			s.readerDone <- err
			return
		}
		select {
		case s.msgs <- m:
		case <-s.dying:
			s.readerDone <- ErrClosed
			return
		}
	}
}

// drainStderr logs the server's standard error, bounded, and drops the
// rest.
func (s *Session) drainStderr() {
	defer close(s.stderrDone)
	limit := s.c.opts.StderrLimit
	buf := make([]byte, 4096)
	var line []byte
	logged := 0
	for {
		n, err := s.exec.Stderr.Read(buf)
		for _, b := range buf[:n] {
			if logged >= limit {
				break
			}
			if b != '\n' && len(line) < 1024 {
				line = append(line, b)
				continue
			}
			if b == '\n' {
				logged += len(line) + 1
				s.log.Debug("lsp: server stderr", "line", string(bytes.TrimRight(line, "\r")))
				line = line[:0]
			}
		}
		if err != nil {
			if len(line) > 0 && logged < limit {
				s.log.Debug("lsp: server stderr", "line", string(line))
			}
			return
		}
	}
}

// supervise heartbeats the lease, notices the server's end, and tears the
// session down once it ends for any reason.
func (s *Session) supervise() {
	tick := time.NewTicker(s.c.opts.HeartbeatInterval)
	defer tick.Stop()
	exited := s.exec.Done()
	readerDone := s.readerDone
	readerEnded := false
loop:
	for {
		select {
		case <-s.dying:
			break loop
		case err := <-readerDone:
			readerEnded, readerDone = true, nil
			if s.Err() != nil {
				break loop
			}
			// The server closed its output: it should be exiting.
			if !s.waitOrDying(exited) {
				s.fail(&CloseError{Reason: ReasonExited, Message: "the server closed its output without exiting", Err: err})
				break loop
			}
			s.exitReason()
			break loop
		case <-exited:
			// Deliver what the server wrote before it exited (bounded).
			if !readerEnded {
				select {
				case <-readerDone:
					readerEnded = true
				case <-s.dying:
				case <-time.After(s.c.opts.Drain):
				}
			}
			s.exitReason()
			break loop
		case <-tick.C:
			ctx, cancel := context.WithTimeout(context.Background(), max(s.c.opts.HeartbeatInterval, 10*time.Second))
			err := s.lease.Heartbeat(ctx)
			cancel()
			if err != nil {
				s.fail(&CloseError{Reason: ReasonHeartbeat, Message: "lease heartbeat failed: " + err.Error(), Err: err})
				break loop
			}
		}
	}
	s.teardown(readerEnded)
}

// waitOrDying waits up to the drain bound for ch; it reports whether ch
// was closed.
func (s *Session) waitOrDying(ch <-chan struct{}) bool {
	t := time.NewTimer(s.c.opts.Drain)
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-s.dying:
		return false
	case <-t.C:
		return false
	}
}

// exitReason ends the session with the server's exit.
func (s *Session) exitReason() {
	exit, err := s.exec.Wait()
	if err != nil {
		s.fail(&CloseError{Reason: ReasonTransport, Message: "the server's session failed: " + err.Error(), Err: err})
		return
	}
	msg := "the server exited"
	switch {
	case exit.Code != nil:
		msg += " with code " + strconv.Itoa(*exit.Code)
	case exit.Signal != "":
		msg += " on signal " + exit.Signal
	}
	s.fail(&CloseError{Reason: ReasonExited, Message: msg, Exit: &exit})
}

// teardown cancels the server unless it exited, waits for it (bounded),
// closes its streams, releases the lease and closes done.
func (s *Session) teardown(readerEnded bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var errs []error
	select {
	case <-s.exec.Done():
	default:
		if err := s.prep.Cancel(ctx); err != nil {
			errs = append(errs, fmt.Errorf("lsp: cancel: %w", err))
		}
		t := time.NewTimer(s.c.opts.CancelWait)
		select {
		case <-s.exec.Done():
		case <-t.C:
			errs = append(errs, errors.New("lsp: the server did not end after cancel"))
		}
		t.Stop()
	}
	_ = s.exec.Stdin.Close()
	_ = s.exec.Stdout.Close()
	_ = s.exec.Stderr.Close()
	if !readerEnded {
		<-s.readerDone
	}
	<-s.stderrDone
	if err := s.lease.Release(ctx); err != nil {
		errs = append(errs, fmt.Errorf("lsp: release lease %s: %w", s.lease.ID(), err))
	}
	s.cleanup = errors.Join(errs...)
	reason := s.Err().(*CloseError)
	if s.cleanup != nil {
		s.log.Warn("lsp: session teardown", "reason", reason.Reason, "err", s.cleanup)
	} else {
		s.log.Debug("lsp: session ended", "reason", reason.Reason, "message", reason.Message)
	}
	close(s.done)
}
