package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/corral-sandbox/corral/internal/pdeath"
	"github.com/corral-sandbox/corral/internal/tailbuf"
	"github.com/corral-sandbox/corral/machine"
)

// WaitDelay bounds how long a Process's Wait waits, once the runner was
// asked to stop (its context ended) or exited, before it kills the runner
// and stops reading its output.
const WaitDelay = 15 * time.Second

// stderrTail is how much of the runner's stderr a Process keeps for errors.
const stderrTail = 64 << 10

// StartOptions configure Start.
type StartOptions struct {
	// Self is the corral executable to start as `Self runner ...`. Empty
	// means os.Executable().
	Self string
	// StateDir is passed as --state: the runner opens StateDir/corral.db,
	// which must already be migrated to this binary's schema version.
	StateDir string
	// Store, if set, is passed as --store: the store URL the runner opens
	// instead (store.Open's forms). It is on the runner's command line,
	// which every user of the host may read: it must hold no password
	// (the runner inherits PGPASSWORD or finds the passfile).
	Store string
	// WorkerSocket, if set, is dialled for the runner: the runner inherits
	// that connection and nothing else. Set at most one of WorkerSocket and
	// Conn; with neither, the runner has no worker and only host commands
	// succeed.
	WorkerSocket string
	// Conn, if set, is a connection to the worker, before the handshake,
	// handed to the runner. Start takes ownership: it closes its copy in
	// every case, so the runner holds the only one.
	Conn *net.UnixConn
	// Job is written to the runner's stdin.
	Job Job
	// LeaseTTL, if nonzero, is passed as --lease-ttl.
	LeaseTTL time.Duration
	// Env is the runner's environment; nil means os.Environ().
	Env []string
	// Stderr receives the runner's stderr (diagnostics). If nil, the
	// Process keeps its last 64 KiB for ExitError.
	Stderr io.Writer
}

// Process is a started runner. Call Wait (after Next, or alone) to reap
// it. Its methods are not safe for concurrent use, except Pid and Abandon.
type Process struct {
	cmd      *exec.Cmd
	stdin    io.WriteCloser
	dec      *json.Decoder
	tail     *tailbuf.Buffer
	commands int
	reported int
	writeErr error

	closeStdin sync.Once
	waited     bool
	waitErr    error
}

// Start starts `corral runner` for opts.Job: it dials the worker (or takes
// opts.Conn) and passes that connection as the runner's descriptor 3
// (--worker-fd 3),
// starts the runner with SIGTERM as its parent-death signal, and writes the
// job to its stdin, which it keeps open: closing it (Abandon, or this
// process exiting) makes the runner cancel its running command and exit.
//
// When ctx ends, the runner is sent SIGTERM (it abandons the job) and
// killed if it has not exited WaitDelay later.
//
// Linux delivers the parent-death signal when the OS thread that started
// the runner exits, not the process; the Go runtime does not end threads
// except those a goroutine locked and did not unlock. Stdin's EOF, which
// the runner also watches, covers that case.
//
// An error from Start means no runner is running and opts.Conn is closed.
func Start(ctx context.Context, opts StartOptions) (*Process, error) {
	conn := opts.Conn
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	if opts.WorkerSocket != "" && opts.Conn != nil {
		return nil, errors.New("runner: set at most one of WorkerSocket and Conn")
	}
	if opts.StateDir == "" {
		return nil, errors.New("runner: no state directory")
	}
	job, err := json.Marshal(opts.Job)
	if err != nil {
		return nil, fmt.Errorf("runner: encode job: %w", err)
	}
	self := opts.Self
	if self == "" {
		if self, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("runner: %w", err)
		}
	}
	if opts.WorkerSocket != "" {
		if conn, err = machine.Dial(ctx, opts.WorkerSocket); err != nil {
			return nil, fmt.Errorf("runner: dial worker: %w", err)
		}
	}

	args := []string{"runner", "--state", opts.StateDir}
	if opts.Store != "" {
		args = append(args, "--store", opts.Store)
	}
	if opts.LeaseTTL != 0 {
		args = append(args, "--lease-ttl", opts.LeaseTTL.String())
	}
	cmd := exec.CommandContext(ctx, self, args...)
	cmd.Env = opts.Env
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM} // started by pdeath.Start
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = WaitDelay
	if conn != nil {
		f, err := conn.File()
		if err != nil {
			return nil, fmt.Errorf("runner: worker connection: %w", err)
		}
		defer f.Close()
		cmd.ExtraFiles = []*os.File{f}
		cmd.Args = append(cmd.Args, "--worker-fd", strconv.Itoa(InheritedFD))
	}
	p := &Process{cmd: cmd, commands: len(opts.Job.Commands)}
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, fmt.Errorf("runner: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("runner: %w", err)
	}
	p.dec = json.NewDecoder(stdout)
	if opts.Stderr != nil {
		cmd.Stderr = opts.Stderr
	} else {
		p.tail = &tailbuf.Buffer{Max: stderrTail}
		cmd.Stderr = p.tail
	}
	if err := pdeath.Start(cmd); err != nil { // Pdeathsig: this process, not this thread
		return nil, fmt.Errorf("runner: start: %w", err)
	}
	// A runner that exits before reading the job (a bad flag) makes this
	// write fail; Wait then reports its exit.
	if _, err := p.stdin.Write(append(job, '\n')); err != nil {
		p.writeErr = err
	}
	return p, nil
}

// Pid returns the runner's process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Next returns the next command's result, in job order. After the job's
// last result it returns io.EOF. If the runner stops reporting early it
// waits for the runner and returns the *ExitError (or the context's error)
// that Wait returns.
func (p *Process) Next() (Result, error) {
	if p.reported >= p.commands {
		return Result{}, io.EOF
	}
	if !p.waited {
		var r Result
		err := p.dec.Decode(&r)
		if err == nil {
			p.reported++
			return r, nil
		}
		if !errors.Is(err, io.EOF) {
			// Unreadable output: stop the runner rather than guess.
			_ = p.cmd.Process.Kill()
			p.wait()
			return Result{}, fmt.Errorf("runner: result %d: %w", p.reported+1, err)
		}
	}
	if err := p.wait(); err != nil {
		return Result{}, err
	}
	return Result{}, p.exitError(nil)
}

// Wait reads the results not yet returned by Next, closes the runner's
// stdin and waits for it to exit. It returns those results and a nil error
// only if the runner reported every command and exited 0; otherwise the
// error is an *ExitError (or wraps the Start context's error) and the
// results are those that were reported. Wait is idempotent.
func (p *Process) Wait() ([]Result, error) {
	var out []Result
	for {
		r, err := p.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return out, err
		}
		out = append(out, r)
	}
	return out, p.wait()
}

// Abandon closes the runner's stdin, which tells it its parent is gone: it
// cancels the running command, reports nothing more and exits with
// ExitAbandoned. Call Wait afterwards to reap it. Abandon is idempotent and
// safe to call concurrently with Next and Wait.
func (p *Process) Abandon() {
	p.closeStdin.Do(func() { p.stdin.Close() })
}

// wait closes stdin and reaps the runner once.
func (p *Process) wait() error {
	if !p.waited {
		p.waited = true
		p.Abandon()
		err := p.cmd.Wait()
		if err != nil || p.reported < p.commands {
			p.waitErr = p.exitError(err)
		}
	}
	return p.waitErr
}

func (p *Process) exitError(waitErr error) error {
	if p.waitErr != nil {
		return p.waitErr
	}
	e := &ExitError{State: p.cmd.ProcessState, Reported: p.reported, Commands: p.commands, Err: waitErr}
	if p.tail != nil {
		e.Stderr = p.tail.String()
	}
	return e
}

// ExitError reports a runner that exited unsuccessfully or before it
// reported every command of its job.
type ExitError struct {
	// State is the runner's exit state (nil if it could not be reaped).
	State *os.ProcessState
	// Stderr is the tail of its stderr, when Start captured it.
	Stderr string
	// Reported of Commands results were read.
	Reported, Commands int
	// Err is what exec.Cmd.Wait returned, if anything.
	Err error
}

func (e *ExitError) Error() string {
	state := "not reaped"
	if e.State != nil {
		state = e.State.String()
	}
	msg := fmt.Sprintf("runner: %s after %d of %d results", state, e.Reported, e.Commands)
	if s := strings.TrimSpace(e.Stderr); s != "" {
		msg += ": " + s
	}
	return msg
}

// Unwrap returns Err.
func (e *ExitError) Unwrap() error { return e.Err }

// ExitCode returns the runner's exit status, or -1 if it was killed by a
// signal or not reaped.
func (e *ExitError) ExitCode() int {
	if e.State == nil {
		return -1
	}
	return e.State.ExitCode()
}
