package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// One session lifecycle. Every piece of work corral runs in a sandbox — a
// one-shot command (RunCommand), a WebSocket session, a terminal, a
// language server — goes through the same steps, owned here:
//
//	validate → admit → prepare (provider) → check the target → heartbeat
//	the lease → abort check → OnStart → start (host: confined or direct;
//	managed: inside the machine) → run → settle on the first of: exit,
//	lifetime, ctx, Close, a failed heartbeat, a lost transport → (exit:
//	kill what is left, drain) | (failure: cancel the tree, bounded wait,
//	short drain) → release the lease.
//
// RunCommand is Open with a capture attached to the streams; a Session
// hands the streams to its caller instead.

// SessionOptions tunes one Open call. A nil *SessionOptions and the zero
// SessionOptions both mean: no terminal, no lifetime bound, no OnStart.
type SessionOptions struct {
	// TTY, if non-nil, runs the command on a terminal of this initial
	// size: a pseudo-terminal inside a managed project's machine (its
	// /dev/pts), or one on the host for a host project. The terminal is
	// the command's controlling terminal and its descriptors 0, 1 and 2:
	// everything it writes arrives on Stdout, Stderr reaches EOF at once,
	// and Session.Resize resizes it. It is the same as setting
	// ExecInput.TTY; setting both to different sizes is refused.
	TTY *TTYSize

	// Lifetime, if positive, bounds the session from its start: when it
	// expires the command's whole process tree is cancelled and Wait
	// reports a KindTimeout error. Zero means no bound (the session lives
	// until it exits, is closed, or ctx ends); negative is refused.
	Lifetime time.Duration

	// OnStart, if non-nil, is called synchronously after preparation,
	// target validation and the initial abort check, immediately before
	// the command starts, exactly as RunOptions.OnStart. An error (or a
	// panic, as an *OnStartPanic) means the command is not started: the
	// preparation is cancelled, the lease released, and Open fails with
	// KindStart wrapping it.
	OnStart func(StartInfo) error
}

// Session is a running command whose standard streams belong to the
// caller: the long-lived counterpart of RunCommand (terminals, WebSocket
// sessions, language servers). Open returns it started; core keeps its
// lease alive while it runs.
//
// The caller must read Stdout and Stderr (io.Discard what it does not
// want), concurrently: they are pipes (or sockets) of bounded capacity, and
// a command whose output is not read blocks writing it, as under a shell
// pipeline; its Lifetime still runs. When the main process has exited, Wait
// waits for the caller to have read both streams to their end for at most
// ControlOptions.DrainTimeout (2 s), then closes them: a Read still
// blocked returns an error, and what a leftover process writes later is
// lost. A host command's leftovers are killed when its main process exits
// (its process group and, confined as an unprivileged user, its whole pid
// namespace), so its streams normally end with it.
//
// Session's methods are safe for concurrent use. The zero Session is not
// usable; only Open makes one.
type Session struct {
	// Stdin is the command's standard input. Writes block while the
	// command does not read; Close delivers EOF (on a terminal Close does
	// nothing: send the terminal's EOF character, ^D, instead). After the
	// session settled, writes fail.
	Stdin io.WriteCloser
	// Stdout and Stderr are the command's output streams. They reach EOF
	// when every process holding them has closed them, and are closed by
	// the session when it settles (see Session). On a terminal all output
	// is on Stdout and Stderr is empty.
	Stdout io.Reader
	Stderr io.Reader

	c      *Control
	in     ExecInput
	actor  Actor
	hooks  *sessionHooks
	prep   Prepared
	common *PreparedCommon
	proc   process
	att    attached
	life   time.Duration

	started      time.Time
	ended        time.Time
	stopLifetime func() bool

	stopHeartbeat func()
	heartbeatErr  chan error

	lifetime <-chan time.Time // the Lifetime's timer, for settle (inline)

	closeOnce sync.Once
	closeReq  chan struct{}
	done      chan struct{} // closed when settled
	exit      Exit
	err       *CommandError
	cut       bool // the drain bound cut the output (ErrWaitDelay)
}

// sessionHooks is how RunCommand shares the lifecycle: what Open does
// differently for a bounded, captured command.
type sessionHooks struct {
	// admitted: the caller reserved the work itself (RunCommand's
	// AdmitCommand); Open admits nothing.
	admitted bool
	// withInput: the command gets an input pipe; otherwise its input is
	// empty (host: /dev/null; managed: closed at once).
	withInput bool
	// bounded: a one-shot command (a confined host command gets the
	// minimal init, see confine.Policy.Init).
	bounded bool
	// prepared, if non-nil, is called once the target was accepted, before
	// the heartbeat starts (the journal).
	prepared func()
	// attach, if non-nil, takes the started process's streams (the
	// capture); otherwise they are the Session's.
	attach func(p process) attached
	// self, if non-nil, is set to the session as soon as it exists (for
	// the hooks, which see it before Open returns).
	self **Session
	// release, if non-nil, releases the lease of a session whose command
	// exited, in place of releaseLease (RunCommand's journal, which records
	// the exit in the same write).
	release func(ctx context.Context, l Lease, exit Exit) error
	// inline: open starts no goroutine to supervise the session; its
	// caller, which waits for the settlement at once (RunCommand), runs
	// s.settle itself. That spares a command a goroutine, a wake-up, and
	// the growth of a fresh goroutine's stack to what the lease release's
	// store call needs.
	inline bool
}

// attached is what reads a session's output, as the lifecycle sees it.
type attached struct {
	// outDone is closed when the output has been read to its end.
	outDone <-chan struct{}
	// overflow, if non-nil, is closed when the output exceeded its limit;
	// overflowErr then describes it.
	overflow    <-chan struct{}
	overflowErr func() *CommandError
	// inputFailed receives a failure of the command's input source.
	inputFailed <-chan error
	// stopInput, if non-nil, stops feeding the input once the session
	// settles (or fails).
	stopInput func()
}

// ErrHeartbeat is wrapped by the KindTransport error of a session or
// command whose lease heartbeat failed (the lease expired or was released,
// or the lease store could not be reached).
var ErrHeartbeat = errors.New("sandbox: lease heartbeat failed")

// heartbeatError is a failed heartbeat: its message, and ErrHeartbeat.
type heartbeatError struct{ err error }

func (e *heartbeatError) Error() string   { return e.err.Error() }
func (e *heartbeatError) Unwrap() []error { return []error{ErrHeartbeat, e.err} }

// Open starts a session: in's command, run on behalf of actor (explicit,
// else ctx's turn scope, as for RunCommand), with its standard streams
// handed to the caller. opts may be nil.
//
// Open takes the same steps as RunCommand, up to the start: it validates
// (KindPrepare, before any provider call), admits a session
// (ControlOptions.Admitter, kind AdmitSession: a refusal is a KindPrepare
// error wrapping ErrBusy; the reservation is given back when the lease is
// released), prepares through the provider, checks the target, starts the
// lease heartbeat (every ControlOptions.HeartbeatInterval, 5 s), refuses
// an already-cancelled ctx (KindAbort), calls OnStart, and starts the
// command: a host project's through the same launch RunCommand uses
// (confined by package confine unless the member is trusted, in its own
// process group), a managed project's inside its machine. If any step
// fails, Open returns a *CommandError (KindPrepare, KindStart, KindAbort,
// KindTimeout or KindTransport), having cancelled what was prepared and
// released the lease; nothing is left running.
//
// On success the caller owns the Session and must Close it (or Wait for it
// to settle): until then its lease is held. ctx is the session's abort, as
// for RunCommand: when ctx ends, the command's whole process tree is
// cancelled and Wait reports KindAbort.
func (c *Control) Open(ctx context.Context, in ExecInput, actor *Actor, opts *SessionOptions) (*Session, error) {
	var o SessionOptions
	if opts != nil {
		o = *opts
	}
	a, err := resolveActor(ctx, actor)
	if err != nil {
		return nil, newError(KindPrepare, err, "%v", err)
	}
	if o.TTY != nil {
		if in.TTY != nil && *in.TTY != *o.TTY {
			return nil, newError(KindPrepare, nil, "the terminal size is given twice (%dx%d and %dx%d)", in.TTY.Rows, in.TTY.Cols, o.TTY.Rows, o.TTY.Cols)
		}
		in.TTY = o.TTY
	}
	if err := in.Validate(); err != nil {
		return nil, newError(KindPrepare, err, "%v", err)
	}
	if o.Lifetime < 0 {
		return nil, newError(KindPrepare, nil, "lifetime must not be negative")
	}
	s, ce := c.open(ctx, in, a, o, &sessionHooks{withInput: true})
	if ce != nil {
		return nil, ce
	}
	return s, nil
}

// open runs the lifecycle up to a started session (in and the actor
// already validated). On failure everything prepared was cancelled and
// released.
func (c *Control) open(ctx context.Context, in ExecInput, a Actor, o SessionOptions, h *sessionHooks) (*Session, *CommandError) {
	if in.TTY != nil && (in.TTY.Rows == 0 || in.TTY.Cols == 0) {
		return nil, newError(KindPrepare, nil, "a terminal needs at least one row and one column")
	}
	s := &Session{c: c, in: in, actor: a, hooks: h, life: o.Lifetime, closeReq: make(chan struct{}), done: make(chan struct{})}
	if h.self != nil {
		*h.self = s
	}
	if !h.admitted {
		release, ce := c.admit(ctx, Admission{Kind: AdmitSession, Account: a.AccountUserID})
		if ce != nil {
			return nil, ce
		}
		defer func() {
			if s.common == nil {
				release() // no lease took the reservation
			}
		}()
		h.admitted = true
		h.prepared = chain(func() { s.common.Lease = wrapAdmitted(s.common.Lease, release) }, h.prepared)
	}
	prep, err := c.provider.PrepareExecution(ctx, in, a)
	if err != nil {
		return nil, newError(KindPrepare, err, "preparation refused: %v", err)
	}
	if err := CheckTarget(in, a, prep); err != nil {
		ce := newError(KindPrepare, err, "%v", err)
		if prep != nil && prep.Common().Lease != nil {
			ce.Cleanup = releaseLease(ctx, prep.Common().Lease)
		}
		return nil, ce
	}
	s.prep, s.common = prep, prep.Common()
	if h.prepared != nil {
		h.prepared()
	}
	s.startHeartbeat(ctx)

	if err := ctx.Err(); err != nil {
		return nil, s.failUnstarted(ctx, newError(KindAbort, err, "aborted before start"))
	}
	if o.OnStart != nil {
		info := StartInfo{LeaseID: s.common.Lease.ID(), Project: s.common.Project, DisplayCwd: s.common.DisplayCwd}
		if err := callOnStart(o.OnStart, info); err != nil {
			return nil, s.failUnstarted(ctx, newError(KindStart, err, "onStart: %v", err))
		}
	}

	var lifetime <-chan time.Time
	startCtx, cancelStart := ctx, context.CancelFunc(func() {})
	if s.life > 0 {
		t := time.NewTimer(s.life)
		lifetime = t.C
		// The start counts against the lifetime, and the caller may
		// abort it.
		startCtx, cancelStart = context.WithTimeout(ctx, s.life)
		defer func() {
			if s.proc == nil {
				t.Stop()
			}
		}()
		s.stopLifetime = t.Stop
	}
	s.started = time.Now()
	proc, err := s.start(startCtx)
	startErr := startCtx.Err()
	cancelStart()
	if err != nil {
		switch {
		case ctx.Err() != nil:
			return nil, s.failUnstarted(ctx, newError(KindAbort, ctx.Err(), "aborted while starting: %v", err))
		case errors.Is(startErr, context.DeadlineExceeded):
			return nil, s.failUnstarted(ctx, newError(KindTimeout, context.DeadlineExceeded, "command timed out after %v while starting", s.life))
		case errors.Is(err, ErrTransport):
			return nil, s.failUnstarted(ctx, newError(KindTransport, err, "start %s: %v", in.Command.File, err))
		}
		return nil, s.failUnstarted(ctx, startError(err))
	}
	s.proc = proc
	if h.attach != nil {
		s.att = h.attach(proc)
	} else {
		s.attachCaller(proc)
	}
	if h.inline {
		s.lifetime = lifetime
	} else {
		go s.supervise(ctx, lifetime)
	}
	return s, nil
}

// settle supervises a session opened with sessionHooks.inline, in the
// calling goroutine, until it settled.
func (s *Session) settle(ctx context.Context) { s.supervise(ctx, s.lifetime) }

// chain returns a function calling f then g (either may be nil).
func chain(f, g func()) func() {
	if g == nil {
		return f
	}
	return func() { f(); g() }
}

// start starts the prepared command.
func (s *Session) start(ctx context.Context) (process, error) {
	withInput := s.hooks.withInput || len(s.preparedInput()) > 0
	switch p := s.prep.(type) {
	case *LocalPrepared:
		return startLocal(p, localStart{withInput: withInput, bounded: s.hooks.bounded, tty: s.in.TTY})
	case *ManagedPrepared:
		return startManaged(ctx, p, withInput)
	}
	return nil, fmt.Errorf("unknown prepared type %T", s.prep)
}

// preparedInput is the provider's prepared input, if any.
func (s *Session) preparedInput() []byte {
	switch p := s.prep.(type) {
	case *LocalPrepared:
		return p.Stdin
	case *ManagedPrepared:
		return p.Stdin
	}
	return nil
}

// attachCaller hands the streams to the caller, tracking when both have
// been read to their end.
func (s *Session) attachCaller(p process) {
	outDone := make(chan struct{})
	var left atomic.Int32
	left.Store(2)
	end := func() {
		if left.Add(-1) == 0 {
			close(outDone)
		}
	}
	stdout, stderr := p.outputs()
	s.Stdout = &trackedReader{r: stdout, end: end}
	if stderr == nil {
		end()
		s.Stderr = eofReader{}
	} else {
		s.Stderr = &trackedReader{r: stderr, end: end}
	}
	in := p.input()
	if prepared := s.preparedInput(); len(prepared) > 0 && in != nil {
		// Small by contract: written before anything the caller writes.
		_, _ = in.Write(prepared)
	}
	if in == nil {
		in = closedInput{}
	}
	s.Stdin = in
	s.att = attached{outDone: outDone}
}

// trackedReader reports the first error (io.EOF included) its reader
// returns.
type trackedReader struct {
	r    io.Reader
	once sync.Once
	end  func()
}

func (t *trackedReader) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	if err != nil {
		t.once.Do(t.end)
	}
	return n, err
}

type eofReader struct{}

func (eofReader) Read([]byte) (int, error) { return 0, io.EOF }

// closedInput is the input of a session that has none.
type closedInput struct{}

func (closedInput) Write([]byte) (int, error) { return 0, io.ErrClosedPipe }
func (closedInput) Close() error              { return nil }

// LeaseID returns the ID of the lease covering the session.
func (s *Session) LeaseID() string { return s.common.Lease.ID() }

// Info returns what OnStart saw: the lease, the project and the display
// working directory.
func (s *Session) Info() StartInfo {
	return StartInfo{LeaseID: s.common.Lease.ID(), Project: s.common.Project, DisplayCwd: s.common.DisplayCwd}
}

// Resize changes the size of the session's terminal; its foreground job
// gets SIGWINCH. It fails for a session without a terminal
// (SessionOptions.TTY) and after the session settled.
func (s *Session) Resize(rows, cols uint16) error {
	if rows == 0 || cols == 0 {
		return errors.New("sandbox: a terminal needs at least one row and one column")
	}
	select {
	case <-s.done:
		return errors.New("sandbox: the session has ended")
	default:
	}
	return s.proc.resize(rows, cols)
}

// Signal sends sig to every process of the command's tree that the
// provider can reach — a host command's process group, a managed command's
// whole session in its machine — without waiting for them to end; the
// command may handle it (Close kills regardless). An error wrapping
// errors.ErrUnsupported means the provider cannot signal a tree. After the
// session settled it fails.
func (s *Session) Signal(sig syscall.Signal) error {
	select {
	case <-s.done:
		return errors.New("sandbox: the session has ended")
	default:
	}
	return s.proc.signal(sig)
}

// Done is closed when the session has settled: Wait then returns at once.
func (s *Session) Done() <-chan struct{} { return s.done }

// Wait blocks until the session settles and returns how its main process
// ended: exactly one of Exit.Code and Exit.Signal, a nonzero code being an
// exit like any other. By then the lease is released and the streams are
// closed (see Session for the bounded drain).
//
// Otherwise the error is a *CommandError, and never carries an exit code:
// KindTimeout (SessionOptions.Lifetime expired), KindAbort (ctx ended or
// Close was called before the command exited), KindTransport (the lease
// heartbeat failed, wrapping ErrHeartbeat, or the link to the machine was
// lost), KindStart (the program could not be executed, when the provider
// learns it only after the start) or KindCleanup (the command exited but
// releasing the lease failed). In every failure but KindCleanup the
// command's whole process tree was cancelled, waited for (at most
// ControlOptions.CancelWait) and the lease released; a failure of that
// cleanup is the error's Cleanup. The error has no partial output: the
// output was the caller's.
//
// Wait may be called any number of times, concurrently, and with Close.
func (s *Session) Wait() (Exit, error) {
	<-s.done
	if s.err != nil {
		return Exit{}, s.err
	}
	return s.exit, nil
}

// Close ends the session: if the command is still running it cancels the
// whole process tree (Wait then reports KindAbort), waits for it to end
// for at most ControlOptions.CancelWait, closes the streams and releases
// the lease. If the command had already exited, Close only waits for that
// settlement. Close blocks until the session settled, or until ctx ends
// (then it returns ctx's error while the bounded teardown finishes on its
// own). It returns what failed in the teardown — the cancellation or the
// lease release — or nil. It is idempotent and safe to call concurrently
// with Wait and with itself; every call that waits returns the same
// result.
func (s *Session) Close(ctx context.Context) error {
	s.closeOnce.Do(func() { close(s.closeReq) })
	select {
	case <-s.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	if s.err != nil {
		return s.err.Cleanup
	}
	return nil
}

// supervise settles the session on the first of its events.
func (s *Session) supervise(ctx context.Context, lifetime <-chan time.Time) {
	defer close(s.done)
	defer func() { s.ended = time.Now() }()
	if s.stopLifetime != nil {
		defer s.stopLifetime()
	}

	p := s.proc
	var failure *CommandError
	closed := false // the caller gave the streams up (Close)
	select {
	case <-p.done():
	case <-lifetime:
		failure = newError(KindTimeout, context.DeadlineExceeded, "command timed out after %v", s.life)
	case <-ctx.Done():
		failure = newError(KindAbort, ctx.Err(), "aborted: %v", ctx.Err())
	case <-s.att.overflow:
		failure = s.att.overflowErr()
	case err := <-s.heartbeatErr:
		failure = newError(KindTransport, err, "lease heartbeat failed: %v", err)
	case err := <-s.att.inputFailed:
		failure = newError(KindTransport, err, "reading the command's input: %v", err)
	case <-s.closeReq:
		select {
		case <-p.done(): // it had exited: an exit, not an abort
		default:
			failure = newError(KindAbort, context.Canceled, "the session was closed")
			closed = true
		}
	}
	if s.att.stopInput != nil {
		// The copy stops with the command (or its failure).
		s.att.stopInput()
	}

	if failure == nil {
		// The main process ended. Leave nothing running, then drain —
		// unless the session was lost: then its streams may stay open
		// until a slow teardown, and the failure path drains briefly.
		p.ended()
		exit, err := p.exit()
		if err == nil || errors.Is(err, ErrNotStarted) {
			s.cut = s.drainFor(s.c.opts.DrainTimeout)
		}
		switch {
		case s.overflowed():
			failure = s.att.overflowErr()
		case err != nil && errors.Is(err, ErrNotStarted):
			failure = startError(err)
		case err != nil:
			failure = newError(KindTransport, err, "%v", err)
		case !exit.Valid():
			failure = newError(KindTransport, nil, "provider reported an exit with neither code nor signal")
		default:
			s.stopHeartbeat()
			s.closeInput()
			exit = Exit{Code: exit.Code, Signal: exit.Signal, OOMKilled: exit.OOMKilled && exit.Signal != ""}
			l := s.common.Lease
			release := l.Release
			if s.hooks.release != nil {
				release = func(ctx context.Context) error { return s.hooks.release(ctx, l, exit) }
			}
			if err := releaseWith(ctx, l, release); err != nil {
				s.err = &CommandError{Kind: KindCleanup, Message: err.Error(), Cleanup: err}
				return
			}
			s.exit = exit
			return
		}
	}

	// Failure: cancel the tree, wait for it (bounded), drain, release.
	s.stopHeartbeat()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.c.opts.CancelWait)
	defer cancel()
	var cleanup []error
	if err := p.cancel(cctx); err != nil {
		cleanup = append(cleanup, fmt.Errorf("cancel: %w", err))
	}
	select {
	case <-p.done():
		_, _ = p.exit() // a managed session's provider releases what it held
	case <-cctx.Done():
		cleanup = append(cleanup, fmt.Errorf("command did not end within %v of cancellation", s.c.opts.CancelWait))
		go func() {
			<-p.done()
			_, _ = p.exit()
		}()
	}
	// A cancelled tree closes its streams at once; a lost transport may
	// leave them to a slow teardown. Either way the caller learns of the
	// failure promptly, with what was read.
	// A caller that closed the session reads nothing more: no drain.
	drain := min(s.c.opts.DrainTimeout, failureDrain)
	if closed {
		drain = 0
	}
	s.drainFor(drain)
	s.closeInput()
	if err := releaseLease(ctx, s.common.Lease); err != nil {
		cleanup = append(cleanup, err)
	}
	failure.Cleanup = errors.Join(cleanup...)
	s.err = failure
}

func (s *Session) overflowed() bool {
	if s.att.overflow == nil {
		return false
	}
	select {
	case <-s.att.overflow:
		return true
	default:
		return false
	}
}

// closeInput closes the command's input as the session settles, so that a
// blocked write returns.
func (s *Session) closeInput() {
	if in := s.proc.input(); in != nil {
		_ = in.Close()
	}
}

// failureDrain bounds the drain after a failure.
const failureDrain = 250 * time.Millisecond

// drainFor waits for the output to be read to its end (or to overflow),
// at most d, then closes the streams so no reader is left behind. It
// reports whether the bound cut the output (the streams were still open).
func (s *Session) drainFor(d time.Duration) (cut bool) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-s.att.outDone:
	case <-s.att.overflow:
	case <-t.C:
		cut = true
	}
	s.proc.closeOutputs()
	return cut
}

// failUnstarted cancels a preparation whose command never ran and releases
// its lease.
func (s *Session) failUnstarted(ctx context.Context, ce *CommandError) *CommandError {
	s.stopHeartbeat()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.c.opts.CancelWait)
	defer cancel()
	var cleanup []error
	var cancelFn func(context.Context) error
	switch p := s.prep.(type) {
	case *LocalPrepared:
		cancelFn = p.Cancel
	case *ManagedPrepared:
		cancelFn = p.Cancel
	}
	if cancelFn != nil {
		if err := cancelFn(cctx); err != nil {
			cleanup = append(cleanup, fmt.Errorf("cancel: %w", err))
		}
	}
	if err := releaseLease(ctx, s.common.Lease); err != nil {
		cleanup = append(cleanup, err)
	}
	ce.Cleanup = errors.Join(cleanup...)
	return ce
}

func (s *Session) startHeartbeat(ctx context.Context) {
	s.heartbeatErr = make(chan error, 1)
	id := s.common.Lease.ID()
	s.stopHeartbeat = keepAlive(ctx, s.common.Lease, s.c.opts.HeartbeatInterval, func(err error) {
		select {
		case s.heartbeatErr <- &heartbeatError{fmt.Errorf("lease %s: %w", id, err)}:
		default:
		}
	})
}

// keepAlive heartbeats l every interval (through its KeepAliver if it has
// one, else with a goroutine of its own) until the returned stop is
// called. The first failed heartbeat calls failed, once, and ends the
// keep-alive; failed must not block or call stop. stop is idempotent and
// returns once failed is no longer running and will not be called.
func keepAlive(ctx context.Context, l Lease, interval time.Duration, failed func(error)) (stop func()) {
	if ka, ok := l.(KeepAliver); ok {
		var once sync.Once
		stopKA := ka.KeepAlive(interval, failed)
		return func() { once.Do(stopKA) }
	}
	hctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-hctx.Done():
				return
			case <-t.C:
				if err := l.Heartbeat(hctx); err != nil {
					if hctx.Err() == nil {
						failed(err)
					}
					return
				}
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			<-done
		})
	}
}
