package confine

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// Start starts cmd like cmd.Start, confined by p exactly as the helper
// confines a command, but without a helper process: cmd is forked from a
// dedicated OS thread on which the restriction is enforced, and that the
// runtime discards afterwards. The calling process and its other threads
// stay unconfined. It saves the helper's own start (a Go runtime, its
// package initialisation and a second execve: a few milliseconds per
// command).
//
// With p.User (the caller must be root), the thread first empties its
// capability bounding, ambient and inheritable sets, then starts p.Init as
// the init of a new pid namespace, enters that namespace for its children
// (setns), and forks cmd into it as p.User with no supplementary groups:
// cmd is an ordinary process of the namespace (pid 2, not its init), so
// signals behave as on the host (a shell's `kill $$` ends it). The
// returned [Tree] kills the namespace, and with it every process cmd left
// behind, whatever process group or session they moved to. Without
// p.User the tree is nil: the caller can only kill cmd's process group.
//
// cmd.SysProcAttr is copied, never modified; Start sets its Credential. On
// error nothing was started (nothing is left running): an error matching
// ErrUnavailable if the kernel cannot confine, a policy or ruleset error
// (a relative or missing root), or the start's error (for instance the
// program could not be executed). On success the caller owns the process
// as after cmd.Start and must Wait for it, and should Kill the tree once
// cmd has ended.
//
// Unlike the helper, Start cannot close descriptors the calling process
// holds without close-on-exec: the command inherits them, as with
// cmd.Start. If cmd.SysProcAttr.Pdeathsig is set, or there is a tree (its
// init has SIGKILL as its parent-death signal), the thread stays parked
// until those processes have exited, because the kernel sends the
// parent-death signal when the forking thread ends.
func Start(cmd *exec.Cmd, p Policy) (*Tree, error) {
	fd, err := ruleset(p)
	if err != nil {
		return nil, err
	}
	return startWith(cmd, p, fd)
}

// startWith is Start with the ruleset already built; it closes fd.
func startWith(cmd *exec.Cmd, p Policy, fd int) (*Tree, error) {
	started := make(chan startResult, 1)
	go startOnConfinedThread(cmd, p, fd, started)
	r := <-started
	return r.tree, r.err
}

type startResult struct {
	tree *Tree
	err  error
}

// Tree is the pid namespace of a command Start started as a [User]: its
// init and every process the command started.
type Tree struct {
	init *os.Process
	done chan struct{} // closed when init has been reaped
}

// Kill kills every process of the tree: the kernel kills the whole pid
// namespace when its init dies. It does not wait (see Wait). It may be
// called any number of times, also after the tree ended; a nil Tree does
// nothing.
func (t *Tree) Kill() error {
	if t == nil {
		return nil
	}
	if err := t.init.Signal(unix.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("confine: kill the pid namespace: %w", err)
	}
	return nil
}

// Done is closed when the tree has ended: its init was reaped, which the
// kernel allows only once every other process of the namespace has exited
// and been reaped (the command's own main process is reaped by its
// caller's Wait). A nil Tree's Done is closed.
func (t *Tree) Done() <-chan struct{} {
	if t == nil {
		return closed
	}
	return t.done
}

var closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func startOnConfinedThread(cmd *exec.Cmd, p Policy, fd int, started chan<- startResult) {
	// Never unlocked: when this goroutine returns, the runtime ends the
	// thread and its Landlock domain, capability sets and pid namespace
	// for children with it. (Threads the runtime needs meanwhile are not
	// cloned from a locked thread but from its template thread, so none of
	// it spreads to anything but what this thread forks. Should this
	// goroutine run on the main thread, the runtime parks that thread for
	// good instead of ending it: it runs nothing else either.)
	runtime.LockOSThread()
	tree, initFD, err := confineAndStart(cmd, p, fd)
	if err != nil {
		started <- startResult{err: err}
		return
	}
	var fds []unix.PollFd
	if initFD >= 0 {
		defer unix.Close(initFD)
		fds = append(fds, unix.PollFd{Fd: int32(initFD), Events: unix.POLLIN})
	}
	if cmd.SysProcAttr != nil && cmd.SysProcAttr.Pdeathsig != 0 {
		// Opened before the caller can Wait: the process cannot have been
		// reaped yet, so the pidfd refers to it even if it already exited.
		if pidfd, err := unix.PidfdOpen(cmd.Process.Pid, 0); err == nil {
			defer unix.Close(pidfd)
			fds = append(fds, unix.PollFd{Fd: int32(pidfd), Events: unix.POLLIN})
		} else {
			started <- startResult{tree: tree}
			// Without a pidfd, wait for the exit without reaping it
			// (the caller's Wait does that).
			var info unix.Siginfo
			for {
				err := unix.Waitid(unix.P_PID, cmd.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
				if !errors.Is(err, unix.EINTR) {
					break
				}
			}
			started = nil
		}
	}
	if started != nil {
		started <- startResult{tree: tree}
	}
	// A pidfd becomes readable when its process exits: park until every
	// process whose parent-death signal hangs on this thread has.
	for len(fds) > 0 {
		if _, err := unix.Poll(fds, -1); errors.Is(err, unix.EINTR) {
			continue
		} else if err != nil {
			return
		}
		live := fds[:0]
		for _, f := range fds {
			if f.Revents == 0 {
				live = append(live, unix.PollFd{Fd: f.Fd, Events: unix.POLLIN})
			}
		}
		fds = live
	}
}

// confineAndStart restricts the calling (locked) thread and starts cmd
// from it, in a new pid namespace as p.User if set. It closes fd. The
// returned pidfd (-1 without a tree) refers to the tree's init; the
// caller closes it.
func confineAndStart(cmd *exec.Cmd, p Policy, fd int) (tree *Tree, initFD int, err error) {
	initFD = -1
	if p.User != nil {
		if err := dropCapabilities(); err != nil {
			unix.Close(fd)
			return nil, -1, err
		}
	}
	err = restrictThread(fd)
	unix.Close(fd)
	if err != nil {
		return nil, -1, err
	}
	if p.User == nil {
		return nil, -1, cmd.Start()
	}
	tree, initFD, err = startInit(p.Init)
	if err != nil {
		return nil, -1, err
	}
	fail := func(err error) (*Tree, int, error) {
		_ = tree.Kill()
		unix.Close(initFD)
		return nil, -1, err
	}
	// From now on this thread's children are born in the tree's namespace.
	if err := unix.Setns(initFD, unix.CLONE_NEWPID); err != nil {
		return fail(fmt.Errorf("confine: setns(CLONE_NEWPID): %w", err))
	}
	attr := syscall.SysProcAttr{}
	if cmd.SysProcAttr != nil {
		attr = *cmd.SysProcAttr
	}
	attr.Credential = &syscall.Credential{Uid: p.User.UID, Gid: p.User.GID, Groups: []uint32{}}
	cmd.SysProcAttr = &attr
	if err := cmd.Start(); err != nil {
		return fail(err)
	}
	return tree, initFD, nil
}

// startInit starts init (corral's executable) as the init of a new pid
// namespace, from the calling confined thread: it keeps uid 0 but, with the
// thread's empty bounding set and no_new_privs, executes with no
// capability at all; an unprivileged command can neither signal nor trace
// it. Its standard streams are /dev/null and it holds no other descriptor,
// so it never keeps a command's output open. It dies with this thread
// (SIGKILL as parent-death signal).
func startInit(init string) (*Tree, int, error) {
	c := &exec.Cmd{
		Path: init,
		Args: []string{init, InitArg},
		Env:  []string{},
		SysProcAttr: &syscall.SysProcAttr{
			Cloneflags: unix.CLONE_NEWPID,
			Pdeathsig:  syscall.SIGKILL,
		},
	}
	if err := c.Start(); err != nil {
		return nil, -1, fmt.Errorf("confine: start the pid namespace's init: %w", err)
	}
	// Not reaped before Wait below: the pidfd refers to it.
	pidfd, err := unix.PidfdOpen(c.Process.Pid, 0)
	if err != nil {
		_ = c.Process.Kill()
		_ = c.Wait()
		return nil, -1, fmt.Errorf("confine: pidfd_open: %w", err)
	}
	t := &Tree{init: c.Process, done: make(chan struct{})}
	go func() {
		_ = c.Wait()
		close(t.done)
	}()
	return t, pidfd, nil
}

// InitArg is the first argument that turns corral into the init of a
// confined command's pid namespace (see [Policy.User]); [MaybeRun] runs it.
const InitArg = "__corral-init"

// runInit is the init of a confined command's pid namespace: it reaps the
// orphans the command leaves (they are reparented to it) until it is
// killed, which kills the namespace. It ignores the signals a terminal or a
// process manager sends (only SIGKILL from outside ends it).
func runInit() {
	signal.Ignore(unix.SIGHUP, unix.SIGINT, unix.SIGQUIT, unix.SIGTERM, unix.SIGPIPE,
		unix.SIGUSR1, unix.SIGUSR2, unix.SIGTSTP, unix.SIGTTIN, unix.SIGTTOU)
	chld := make(chan os.Signal, 1)
	signal.Notify(chld, unix.SIGCHLD)
	for {
		for {
			var ws unix.WaitStatus
			pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if pid <= 0 || err != nil {
				break
			}
		}
		<-chld
	}
}
