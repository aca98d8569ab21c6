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

	"github.com/corral-sandbox/corral/internal/pdeath"

	"golang.org/x/sys/unix"

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
func startLocalSession(p *sandbox.LocalPrepared) (sess *sandbox.ManagedExecutionSession, cancel func(context.Context) error, err error) {
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
