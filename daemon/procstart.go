package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"syscall"
	"time"

	"github.com/corral-sandbox/corral/sandbox"
)

// procSession is a started background command as the process manager
// drives it: its output streams, its settlement, a signal for its whole
// tree, and Close. It is the seam between the manager and the session
// lifecycle (today the daemon's own prepare/start/keep-alive below; later
// sandbox.Control.Open).
type procSession interface {
	// LeaseID is the lease that covers the command.
	LeaseID() string
	// Stdout and Stderr are its output; for a terminal, Stdout carries
	// everything and Stderr is empty.
	Stdout() io.Reader
	Stderr() io.Reader
	// Done is closed when the main process ended or the session was lost.
	Done() <-chan struct{}
	// Wait blocks until Done and reports how it ended: an Exit, or an
	// error (wrapping sandbox.ErrTransport when the lease or the machine
	// was lost, sandbox.ErrNotStarted when the program never ran).
	Wait() (sandbox.Exit, error)
	// Signal sends sig to every process of the command's tree; an error
	// wrapping errors.ErrUnsupported means the provider cannot (Close
	// still kills the tree).
	Signal(sig syscall.Signal) error
	// Close kills the tree if it still runs, waits for it to end (bounded
	// by ctx), stops keeping the lease alive, releases it and closes the
	// streams. It is idempotent; later calls return the first's result.
	Close(ctx context.Context) error
}

// startProcSession prepares and starts in as actor, with the lease kept
// alive every beat until Close. A refused preparation or a failed start
// returns an error and leaves nothing running, no lease live.
func (a *App) startProcSession(ctx context.Context, ctl *sandbox.Control, in sandbox.ExecInput, actor *sandbox.Actor) (procSession, error) {
	prep, err := ctl.PrepareExecution(ctx, in, actor)
	if err != nil {
		return nil, err
	}
	s := &daemonProc{lease: prep.Common().Lease, done: make(chan struct{}), lostC: make(chan struct{})}
	var start func(context.Context) (*sandbox.ManagedExecutionSession, error)
	switch p := prep.(type) {
	case *sandbox.ManagedPrepared:
		start, s.cancel = p.Start, p.Cancel
	case *sandbox.LocalPrepared:
		var localCancel func(context.Context) error
		start = func(context.Context) (*sandbox.ManagedExecutionSession, error) {
			sess, c, err := startLocalSession(p, in.TTY)
			localCancel = c
			return sess, err
		}
		s.cancel = func(ctx context.Context) error {
			if localCancel != nil {
				return localCancel(ctx)
			}
			if p.Cancel != nil {
				return p.Cancel(ctx)
			}
			return nil
		}
	default:
		return nil, fmt.Errorf("daemon: unknown prepared execution %T", prep)
	}
	sess, err := start(ctx)
	if err != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		err = errors.Join(err, s.cancel(cctx), s.lease.Release(cctx))
		return nil, err
	}
	s.sess = sess
	if in.TTY == nil {
		// Nobody writes a background command's input: it reads EOF.
		_ = sess.Stdin.Close()
	}
	if ka, ok := s.lease.(sandbox.KeepAliver); ok {
		s.stopBeat = ka.KeepAlive(a.opts.SessionHeartbeat, s.lost)
	} else {
		s.stopBeat = a.heartbeatLoop(s.lease, s.lost)
	}
	go func() {
		select {
		case <-sess.Done():
		case <-s.lostC:
		}
		close(s.done)
	}()
	return s, nil
}

// heartbeatLoop heartbeats l every SessionHeartbeat until stop; the first
// failure calls failed and ends the loop.
func (a *App) heartbeatLoop(l sandbox.Lease, failed func(error)) (stop func()) {
	quit := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		tick := time.NewTicker(a.opts.SessionHeartbeat)
		defer tick.Stop()
		for {
			select {
			case <-quit:
				return
			case <-tick.C:
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				err := l.Heartbeat(ctx)
				cancel()
				if err != nil {
					failed(err)
					return
				}
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(quit); <-ended }) }
}

// daemonProc is a procSession over PrepareExecution and the prepared
// execution's start.
type daemonProc struct {
	lease    sandbox.Lease
	sess     *sandbox.ManagedExecutionSession
	cancel   func(context.Context) error
	stopBeat func()
	done     chan struct{}

	mu      sync.Mutex
	lostErr error
	lostC   chan struct{} // closed when lostErr is set

	closeOnce sync.Once
	closeErr  error
}

func (s *daemonProc) LeaseID() string       { return s.lease.ID() }
func (s *daemonProc) Stdout() io.Reader     { return s.sess.Stdout }
func (s *daemonProc) Stderr() io.Reader     { return s.sess.Stderr }
func (s *daemonProc) Done() <-chan struct{} { return s.done }

// lost records that the lease could no longer be kept alive and kills the
// command: nothing outlives its lease.
func (s *daemonProc) lost(err error) {
	s.mu.Lock()
	if s.lostErr != nil {
		s.mu.Unlock()
		return
	}
	s.lostErr = fmt.Errorf("%w: lease heartbeat failed: %w", sandbox.ErrTransport, err)
	s.mu.Unlock()
	close(s.lostC)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.cancel(ctx)
	}()
}

func (s *daemonProc) Wait() (sandbox.Exit, error) {
	<-s.done
	s.mu.Lock()
	lost := s.lostErr
	s.mu.Unlock()
	if lost != nil {
		return sandbox.Exit{}, lost
	}
	return s.sess.Wait()
}

func (s *daemonProc) Signal(sig syscall.Signal) error {
	if s.sess.Signal == nil {
		return fmt.Errorf("signal %s: this project's sandbox cannot signal a process tree (only KILL): %w", unixSignalName(sig), errors.ErrUnsupported)
	}
	select {
	case <-s.sess.Done():
		return nil // the main process ended: its tree was killed with it
	default:
	}
	return s.sess.Signal(sig)
}

func (s *daemonProc) Close(ctx context.Context) error {
	s.closeOnce.Do(func() {
		var errs []error
		select {
		case <-s.sess.Done():
		default:
			if err := s.cancel(ctx); err != nil {
				errs = append(errs, fmt.Errorf("cancel: %w", err))
			}
			select {
			case <-s.sess.Done():
			case <-ctx.Done():
				errs = append(errs, fmt.Errorf("the command did not end after cancel: %w", ctx.Err()))
			}
		}
		s.stopBeat()
		if err := s.lease.Release(ctx); err != nil {
			errs = append(errs, fmt.Errorf("release lease: %w", err))
		}
		_ = s.sess.Stdout.Close()
		_ = s.sess.Stderr.Close()
		_ = s.sess.Stdin.Close()
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}
