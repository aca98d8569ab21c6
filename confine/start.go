package confine

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"sync"
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
// cmd.SysProcAttr is copied, never modified; with p.User, Start sets its
// Credential and drops its Pdeathsig (see confineAndStart for what
// replaces it). On
// error nothing was started (nothing is left running): an error matching
// ErrUnavailable if the kernel cannot confine, a policy or ruleset error
// (a relative or missing root), or the start's error (for instance the
// program could not be executed). On success the caller owns the process
// as after cmd.Start and must Wait for it, and should Kill the tree once
// cmd has ended.
//
// Unlike the helper, Start cannot close descriptors the calling process
// holds without close-on-exec: the command inherits them, as with
// cmd.Start. Without p.User, if cmd.SysProcAttr.Pdeathsig is set, the
// thread stays parked until the process has exited, because the kernel
// sends the parent-death signal when the forking thread ends.
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
	if r.err != nil {
		// Killed from here, not from the confined thread: its Landlock
		// domain may not signal the init, made by another.
		_ = r.tree.Kill()
		return nil, r.err
	}
	return r.tree, nil
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
	tree, err := confineAndStart(cmd, p, fd)
	if err != nil || tree != nil || cmd.SysProcAttr == nil || cmd.SysProcAttr.Pdeathsig == 0 {
		// On error, startWith kills the tree.
		// A tree's processes have no parent-death signal (see
		// confineAndStart): nothing hangs on this thread.
		started <- startResult{tree: tree, err: err}
		return
	}
	pid := cmd.Process.Pid
	// Opened before the caller can Wait: the process cannot have been
	// reaped yet, so the pidfd refers to it even if it already exited.
	pidfd, perr := unix.PidfdOpen(pid, 0)
	started <- startResult{}
	if perr != nil {
		// Without a pidfd, wait for the exit without reaping it (the
		// caller's Wait does that).
		var info unix.Siginfo
		for {
			err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
			if !errors.Is(err, unix.EINTR) {
				return
			}
		}
	}
	defer unix.Close(pidfd)
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	for {
		// A pidfd becomes readable when its process exits.
		if _, err := unix.Poll(fds, -1); !errors.Is(err, unix.EINTR) {
			return
		}
	}
}

// confineAndStart restricts the calling (locked) thread and starts cmd
// from it, in a new pid namespace as p.User if set. It closes fd.
//
// Processes born in a pid namespace other than their parent's cannot have
// Go's parent-death signal (Go's fork path checks that the parent is
// still alive by comparing getppid, which is 0 there, with the parent's
// pid, and kills the child). So cmd's Pdeathsig is dropped, and the tree
// has a lifeline instead: the init reads a pipe whose only writer is the
// Tree, and exits when it reads EOF, which happens when the calling
// process dies; its death kills the namespace, cmd included.
func confineAndStart(cmd *exec.Cmd, p Policy, fd int) (*Tree, error) {
	if p.User == nil {
		err := restrictThread(fd)
		unix.Close(fd)
		if err != nil {
			return nil, err
		}
		return nil, cmd.Start()
	}
	// The namespaces are entered before the Landlock restriction: a
	// restricted thread may not setns into a process of another domain
	// (the init, made by a thread of its own), as it may not ptrace it.
	// On failure the tree is returned with the error, for the caller to
	// kill (see startWith).
	fail := func(tree *Tree, err error) (*Tree, error) {
		unix.Close(fd)
		return tree, err
	}
	if err := dropCapabilities(); err != nil {
		return fail(nil, err)
	}
	if !p.Network {
		net, err := offlineNetwork()
		if err != nil {
			return fail(nil, err)
		}
		if err := unix.Setns(net, unix.CLONE_NEWNET); err != nil {
			return fail(nil, fmt.Errorf("confine: setns(CLONE_NEWNET): %w", err))
		}
	}
	tree, initFD, err := takeInit(p.Init)
	if err != nil {
		return fail(nil, err)
	}
	// From now on this thread's children are born in the tree's namespace.
	err = unix.Setns(initFD, unix.CLONE_NEWPID)
	unix.Close(initFD)
	if err != nil {
		return fail(tree, fmt.Errorf("confine: setns(CLONE_NEWPID): %w", err))
	}
	err = restrictThread(fd)
	unix.Close(fd)
	if err != nil {
		return tree, err
	}
	attr := syscall.SysProcAttr{}
	if cmd.SysProcAttr != nil {
		attr = *cmd.SysProcAttr
	}
	attr.Credential = &syscall.Credential{Uid: p.User.UID, Gid: p.User.GID, Groups: []uint32{}}
	attr.Pdeathsig = 0
	cmd.SysProcAttr = &attr
	if err := cmd.Start(); err != nil {
		return tree, err
	}
	return tree, nil
}

// initProc is a started init of a pid namespace, not yet a tree.
type initProc struct {
	cmd   *exec.Cmd
	lifeW *os.File // the lifeline's write end
	pidfd int
}

// tree makes p a Tree: its reaper starts.
func (p *initProc) tree() *Tree {
	t := &Tree{init: p.cmd.Process, done: make(chan struct{})}
	go func() {
		_ = p.cmd.Wait()
		p.lifeW.Close()
		close(t.done)
	}()
	return t
}

// discard kills p and reaps it in the background.
func (p *initProc) discard() {
	unix.Close(p.pidfd)
	_ = p.tree().Kill()
}

// exited reports whether p's process has ended.
func (p *initProc) exited() bool {
	fds := []unix.PollFd{{Fd: int32(p.pidfd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 0)
	return err != nil || n > 0
}

// spare is an init made ahead of time, so that starting a command costs
// no init's start (a fork and an execve of corral's executable, and its
// runtime's start, about a millisecond): the next command takes it, and
// the next spare is made in the background. At most one is kept; it dies
// with this process (its lifeline).
var spare struct {
	sync.Mutex
	init    string
	p       *initProc
	filling bool
}

// takeInit returns an init for a new tree: the spare if there is a live
// one for init, else a new one; and has the next spare made.
func takeInit(init string) (*Tree, int, error) {
	spare.Lock()
	p := spare.p
	spare.p = nil
	if p != nil && (spare.init != init || p.exited()) {
		p.discard()
		p = nil
	}
	fill := !spare.filling
	spare.filling = true
	spare.Unlock()
	if fill {
		go fillSpare(init)
	}
	if p == nil {
		var err error
		if p, err = newInit(init); err != nil {
			return nil, -1, err
		}
	}
	return p.tree(), p.pidfd, nil
}

func fillSpare(init string) {
	p, err := newInit(init)
	spare.Lock()
	defer spare.Unlock()
	spare.filling = false
	if err != nil {
		return
	}
	if spare.p != nil {
		p.discard()
		return
	}
	spare.p, spare.init = p, init
}

// newInit starts init (corral's executable) as the init of a new pid
// namespace, from a thread of its own that empties its capability sets,
// sets no_new_privs and restricts itself with Landlock to reading the
// system directories and init: the init keeps uid 0 but executes with no
// capability at all, and an unprivileged command can neither signal nor
// trace it. Its standard input is the read end of the tree's lifeline, its
// output /dev/null, and it holds no other descriptor, so it never keeps a
// command's output open.
func newInit(init string) (*initProc, error) {
	type result struct {
		p   *initProc
		err error
	}
	c := make(chan result, 1)
	go func() {
		// Never unlocked (see startOnConfinedThread).
		runtime.LockOSThread()
		if err := dropCapabilities(); err != nil {
			c <- result{nil, err}
			return
		}
		exe := init
		if exe == "" {
			exe = minimalInit
		}
		fd, err := ruleset(Policy{Init: exe})
		if err != nil {
			c <- result{nil, err}
			return
		}
		err = restrictThread(fd)
		unix.Close(fd)
		if err != nil {
			c <- result{nil, err}
			return
		}
		p, err := startInitProc(init)
		c <- result{p, err}
	}()
	r := <-c
	return r.p, r.err
}

func startInitProc(init string) (*initProc, error) {
	lifeR, lifeW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("confine: lifeline: %w", err)
	}
	defer lifeR.Close()
	args := []string{init, InitArg}
	if init == "" {
		init, args = minimalInit, []string{minimalInit}
	}
	c := &exec.Cmd{
		Path:        init,
		Args:        args,
		Env:         []string{},
		Stdin:       lifeR,
		SysProcAttr: &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWPID},
	}
	if err := c.Start(); err != nil {
		lifeW.Close()
		return nil, fmt.Errorf("confine: start the pid namespace's init: %w", err)
	}
	// Not reaped before Wait (initProc.tree): the pidfd refers to it.
	pidfd, err := unix.PidfdOpen(c.Process.Pid, 0)
	if err != nil {
		lifeW.Close()
		_ = c.Process.Kill()
		_ = c.Wait()
		return nil, fmt.Errorf("confine: pidfd_open: %w", err)
	}
	return &initProc{cmd: c, lifeW: lifeW, pidfd: pidfd}, nil
}

var offline struct {
	sync.Mutex
	fd int // 0: not made yet
}

// offlineNetwork returns a descriptor of the network namespace in which
// the commands of a [User] without [Policy.Network] run: it has nothing but
// a loopback interface that is down, so no socket of any protocol (TCP,
// MPTCP, UDP, raw) reaches anything, and the host's abstract Unix sockets
// are not in it. It is made once per process and shared by every such
// command: what they could share there (abstract sockets) the Landlock
// scope keeps apart.
func offlineNetwork() (int, error) {
	offline.Lock()
	defer offline.Unlock()
	if offline.fd > 0 {
		return offline.fd, nil
	}
	type result struct {
		fd  int
		err error
	}
	c := make(chan result, 1)
	go func() {
		// The thread's network namespace changes: it is never unlocked,
		// so the runtime discards it.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			c <- result{-1, fmt.Errorf("confine: unshare(CLONE_NEWNET): %w", err)}
			return
		}
		fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			err = fmt.Errorf("confine: open the offline network namespace: %w", err)
		}
		c <- result{fd, err}
	}()
	r := <-c
	if r.err != nil {
		return -1, r.err
	}
	offline.fd = r.fd
	return r.fd, nil
}

// minimalInit is the init of a tree whose Policy names none: cat, reading
// the lifeline until EOF (its output is /dev/null), the cheapest program
// that blocks for as long as the tree must live. It reaps nothing: the
// command's orphans stay zombies until the tree is killed, which suits a
// bounded command; long-lived ones name corral's init.
const minimalInit = "/bin/cat"

// InitArg is the first argument that turns corral into the init of a
// confined command's pid namespace (see [Policy.User]); [MaybeRun] runs it.
const InitArg = "__corral-init"

// runInit is the init of a confined command's pid namespace: it reaps the
// orphans the command leaves (they are reparented to it) until it is
// killed or its lifeline (standard input) reaches EOF, either of which
// kills the namespace. It ignores the signals a terminal or a process
// manager sends.
func runInit() {
	go func() {
		var b [1]byte
		for {
			if _, err := os.Stdin.Read(b[:]); err != nil {
				os.Exit(0)
			}
		}
	}()
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
