package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/internal/pdeath"
	"github.com/corral-sandbox/corral/sandbox"
)

// startLocalSession starts a host project's prepared execution as a raw
// session: its own process group, the prepared launch (confined by
// corral's helper unless the member is trusted), and pipes for the three
// streams, exposed through the same ManagedExecutionSession type a managed
// session has. A program the helper cannot execute fails with an error
// wrapping sandbox.ErrNotStarted and leaves nothing running.
//
// When the main process ends, whatever is left of its process group is
// killed, as RunCommand does for host commands. cancel kills the group and
// calls the provider's Cancel; it may be called more than once.
//
// With tty, the command runs on a pseudo-terminal of the host (its
// controlling terminal, in a session of its own, whose id is its process
// group's): the session's Stdin and Stdout are the master, its Stderr is
// empty, and Resize resizes it.
func startLocalSession(p *sandbox.LocalPrepared, tty *sandbox.TTYSize) (sess *sandbox.ManagedExecutionSession, cancel func(context.Context) error, err error) {
	if tty != nil {
		return startLocalTTY(p, tty)
	}
	var files []*os.File
	closeAll := func() {
		for _, f := range files {
			f.Close()
		}
	}
	pipe := func() (*os.File, *os.File, error) {
		r, w, err := os.Pipe()
		if err == nil {
			files = append(files, r, w)
		}
		return r, w, err
	}
	inR, inW, err := pipe()
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	outR, outW, err := pipe()
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	errR, errW, err := pipe()
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	l := p.Launch
	cmd := &exec.Cmd{
		Path: l.Path, Args: l.Args, Env: l.Env, Dir: l.Dir,
		Stdin: inR, Stdout: outW, Stderr: errW,
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL},
	}
	if cmd.Env == nil {
		cmd.Env = []string{}
	}
	var statusR *os.File
	if l.ExecStatus {
		var statusW *os.File
		if statusR, statusW, err = pipe(); err != nil {
			closeAll()
			return nil, nil, err
		}
		cmd.ExtraFiles = []*os.File{statusW}
	}
	if err := pdeath.Start(cmd); err != nil { // Pdeathsig: this process, not this thread
		closeAll()
		return nil, nil, fmt.Errorf("%w: %w", sandbox.ErrNotStarted, err)
	}
	// The child holds its ends now.
	inR.Close()
	outW.Close()
	errW.Close()
	killGroup := func() error {
		if err := unix.Kill(-cmd.Process.Pid, unix.SIGKILL); err != nil && err != unix.ESRCH {
			return fmt.Errorf("kill process group: %w", err)
		}
		return nil
	}
	if statusR != nil {
		cmd.ExtraFiles[0].Close()
		msg, _ := io.ReadAll(io.LimitReader(statusR, 4096))
		statusR.Close()
		if len(msg) > 0 {
			_ = killGroup()
			_ = cmd.Wait()
			inW.Close()
			outR.Close()
			errR.Close()
			return nil, nil, fmt.Errorf("%w: %s", sandbox.ErrNotStarted, bytes.TrimSpace(msg))
		}
	}
	sess, settle := sandbox.NewManagedSession(inW, outR, errR)
	sess.Signal = signalGroup(cmd.Process.Pid)
	go func() {
		werr := cmd.Wait()
		// Leave nothing of the session running.
		_ = killGroup()
		var ee *exec.ExitError
		switch {
		case werr == nil:
			settle(sandbox.ExitCode(0), nil)
		case errors.As(werr, &ee):
			ws, _ := ee.Sys().(syscall.WaitStatus)
			if ws.Signaled() {
				settle(sandbox.ExitSignal(unix.SignalName(ws.Signal())), nil)
			} else {
				settle(sandbox.ExitCode(ws.ExitStatus()), nil)
			}
		default:
			settle(sandbox.Exit{}, fmt.Errorf("%w: wait: %w", sandbox.ErrTransport, werr))
		}
	}()
	var once sync.Once
	cancel = func(ctx context.Context) error {
		err := killGroup()
		once.Do(func() {
			if p.Cancel != nil {
				err = errors.Join(err, p.Cancel(ctx))
			}
		})
		return err
	}
	return sess, cancel, nil
}

// startLocalTTY is startLocalSession on a host pseudo-terminal.
func startLocalTTY(p *sandbox.LocalPrepared, tty *sandbox.TTYSize) (*sandbox.ManagedExecutionSession, func(context.Context) error, error) {
	master, slave, err := pty.Open()
	if err != nil {
		return nil, nil, fmt.Errorf("%w: open a pseudo-terminal: %w", sandbox.ErrNotStarted, err)
	}
	if err := pty.Setsize(master, &pty.Winsize{Rows: tty.Rows, Cols: tty.Cols}); err != nil {
		master.Close()
		slave.Close()
		return nil, nil, fmt.Errorf("%w: size the pseudo-terminal: %w", sandbox.ErrNotStarted, err)
	}
	l := p.Launch
	cmd := &exec.Cmd{
		Path: l.Path, Args: l.Args, Env: l.Env, Dir: l.Dir,
		Stdin: slave, Stdout: slave, Stderr: slave,
		// Setsid makes the command its session's and process group's
		// leader (the group killGroup kills); Ctty is its descriptor 0.
		SysProcAttr: &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0, Pdeathsig: syscall.SIGKILL},
	}
	if cmd.Env == nil {
		cmd.Env = []string{}
	}
	var statusR, statusW *os.File
	if l.ExecStatus {
		if statusR, statusW, err = os.Pipe(); err != nil {
			master.Close()
			slave.Close()
			return nil, nil, err
		}
		cmd.ExtraFiles = []*os.File{statusW}
	}
	err = pdeath.Start(cmd) // Pdeathsig: this process, not this thread
	slave.Close()
	if statusW != nil {
		statusW.Close()
	}
	if err != nil {
		master.Close()
		if statusR != nil {
			statusR.Close()
		}
		return nil, nil, fmt.Errorf("%w: %w", sandbox.ErrNotStarted, err)
	}
	killGroup := func() error {
		if err := unix.Kill(-cmd.Process.Pid, unix.SIGKILL); err != nil && err != unix.ESRCH {
			return fmt.Errorf("kill process group: %w", err)
		}
		return nil
	}
	if statusR != nil {
		msg, _ := io.ReadAll(io.LimitReader(statusR, 4096))
		statusR.Close()
		if len(msg) > 0 {
			_ = killGroup()
			_ = cmd.Wait()
			master.Close()
			return nil, nil, fmt.Errorf("%w: %s", sandbox.ErrNotStarted, bytes.TrimSpace(msg))
		}
	}
	sess, settle := sandbox.NewManagedSession(hostTTYWriter{master}, hostTTYReader{master}, io.NopCloser(bytes.NewReader(nil)))
	sess.Resize = func(rows, cols uint16) error {
		return pty.Setsize(master, &pty.Winsize{Rows: rows, Cols: cols})
	}
	sess.Signal = signalGroup(cmd.Process.Pid)
	go func() {
		werr := cmd.Wait()
		_ = killGroup()
		var ee *exec.ExitError
		switch {
		case werr == nil:
			settle(sandbox.ExitCode(0), nil)
		case errors.As(werr, &ee):
			ws, _ := ee.Sys().(syscall.WaitStatus)
			if ws.Signaled() {
				settle(sandbox.ExitSignal(unix.SignalName(ws.Signal())), nil)
			} else {
				settle(sandbox.ExitCode(ws.ExitStatus()), nil)
			}
		default:
			settle(sandbox.Exit{}, fmt.Errorf("%w: wait: %w", sandbox.ErrTransport, werr))
		}
	}()
	var once sync.Once
	cancel := func(ctx context.Context) error {
		err := killGroup()
		once.Do(func() {
			if p.Cancel != nil {
				err = errors.Join(err, p.Cancel(ctx))
			}
		})
		return err
	}
	return sess, cancel, nil
}

// signalGroup returns the Signal of a host session whose process group is
// pgid: the whole group gets the signal (a group already gone is not an
// error).
func signalGroup(pgid int) func(syscall.Signal) error {
	return func(sig syscall.Signal) error {
		if err := unix.Kill(-pgid, sig); err != nil && err != unix.ESRCH {
			return fmt.Errorf("signal process group: %w", err)
		}
		return nil
	}
}

// hostTTYWriter is a host terminal session's input; Close does nothing
// (the reader closes the master).
type hostTTYWriter struct{ f *os.File }

func (w hostTTYWriter) Write(p []byte) (int, error) { return w.f.Write(p) }
func (hostTTYWriter) Close() error                  { return nil }

// hostTTYReader reads the master, whose EIO (no process holds the slave
// any more) is the terminal's end of file.
type hostTTYReader struct{ f *os.File }

func (r hostTTYReader) Read(p []byte) (int, error) {
	n, err := r.f.Read(p)
	if err != nil && errors.Is(err, unix.EIO) {
		err = io.EOF
	}
	return n, err
}

func (r hostTTYReader) Close() error { return r.f.Close() }
