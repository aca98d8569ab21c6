// Package guest is the init of a machine: PID 1 of its pid namespace, run
// as a re-execution of the worker's own binary. It builds the machine's
// filesystem, then forks sessions on the worker's behalf and reports their
// exits, over the control channel of package ctl on descriptor 3.
//
// Like runc's init, Main locks its thread, never returns, reports a setup
// failure over the channel and exits nonzero. It exits when the channel
// reaches EOF (the worker stopped the machine or died); as PID 1 its exit
// makes the kernel kill every process of the machine.
package guest

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/worker/internal/ctl"
)

// CtlFD is the descriptor on which the init finds its control channel.
const CtlFD = 3

// Main runs the init. It never returns.
func Main() {
	runtime.LockOSThread()
	// Every descriptor the init holds must be close-on-exec, so that a
	// session inherits nothing but its three stdio descriptors. Go opens
	// everything with O_CLOEXEC; the inherited ones are fixed here.
	markCloexec()
	c := ctl.NewEndpoint(CtlFD)
	m, files, err := c.Recv()
	if err != nil || m.Op != ctl.OpConfig || m.Config == nil {
		fmt.Fprintln(os.Stderr, "corral machine init: no config:", err)
		os.Exit(2)
	}
	if err := setup(m.Config, files); err != nil {
		_ = c.Send(&ctl.Msg{Op: ctl.OpFail, Message: err.Error()})
		os.Exit(1)
	}
	in := &pid1{c: c, cfg: m.Config, byPID: make(map[int]*child), bySID: make(map[uint64]*child)}
	if err := c.Send(&ctl.Msg{Op: ctl.OpReady}); err != nil {
		os.Exit(1)
	}
	in.loop()
	os.Exit(0)
}

func markCloexec() {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range ents {
		var fd int
		if _, err := fmt.Sscan(e.Name(), &fd); err == nil && fd > 2 {
			unix.CloseOnExec(fd)
		}
	}
}

func setup(cfg *ctl.Config, mountFDs []*os.File) error {
	if err := setupRoot(cfg, mountFDs); err != nil {
		return err
	}
	if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
		return fmt.Errorf("sethostname: %w", err)
	}
	if err := loopbackUp(); err != nil {
		return err
	}
	if cfg.NProc > 0 {
		// Inherited by sessions; counted per (machine user namespace, uid),
		// so it bounds all of the session user's tasks together and keeps a
		// fork bomb below the cgroup's pids limit, leaving room for the
		// init's own threads.
		lim := &unix.Rlimit{Cur: uint64(cfg.NProc), Max: uint64(cfg.NProc)}
		if err := unix.Setrlimit(unix.RLIMIT_NPROC, lim); err != nil {
			return fmt.Errorf("setrlimit nproc: %w", err)
		}
	}
	signal.Ignore(syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGPIPE)
	// Last: the filter binds this thread, from which every session forks.
	return installSetIDFilter()
}

// pid1 is the init's state. Everything runs on the init's one locked
// thread, in loop: a single goroutine blocked in a single system call
// (ppoll) keeps Go's scheduler out of the exec path, and the order of the
// reports (started before exit) follows from program order.
type pid1 struct {
	c     *ctl.Endpoint
	cfg   *ctl.Config
	byPID map[int]*child // running sessions by pid (in the machine)
	bySID map[uint64]*child
	poll  []unix.PollFd
}

type child struct {
	sid   uint64
	pid   int
	pidfd int
}

// loop serves the worker's requests and reports exits until the control
// channel closes.
func (in *pid1) loop() {
	for {
		in.poll = append(in.poll[:0], unix.PollFd{Fd: int32(in.c.FD()), Events: unix.POLLIN})
		for _, ch := range in.byPID {
			in.poll = append(in.poll, unix.PollFd{Fd: int32(ch.pidfd), Events: unix.POLLIN})
		}
		if _, err := unix.Ppoll(in.poll, nil, nil); err != nil && err != unix.EINTR {
			_ = in.c.Send(&ctl.Msg{Op: ctl.OpFail, Message: "ppoll: " + err.Error()})
			return
		}
		if in.poll[0].Revents != 0 && !in.serve() {
			return
		}
		in.reap()
	}
}

// serve handles the requests waiting on the control channel. It reports
// false when the channel is closed.
func (in *pid1) serve() bool {
	for {
		m, files, err := in.c.TryRecv()
		switch {
		case err == ctl.ErrWouldBlock:
			return true
		case errors.Is(err, ctl.ErrFDMismatch):
			continue
		case err != nil:
			return false
		}
		switch m.Op {
		case ctl.OpStart:
			in.start(m, files)
		case ctl.OpKill:
			if ch, ok := in.bySID[m.SID]; ok {
				// The session's main process is PID 1 of its own pid
				// namespace: killing it makes the kernel kill every
				// process of the session, wherever it forked to. The
				// pidfd makes this immune to pid reuse.
				_ = unix.PidfdSendSignal(ch.pidfd, unix.SIGKILL, nil, 0)
			}
		default:
			closeFiles(files)
		}
	}
}

func closeFiles(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
}

func (in *pid1) start(m *ctl.Msg, stdio []*os.File) {
	defer closeFiles(stdio)
	notStarted := func(msg string) {
		_ = in.c.Send(&ctl.Msg{Op: ctl.OpNotStarted, SID: m.SID, Message: msg})
	}
	path, err := lookPath(m.Argv[0], envPath(m.Env))
	if err != nil {
		notStarted(err.Error())
		return
	}
	// Programs expect blocking stdio; a client's socket or pipe end may
	// arrive in non-blocking mode (Go makes them so). The flag lives on the
	// open file description, which the client no longer uses.
	for _, f := range stdio {
		_ = unix.SetNonblock(int(f.Fd()), false)
	}
	pidfd := -1
	attr := &syscall.ProcAttr{
		Dir:   m.Cwd,
		Env:   m.Env,
		Files: []uintptr{stdio[0].Fd(), stdio[1].Fd(), stdio[2].Fd()},
		Sys: &syscall.SysProcAttr{
			Setsid: true,
			// A pid namespace per session: its main process is PID 1 there,
			// so its death (exit or kill) takes down every descendant and
			// no double fork escapes a cancel.
			Cloneflags: syscall.CLONE_NEWPID,
			Credential: &syscall.Credential{Uid: uint32(in.cfg.UID), Gid: uint32(in.cfg.GID), Groups: []uint32{}},
			PidFD:      &pidfd,
		},
	}
	pid, err := syscall.ForkExec(path, m.Argv, attr)
	if err != nil {
		if _, serr := os.Stat(m.Cwd); serr != nil {
			notStarted(fmt.Sprintf("chdir %s: %v", m.Cwd, unwrapPathErr(serr)))
			return
		}
		notStarted(fmt.Sprintf("exec %s: %v", path, err))
		return
	}
	ch := &child{sid: m.SID, pid: pid, pidfd: pidfd}
	in.byPID[pid] = ch
	in.bySID[m.SID] = ch
	_ = in.c.Send(&ctl.Msg{Op: ctl.OpStarted, SID: m.SID})
}

func unwrapPathErr(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// reap collects every child that has ended, reporting the exits of
// sessions. Children that are not sessions (a failed exec's child,
// should ForkExec not have reaped it) are just reaped.
func (in *pid1) reap() {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		ch, ok := in.byPID[pid]
		if !ok || (!ws.Exited() && !ws.Signaled()) {
			continue
		}
		delete(in.byPID, pid)
		delete(in.bySID, ch.sid)
		unix.Close(ch.pidfd)
		msg := &ctl.Msg{Op: ctl.OpExit, SID: ch.sid}
		if ws.Exited() {
			code := ws.ExitStatus()
			msg.Code = &code
		} else {
			msg.Signal = unix.SignalName(ws.Signal())
			if msg.Signal == "" {
				msg.Signal = fmt.Sprintf("SIG%d", int(ws.Signal()))
			}
		}
		_ = in.c.Send(msg)
	}
}

func envPath(env []string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], "PATH="); ok {
			return v
		}
	}
	return ""
}

// lookPath resolves file as execvp(3) would with the session's PATH. The
// final word on executability is the exec itself, made as the session
// user; this only finds the candidate.
func lookPath(file, path string) (string, error) {
	if strings.Contains(file, "/") {
		return file, nil
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, file)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("exec %q: executable file not found in $PATH", file)
}
