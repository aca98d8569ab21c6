// Package workerproc starts a privileged worker (`corral worker`, or a
// program that serves protocol 2 like it) as a child process and waits
// until it answers on its socket. It is the one launcher of the CLI's
// private worker, the daemon's supervisor, the test workers and the bench.
//
// A started worker is ready when a protocol-2 handshake
// (machine.Handshake) succeeds on its socket, not merely when the socket
// accepts connections. A worker that exits before that fails Start with
// the end of its stderr in the error.
//
// Children with a parent-death signal are forked through internal/pdeath,
// so that the signal means "this process died", not "the thread that
// forked it exited".
package workerproc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/corral-sandbox/corral/internal/pdeath"
	"github.com/corral-sandbox/corral/internal/tailbuf"
	"github.com/corral-sandbox/corral/machine"
)

// Defaults of Options and Stop.
const (
	DefaultReadyTimeout = 10 * time.Second
	DefaultStopTimeout  = 30 * time.Second
	// startStopTimeout is how long a worker that was not ready in time
	// has to end on SIGTERM before Start kills it.
	startStopTimeout = 5 * time.Second
	// stderrTail is how much of a worker's stderr Start keeps to explain
	// a failed start.
	stderrTail = 4096
)

// Options configure Start.
type Options struct {
	// Exe is the worker's program; Args its arguments (without argv[0]),
	// which must make it listen on Socket.
	Exe  string
	Args []string
	// Socket is the path of the worker's protocol-2 socket. Start waits
	// until a handshake succeeds there. It must not be empty.
	Socket string
	// Env is the worker's environment; nil means this process's.
	Env []string
	// Dir is the worker's working directory; empty means this process's.
	Dir string
	// Stdout and Stderr receive the worker's output; nil discards it.
	// Start keeps the last 4 KiB of stderr to explain a failed start,
	// except when Stderr is an *os.File: the worker then writes to the
	// file itself (its logs outlive this process) and a start error
	// carries no tail.
	Stdout io.Writer
	Stderr io.Writer
	// Pdeathsig, if non-zero, is sent to the worker when this process
	// dies.
	Pdeathsig syscall.Signal
	// Setsid starts the worker in a session (and process group) of its
	// own, so that signals a terminal sends to this process's group
	// (Ctrl-C) do not reach it: for a worker meant to outlive this
	// process.
	Setsid bool
	// ReadyTimeout bounds the wait for the handshake; zero means
	// DefaultReadyTimeout.
	ReadyTimeout time.Duration
}

// Process is a started worker. Its methods are safe for concurrent use.
type Process struct {
	// Pid is the worker's process id and Socket its socket path.
	Pid    int
	Socket string

	cmd  *exec.Cmd
	done chan struct{}
	err  error // cmd.Wait's, set before done is closed
}

// Start starts the worker and blocks until it answers a protocol-2
// handshake on opts.Socket. If the worker exits first, the error says so
// and ends with the tail of its stderr; if ctx ends or ReadyTimeout passes
// first, Start stops the worker (SIGTERM, and SIGKILL after 5 s), reaps it
// and returns an error. On error no process is left running.
func Start(ctx context.Context, opts Options) (*Process, error) {
	if opts.Socket == "" {
		return nil, errors.New("workerproc: no socket")
	}
	timeout := opts.ReadyTimeout
	if timeout <= 0 {
		timeout = DefaultReadyTimeout
	}
	cmd := exec.Command(opts.Exe, opts.Args...)
	cmd.Env = opts.Env
	cmd.Dir = opts.Dir
	cmd.Stdout = opts.Stdout
	var tail *tailBuffer
	if f, ok := opts.Stderr.(*os.File); ok {
		cmd.Stderr = f
	} else {
		tail = &tailBuffer{tailbuf.Buffer{Max: stderrTail}}
		cmd.Stderr = tail
		if opts.Stderr != nil {
			cmd.Stderr = io.MultiWriter(tail, opts.Stderr)
		}
	}
	if sameWriter(opts.Stdout, opts.Stderr) {
		cmd.Stdout = cmd.Stderr // one pipe, as exec does for one writer: no concurrent writes
	}
	// A grandchild that kept the stderr pipe open must not hold up the
	// reaping of the worker.
	cmd.WaitDelay = 5 * time.Second
	if opts.Pdeathsig != 0 || opts.Setsid {
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: opts.Pdeathsig, Setsid: opts.Setsid}
	}
	if err := pdeath.Start(cmd); err != nil { // Pdeathsig: this process, not this thread
		return nil, fmt.Errorf("workerproc: start %s: %w", opts.Exe, err)
	}
	p := &Process{Pid: cmd.Process.Pid, Socket: opts.Socket, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()

	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		err := machine.Handshake(rctx, opts.Socket)
		if err == nil {
			return p, nil
		}
		select {
		case <-p.done:
			return nil, fmt.Errorf("workerproc: worker %d exited at start: %v%s", p.Pid, p.err, tail.suffix())
		default:
		}
		wait := time.NewTimer(5 * time.Millisecond)
		select {
		case <-wait.C:
			continue
		case <-p.done:
			return nil, fmt.Errorf("workerproc: worker %d exited at start: %v%s", p.Pid, p.err, tail.suffix())
		case <-rctx.Done():
		}
		wait.Stop()
		sctx, scancel := context.WithTimeout(context.Background(), startStopTimeout)
		_ = p.Stop(sctx)
		scancel()
		cause := rctx.Err()
		if ctx.Err() != nil {
			cause = ctx.Err()
		}
		return nil, fmt.Errorf("workerproc: worker %d not ready (%w): %v%s", p.Pid, cause, err, tail.suffix())
	}
}

// Done returns a channel closed once the worker has exited and been
// reaped.
func (p *Process) Done() <-chan struct{} { return p.done }

// Wait blocks until the worker has exited and returns how: nil for a
// zero exit status, an *exec.ExitError otherwise (also when a signal
// killed it). It may be called any number of times.
func (p *Process) Wait() error {
	<-p.done
	return p.err
}

// Signal sends sig to the worker; after its exit it does nothing and
// returns os.ErrProcessDone.
func (p *Process) Signal(sig os.Signal) error {
	select {
	case <-p.done:
		return os.ErrProcessDone
	default:
	}
	return p.cmd.Process.Signal(sig)
}

// Stop sends the worker SIGTERM (a worker stops its machines on it) and
// waits for it to exit; if ctx ends first (or, for a ctx without a
// deadline, after DefaultStopTimeout) it sends SIGKILL and returns an
// error. It blocks until the worker is reaped, and is idempotent: once
// the worker is gone it returns nil at once.
func (p *Process) Stop(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultStopTimeout)
		defer cancel()
	}
	_ = p.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
	}
	p.Kill()
	return fmt.Errorf("workerproc: worker %d did not stop in time; killed: %w", p.Pid, ctx.Err())
}

// Kill sends the worker SIGKILL and blocks until it is reaped. It is
// idempotent.
func (p *Process) Kill() {
	_ = p.Signal(syscall.SIGKILL)
	<-p.done
}

// sameWriter reports whether a and b are the same non-nil writer (false
// for writers whose type cannot be compared).
func sameWriter(a, b io.Writer) (same bool) {
	defer func() { _ = recover() }()
	return a != nil && a == b
}

// tailBuffer is the kept end of a worker's stderr.
type tailBuffer struct{ tailbuf.Buffer }

// suffix is ": " and the kept text, or "" (also for a nil t).
func (t *tailBuffer) suffix() string {
	if t == nil {
		return ""
	}
	s := strings.TrimSpace(t.String())
	if s == "" {
		return ""
	}
	return ": " + s
}
