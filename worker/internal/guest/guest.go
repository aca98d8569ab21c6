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
	"sync"
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
	c := ctl.New(CtlFD)
	m, files, err := c.Recv()
	if err != nil || m.Op != ctl.OpConfig || m.Config == nil {
		fmt.Fprintln(os.Stderr, "corral machine init: no config:", err)
		os.Exit(2)
	}
	if err := setup(m.Config, files); err != nil {
		_ = c.Send(&ctl.Msg{Op: ctl.OpFail, Message: err.Error()})
		os.Exit(1)
	}
	in := &pid1{c: c, cfg: m.Config, pids: make(map[int]uint64), sids: make(map[uint64]int), kids: make(chan struct{}, 1)}
	if err := c.Send(&ctl.Msg{Op: ctl.OpReady}); err != nil {
		os.Exit(1)
	}
	go in.reap()
	in.serve()
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
	return nil
}

type pid1 struct {
	c   *ctl.Conn
	cfg *ctl.Config

	// mu orders fork+register against reaping, so that the exit of a
	// session that ends at once is never reaped before its pid is known.
	mu   sync.Mutex
	pids map[int]uint64 // session pid (in the machine) → sid
	sids map[uint64]int

	kids chan struct{} // signalled after each fork, for a reaper without children
}

// serve handles the worker's requests until the channel closes.
func (in *pid1) serve() {
	for {
		m, files, err := in.c.Recv()
		if err != nil {
			if errors.Is(err, ctl.ErrFDMismatch) {
				continue
			}
			return
		}
		switch m.Op {
		case ctl.OpStart:
			in.start(m, files)
		case ctl.OpKill:
			in.mu.Lock()
			if pid, ok := in.sids[m.SID]; ok {
				// The session's main process is PID 1 of its own pid
				// namespace: killing it makes the kernel kill every
				// process of the session, wherever it forked to.
				_ = unix.Kill(pid, unix.SIGKILL)
			}
			in.mu.Unlock()
		}
	}
}

func (in *pid1) start(m *ctl.Msg, stdio []*os.File) {
	defer func() {
		for _, f := range stdio {
			f.Close()
		}
	}()
	notStarted := func(msg string) {
		_ = in.c.Send(&ctl.Msg{Op: ctl.OpNotStarted, SID: m.SID, Message: msg})
	}
	path, err := lookPath(m.Argv[0], envPath(m.Env))
	if err != nil {
		notStarted(err.Error())
		return
	}
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
		},
	}
	in.mu.Lock()
	pid, err := syscall.ForkExec(path, m.Argv, attr)
	if err == nil {
		in.pids[pid] = m.SID
		in.sids[m.SID] = pid
		// Sent under mu: the reaper cannot report the exit first.
		_ = in.c.Send(&ctl.Msg{Op: ctl.OpStarted, SID: m.SID})
		in.mu.Unlock()
		select {
		case in.kids <- struct{}{}:
		default:
		}
		return
	}
	in.mu.Unlock()
	{
		if _, serr := os.Stat(m.Cwd); serr != nil {
			notStarted(fmt.Sprintf("chdir %s: %v", m.Cwd, unwrapPathErr(serr)))
			return
		}
		notStarted(fmt.Sprintf("exec %s: %v", path, err))
	}
}

func unwrapPathErr(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// reap waits for every child, reporting the exits of sessions. It blocks
// its own thread in wait4 so that an exit is seen as soon as it happens,
// without going through signal delivery. Children that are not sessions
// (a failed exec's child, orphans) are just reaped.
func (in *pid1) reap() {
	runtime.LockOSThread()
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, 0, nil)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.ECHILD:
			<-in.kids
			continue
		case err != nil:
			_ = in.c.Send(&ctl.Msg{Op: ctl.OpFail, Message: "wait4: " + err.Error()})
			os.Exit(1)
		}
		if !ws.Exited() && !ws.Signaled() {
			continue
		}
		// Taking mu orders this after start registered the pid and sent
		// started (start holds mu from before the fork).
		in.mu.Lock()
		sid, ok := in.pids[pid]
		if ok {
			delete(in.pids, pid)
			delete(in.sids, sid)
		}
		in.mu.Unlock()
		if !ok {
			continue
		}
		msg := &ctl.Msg{Op: ctl.OpExit, SID: sid}
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
