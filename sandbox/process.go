package sandbox

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
	"time"

	"github.com/corral-sandbox/corral/internal/pdeath"

	"github.com/corral-sandbox/corral/confine"
	"github.com/creack/pty"
	"golang.org/x/sys/unix"
)

// process is a started command, local or managed, as a Session drives it.
type process interface {
	outputs() (stdout, stderr io.Reader)
	// input is the command's standard input when it has one (a
	// Session's, or RunCommand's feed: see feedInput), nil when the
	// command reads an empty input.
	input() io.WriteCloser
	// done is closed when the main process has ended (or the session settled).
	done() <-chan struct{}
	// exit reports how it ended; valid after done is closed.
	exit() (Exit, error)
	// ended runs once the main process ended normally: a one-shot command
	// leaves nothing running.
	ended()
	// cancel kills the whole process tree and calls the provider's cancel.
	cancel(ctx context.Context) error
	// closeOutputs unblocks any reader still draining.
	closeOutputs()
	// resize resizes a terminal session's terminal.
	resize(rows, cols uint16) error
	// signal sends sig to the command's tree (errors.ErrUnsupported when
	// the provider cannot).
	signal(sig syscall.Signal) error
}

// localProcess is a host command in its own process group, and, when it
// was confined as a User, in its own pid namespace (tree).
type localProcess struct {
	cmd      *exec.Cmd
	tree     *confine.Tree
	stdin    *os.File // nil: the command's input is /dev/null
	stdout   *os.File
	stderr   *os.File // nil on a terminal
	tty      *os.File // a terminal session's master (stdin and stdout), else nil
	doneCh   chan struct{}
	exitVal  Exit
	exitErr  error
	provider func(context.Context) error
}

// localStart says how startLocal starts a host command.
type localStart struct {
	// withInput: the command's input is a pipe whose write end the
	// process keeps (a prepared or a caller's input); otherwise it is
	// /dev/null.
	withInput bool
	// bounded: a one-shot command, whose confined pid namespace gets the
	// minimal init (see confine.Policy.Init); a session's gets the
	// provider's reaping init.
	bounded bool
	// tty, if non-nil: the command runs on a new host pseudo-terminal of
	// this size, its controlling terminal and descriptors 0, 1 and 2, in a
	// session of its own (whose id is its process group's).
	tty *TTYSize
}

// startLocal starts p.Launch in a new process group with a minimal, explicit
// environment. The child is killed if this process dies (Pdeathsig). A
// confined launch is started by confine.Start (no helper process) with the
// launch's confinement, exactly as for every host command.
func startLocal(p *LocalPrepared, how localStart) (proc *localProcess, err error) {
	l := p.Launch
	var closers []*os.File
	defer func() {
		if err != nil {
			for _, f := range closers {
				f.Close()
			}
		}
	}()
	cmd := &exec.Cmd{
		Path: l.Path,
		Args: l.Args,
		Env:  l.Env,
		Dir:  l.Dir,
		SysProcAttr: &syscall.SysProcAttr{
			Setpgid:   true,
			Pdeathsig: syscall.SIGKILL,
		},
	}
	if cmd.Env == nil {
		cmd.Env = []string{}
	}
	// owned are the descriptors the child's user must own (see below).
	var outR, errR, inW, master *os.File
	var owned []*os.File
	if how.tty != nil {
		var slave *os.File
		master, slave, err = pty.Open()
		if err != nil {
			return nil, fmt.Errorf("%w: open a pseudo-terminal: %w", ErrNotStarted, err)
		}
		closers = append(closers, master, slave)
		if err := pty.Setsize(master, &pty.Winsize{Rows: how.tty.Rows, Cols: how.tty.Cols}); err != nil {
			return nil, fmt.Errorf("%w: size the pseudo-terminal: %w", ErrNotStarted, err)
		}
		cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
		// Setsid makes the command its session's and process group's
		// leader (the group killGroup kills); Ctty is its descriptor 0.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0, Pdeathsig: syscall.SIGKILL}
		owned = []*os.File{slave}
	} else {
		var outW, errW *os.File
		outR, outW, err = streamPipe(0)
		if err != nil {
			return nil, err
		}
		closers = append(closers, outR, outW)
		errR, errW, err = streamPipe(0)
		if err != nil {
			return nil, err
		}
		closers = append(closers, errR, errW)
		cmd.Stdout, cmd.Stderr = outW, errW
		// A pipe's two ends share one inode: one of them is chowned.
		owned = []*os.File{outW, errW}
		if how.withInput {
			var inR *os.File
			inR, inW, err = streamPipe(1)
			if err != nil {
				return nil, err
			}
			closers = append(closers, inR, inW)
			cmd.Stdin = inR
			owned = append(owned, inR)
		} else if null := nullInput(); null != nil {
			closers = append(closers, null)
			cmd.Stdin = null
		}
	}
	// Its Pdeathsig must mean "corral died", not "the forking thread
	// exited" (see package pdeath).
	start := func() error { return pdeath.Start(cmd) }
	var tree *confine.Tree
	if c := l.Confine; c != nil && c.User != nil {
		// The command reopens its streams by name (/dev/stdout is
		// /proc/self/fd/1, "> /dev/stderr" in a script, a terminal's
		// /dev/pts/N): a pipe's or a terminal's inode must be its own for
		// that, not root's (mode 0600).
		for _, f := range owned {
			if err := unix.Fchown(int(f.Fd()), int(c.User.UID), int(c.User.GID)); err != nil {
				return nil, fmt.Errorf("%w: chown the command's streams: %w", ErrNotStarted, err)
			}
		}
	}
	if c := l.Confine; c != nil {
		cmd.Path, cmd.Args = c.Path, c.Args
		start = func() (err error) {
			p := c.Policy()
			if how.bounded {
				// A bounded command needs no reaping init: the minimal
				// one starts far faster (see confine.Policy.Init).
				p.Init = ""
			}
			tree, err = confine.Start(cmd, p)
			return err
		}
	}
	var statusR *os.File
	if l.ExecStatus && l.Confine == nil {
		var statusW *os.File
		statusR, statusW, err = os.Pipe()
		if err != nil {
			return nil, err
		}
		closers = append(closers, statusR, statusW)
		cmd.ExtraFiles = []*os.File{statusW}
	}
	if err := start(); err != nil {
		// Also when the confinement could not be set up: nothing ran
		// (as when the helper reports it).
		return nil, fmt.Errorf("%w: %w", ErrNotStarted, err)
	}
	// The child holds its own copies now; from here on a failure closes
	// only what this process keeps.
	for _, f := range []io.Closer{cmd.Stdout.(io.Closer), cmd.Stderr.(io.Closer)} {
		f.Close()
	}
	if f, ok := cmd.Stdin.(*os.File); ok {
		f.Close()
	}
	closers = nil
	for _, f := range []*os.File{outR, errR, inW, master} {
		if f != nil {
			closers = append(closers, f)
		}
	}
	if statusR != nil {
		cmd.ExtraFiles[0].Close()
		msg, _ := io.ReadAll(io.LimitReader(statusR, 4096))
		statusR.Close()
		if len(msg) > 0 {
			// The helper could not exec the program; it exits at once.
			_ = unix.Kill(-cmd.Process.Pid, unix.SIGKILL)
			_ = tree.Kill()
			_ = cmd.Wait()
			return nil, fmt.Errorf("%w: %s", ErrNotStarted, bytes.TrimSpace(msg))
		}
	}
	proc = &localProcess{cmd: cmd, tree: tree, stdin: inW, stdout: outR, stderr: errR, tty: master, doneCh: make(chan struct{}), provider: p.Cancel}
	go proc.wait()
	return proc, nil
}

// nullInput opens /dev/null for reading, the input of a host command that
// reads none, or returns nil (os/exec then opens it). It is opened for
// each command, without the runtime's poller (os/exec's open registers
// it, then unregisters it to pass it on): one /dev/null shared by every
// command would share its open file description, whose status flags
// (O_NONBLOCK, O_APPEND) any command may set with fcntl, and every
// other host command, of any project, would see them: a channel between
// confined commands.
func nullInput() *os.File {
	fd, err := unix.Open(os.DevNull, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	return os.NewFile(uintptr(fd), os.DevNull)
}

// streamPipe returns a pipe for one of a command's streams: end ours (0,
// the read end, or 1) is this process's, nonblocking and read or written
// through the runtime's poller; the other is the command's, blocking and
// never registered with the poller (os.Pipe registers both ends, and the
// start then makes the command's blocking again: five system calls more per
// pipe). Both are close-on-exec.
func streamPipe(ours int) (r, w *os.File, err error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return nil, nil, os.NewSyscallError("pipe2", err)
	}
	if err := unix.SetNonblock(p[ours], true); err != nil {
		unix.Close(p[0])
		unix.Close(p[1])
		return nil, nil, os.NewSyscallError("fcntl", err)
	}
	return os.NewFile(uintptr(p[0]), "|0"), os.NewFile(uintptr(p[1]), "|1"), nil
}

func (p *localProcess) wait() {
	err := p.cmd.Wait()
	var ee *exec.ExitError
	switch {
	case err == nil:
		p.exitVal = ExitCode(0)
	case errors.As(err, &ee):
		ws, ok := ee.Sys().(syscall.WaitStatus)
		switch {
		case ok && ws.Signaled():
			p.exitVal = ExitSignal(unix.SignalName(ws.Signal()))
		case ok && ws.Exited():
			p.exitVal = ExitCode(ws.ExitStatus())
		default:
			p.exitErr = fmt.Errorf("%w: unexpected wait status %v", ErrTransport, err)
		}
	default:
		p.exitErr = fmt.Errorf("%w: wait: %w", ErrTransport, err)
	}
	close(p.doneCh)
}

func (p *localProcess) outputs() (io.Reader, io.Reader) {
	if p.tty != nil {
		return ttyReader{p.tty}, nil
	}
	return p.stdout, p.stderr
}

func (p *localProcess) input() io.WriteCloser {
	switch {
	case p.tty != nil:
		return ttyWriter{p.tty}
	case p.stdin == nil:
		return nil
	}
	return p.stdin
}

func (p *localProcess) resize(rows, cols uint16) error {
	if p.tty == nil {
		return errors.New("sandbox: the session has no terminal")
	}
	return pty.Setsize(p.tty, &pty.Winsize{Rows: rows, Cols: cols})
}

// signal sends sig to the command's process group (a group already gone
// is not an error). A descendant that left the group (possible only
// without a pid namespace: a direct command, or a confined one when corral
// is not root) does not get it.
func (p *localProcess) signal(sig syscall.Signal) error {
	if err := unix.Kill(-p.cmd.Process.Pid, sig); err != nil && err != unix.ESRCH {
		return fmt.Errorf("signal process group: %w", err)
	}
	return nil
}

// ttyWriter is a host terminal session's input; Close does nothing (the
// terminal's EOF is its ^D; closeOutputs closes the master).
type ttyWriter struct{ f *os.File }

func (w ttyWriter) Write(b []byte) (int, error) { return w.f.Write(b) }
func (ttyWriter) Close() error                  { return nil }

// ttyReader reads a terminal's master, whose EIO (no process holds the
// slave any more) is the terminal's end of file.
type ttyReader struct{ f *os.File }

func (r ttyReader) Read(b []byte) (int, error) {
	n, err := r.f.Read(b)
	if err != nil && errors.Is(err, unix.EIO) {
		err = io.EOF
	}
	return n, err
}
func (p *localProcess) done() <-chan struct{} { return p.doneCh }
func (p *localProcess) exit() (Exit, error)   { return p.exitVal, p.exitErr }

// killGroup kills the command's process group and, if it has one, its pid
// namespace: everything it started, whatever group or session they moved
// to. Without a tree, a descendant that left the group survives.
func (p *localProcess) killGroup() error {
	err := unix.Kill(-p.cmd.Process.Pid, unix.SIGKILL)
	if err == unix.ESRCH {
		err = nil
	}
	return errors.Join(err, p.tree.Kill())
}

// treeWait bounds how long ended waits for a killed pid namespace to be
// gone (the kernel kills it at once; this only guards against a stuck
// process, such as one in uninterruptible sleep).
const treeWait = 2 * time.Second

// ended kills what is left of the command and, if it has a pid namespace,
// waits until the namespace is gone: when the session settles, nothing the
// command started is running any more.
func (p *localProcess) ended() {
	_ = p.killGroup()
	if p.tree != nil {
		t := time.NewTimer(treeWait)
		defer t.Stop()
		select {
		case <-p.tree.Done():
		case <-t.C:
		}
	}
}

func (p *localProcess) cancel(ctx context.Context) error {
	var errs []error
	if err := p.killGroup(); err != nil {
		errs = append(errs, fmt.Errorf("kill process group: %w", err))
	}
	if p.tree != nil {
		select {
		case <-p.tree.Done():
		case <-ctx.Done():
			errs = append(errs, fmt.Errorf("the command's pid namespace did not end: %w", ctx.Err()))
		}
	}
	if p.provider != nil {
		if err := p.provider(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (p *localProcess) closeOutputs() {
	if p.tty != nil {
		p.tty.Close()
		return
	}
	p.stdout.Close()
	p.stderr.Close()
}

// managedProcess adapts a ManagedExecutionSession.
type managedProcess struct {
	s        *ManagedExecutionSession
	stdin    io.WriteCloser // the session's input, when it has one
	provider func(context.Context) error
}

func startManaged(ctx context.Context, p *ManagedPrepared, withInput bool) (*managedProcess, error) {
	s, err := p.Start(ctx)
	if err != nil {
		return nil, err
	}
	if s == nil || s.done == nil || s.Stdout == nil || s.Stderr == nil {
		return nil, fmt.Errorf("provider returned an incomplete session")
	}
	mp := &managedProcess{s: s, provider: p.Cancel}
	switch {
	case s.Stdin == nil:
	case !withInput:
		s.Stdin.Close() // EOF at once: no writer needed
	default:
		mp.stdin = s.Stdin
	}
	return mp, nil
}

func (p *managedProcess) outputs() (io.Reader, io.Reader) { return p.s.Stdout, p.s.Stderr }
func (p *managedProcess) input() io.WriteCloser           { return p.stdin }
func (p *managedProcess) done() <-chan struct{}           { return p.s.done }
func (p *managedProcess) exit() (Exit, error)             { return p.s.Wait() }
func (p *managedProcess) ended()                          {}
func (p *managedProcess) cancel(ctx context.Context) error {
	return p.provider(ctx)
}
func (p *managedProcess) resize(rows, cols uint16) error {
	if p.s.Resize == nil {
		return errors.New("sandbox: the session has no terminal")
	}
	return p.s.Resize(rows, cols)
}

func (p *managedProcess) signal(sig syscall.Signal) error {
	if p.s.Signal == nil {
		return fmt.Errorf("sandbox: the provider cannot signal the session's tree: %w", errors.ErrUnsupported)
	}
	return p.s.Signal(sig)
}

func (p *managedProcess) closeOutputs() {
	p.s.Stdout.Close()
	p.s.Stderr.Close()
}

// inputChunk bounds one copy of RunOptions.Stdin into the command's input.
const inputChunk = 32 << 10

// feeder copies a command's input: the prepared bytes, then the caller's
// reader, then EOF.
type feeder struct {
	w      io.WriteCloser
	once   sync.Once
	failed chan error // receives a read error of the caller's reader
}

// feedInput starts copying prepared and then src (either may be empty)
// into w on a goroutine of its own, and closes w when both are done.
func feedInput(w io.WriteCloser, prepared []byte, src io.Reader) *feeder {
	f := &feeder{w: w, failed: make(chan error, 1)}
	go f.copy(prepared, src)
	return f
}

func (f *feeder) copy(prepared []byte, src io.Reader) {
	defer f.stop()
	if len(prepared) > 0 {
		if _, err := f.w.Write(prepared); err != nil {
			return // the command closed its input or ended
		}
	}
	if src == nil {
		return
	}
	buf := make([]byte, inputChunk)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := f.w.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err == io.EOF {
			return
		}
		if err != nil {
			f.failed <- err
			return
		}
	}
}

// stop closes the command's input, which ends a Write in progress; it is
// idempotent.
func (f *feeder) stop() { f.once.Do(func() { _ = f.w.Close() }) }
