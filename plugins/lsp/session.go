package lsp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
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

// Session is one running language server: the framing of LSP messages
// over a sandbox.Session, which owns the lifecycle (heartbeat, cancel,
// drain, release). Its methods are safe for concurrent use; ReadMessage
// should have one caller at a time to keep the server's messages in order,
// and so should Send.
type Session struct {
	c      *Control
	server string
	sess   *sandbox.Session
	stop   context.CancelFunc // ends the sandbox session's context
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

func newSession(c *Control, server string, sess *sandbox.Session, stop context.CancelFunc) *Session {
	s := &Session{
		c:          c,
		server:     server,
		sess:       sess,
		stop:       stop,
		log:        c.log.With("server", server, "lease", sess.LeaseID()),
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
func (s *Session) LeaseID() string { return s.sess.LeaseID() }

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
	err := WriteMessage(s.sess.Stdin, msg)
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
	r := NewReader(s.sess.Stdout, s.c.opts.MaxMessage)
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
			// Read the rest, so that the session's drain is not held.
			_, _ = io.Copy(io.Discard, s.sess.Stdout)
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
		n, err := s.sess.Stderr.Read(buf)
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

// supervise maps the sandbox session's end, or the server's closed output,
// onto the session's reason, and tears the session down once it ends for
// any reason.
func (s *Session) supervise() {
	settled := s.sess.Done()
	select {
	case <-s.dying:
	case err := <-s.readerDone:
		s.readerDone <- err // for teardown
		if s.Err() != nil {
			break
		}
		// The server closed its output: it should be exiting.
		t := time.NewTimer(s.c.opts.Drain)
		select {
		case <-settled:
			s.exitReason()
		case <-s.dying:
		case <-t.C:
			s.fail(&CloseError{Reason: ReasonExited, Message: "the server closed its output without exiting", Err: err})
		}
		t.Stop()
	case <-settled:
		// The sandbox session delivered what the server wrote before it
		// exited (bounded by its drain) before it settled.
		s.exitReason()
	}
	s.teardown()
}

// exitReason ends the session with the way the sandbox session settled.
func (s *Session) exitReason() {
	exit, err := s.sess.Wait()
	var ce *sandbox.CommandError
	switch {
	case errors.Is(err, sandbox.ErrHeartbeat):
		s.fail(&CloseError{Reason: ReasonHeartbeat, Message: "lease heartbeat failed: " + unwrapCause(err).Error(), Err: err})
		return
	case errors.As(err, &ce) && ce.Kind == sandbox.KindCleanup:
		// The server exited; releasing its lease failed (teardown says so).
		s.fail(&CloseError{Reason: ReasonExited, Message: "the server exited", Err: err})
		return
	case err != nil:
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

// unwrapCause is a CommandError's cause (its message without the kind).
func unwrapCause(err error) error {
	var ce *sandbox.CommandError
	if errors.As(err, &ce) && ce.Cause != nil {
		return ce.Cause
	}
	return err
}

// teardown closes the sandbox session (cancelling the server unless it
// exited, releasing the lease), waits for the readers and closes done.
func (s *Session) teardown() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var errs []error
	if err := s.sess.Close(ctx); err != nil {
		errs = append(errs, fmt.Errorf("lsp: %w", err))
	}
	s.stop()
	<-s.readerDone
	<-s.stderrDone
	s.cleanup = errors.Join(errs...)
	reason := s.Err().(*CloseError)
	if s.cleanup != nil {
		s.log.Warn("lsp: session teardown", "reason", reason.Reason, "err", s.cleanup)
	} else {
		s.log.Debug("lsp: session ended", "reason", reason.Reason, "message", reason.Message)
	}
	close(s.done)
}
