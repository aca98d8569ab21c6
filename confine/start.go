package confine

import (
	"errors"
	"fmt"
	"log/slog"
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
// capability bounding, ambient and inheritable sets (a thread so prepared
// serves the following starts of the same policy: see onPrepared), then
// p.Init is started as the init of a new pid namespace (from a thread of
// its own), the thread enters that namespace for its children (setns),
// and forks cmd into it as p.User with no supplementary groups:
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
	if p.User != nil {
		return startUser(cmd, p, -1)
	}
	fd, err := ruleset(p)
	if err != nil {
		return nil, err
	}
	return startWith(cmd, p, fd)
}

// startWith is Start with the ruleset already built; it closes fd.
func startWith(cmd *exec.Cmd, p Policy, fd int) (*Tree, error) {
	if p.User != nil {
		return startUser(cmd, p, fd)
	}
	started := make(chan error, 1)
	go startOnConfinedThread(cmd, fd, started)
	return nil, <-started
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

// startOnConfinedThread restricts a thread of its own with ruleset fd
// (closing it) and starts cmd from it.
func startOnConfinedThread(cmd *exec.Cmd, fd int, started chan<- error) {
	// Never unlocked: when this goroutine returns, the runtime ends the
	// thread and its Landlock domain with it (see runPrepared).
	runtime.LockOSThread()
	err := restrictThread(fd)
	unix.Close(fd)
	if err == nil {
		err = cmd.Start()
	}
	if err != nil || cmd.SysProcAttr == nil || cmd.SysProcAttr.Pdeathsig == 0 {
		started <- err
		return
	}
	pid := cmd.Process.Pid
	// Opened before the caller can Wait: the process cannot have been
	// reaped yet, so the pidfd refers to it even if it already exited.
	pidfd, perr := unix.PidfdOpen(pid, 0)
	started <- nil
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

// startUser starts cmd as p.User in a new tree, from a prepared thread
// (see onPrepared) whose capability sets are empty, that is in p's
// network namespace and restricted by p's ruleset: fd if it is not -1
// (startUser closes it, and the thread is discarded afterwards), else a
// ruleset built for the thread. Per command, the thread only enters the
// tree's pid namespace for its children (setns) and forks cmd as p.User
// with no supplementary groups.
//
// Processes born in a pid namespace other than their parent's cannot have
// Go's parent-death signal (Go's fork path checks that the parent is
// still alive by comparing getppid, which is 0 there, with the parent's
// pid, and kills the child), nor could they on a prepared thread, which
// ends when idle. So cmd's Pdeathsig is dropped, and the tree has a
// lifeline instead: the init reads a pipe whose only writer is the Tree,
// and exits when it reads EOF, which happens when the calling process
// dies; its death kills the namespace, cmd included.
func startUser(cmd *exec.Cmd, p Policy, fd int) (*Tree, error) {
	key := ""
	if fd < 0 {
		if _, err := Available(); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		if err := p.check(); err != nil {
			return nil, err
		}
		var err error
		if key, err = threadKey("command", p); err != nil {
			return nil, err
		}
	}
	tree, nsfd, err := takeInit(p.Init)
	if err != nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		return nil, err
	}
	defer unix.Close(nsfd)
	var startErr error
	err = onPrepared(key, func() error { return prepareUser(p, fd) }, func() bool {
		// The pid namespace is entered by its descriptor, which the
		// unrestricted caller opened: a restricted thread may not open
		// it, nor setns by the init's pidfd (another domain's process, as
		// it may not ptrace it).
		if err := unix.Setns(nsfd, unix.CLONE_NEWPID); err != nil {
			startErr = fmt.Errorf("confine: setns(CLONE_NEWPID): %w", err)
			return false
		}
		attr := syscall.SysProcAttr{}
		if cmd.SysProcAttr != nil {
			attr = *cmd.SysProcAttr
		}
		attr.Credential = &syscall.Credential{Uid: p.User.UID, Gid: p.User.GID, Groups: []uint32{}}
		attr.Pdeathsig = 0
		cmd.SysProcAttr = &attr
		startErr = cmd.Start()
		return key != ""
	})
	if err == nil {
		err = startErr
	}
	if err != nil {
		// Killed from here, not from the confined thread: its Landlock
		// domain may not signal the init, made by another.
		_ = tree.Kill()
		return nil, err
	}
	return tree, nil
}

// prepareUser prepares the calling (locked) thread for starting p's
// commands (see startUser): it gives the thread a private /proc (see
// privateProc), empties the capability sets, enters the
// offline network namespace unless p.Network, and restricts itself with
// ruleset fd (closing it), or one built for p if fd is -1.
func prepareUser(p Policy, fd int) error {
	fail := func(err error) error {
		if fd >= 0 {
			unix.Close(fd)
		}
		return err
	}
	// Its own /proc first, while the thread may still mount.
	if err := privateProc(fd); err != nil {
		return fail(err)
	}
	if err := dropCapabilities(); err != nil {
		return fail(err)
	}
	if !p.Network {
		if err := enterOffline(); err != nil {
			return fail(err)
		}
	}
	if fd < 0 {
		var err error
		if fd, err = ruleset(p); err != nil {
			return err
		}
	}
	err := restrictThread(fd)
	unix.Close(fd)
	return err
}

// initProc is a started init of a pid namespace, not yet a tree.
type initProc struct {
	proc  *os.Process
	lifeW *os.File // the lifeline's write end
	pidfd int
	nsfd  int // its pid namespace
}

// tree makes p a Tree: its reaper starts.
func (p *initProc) tree() *Tree {
	unix.Close(p.pidfd)
	t := &Tree{init: p.proc, done: make(chan struct{})}
	go func() {
		_, _ = p.proc.Wait()
		p.lifeW.Close()
		close(t.done)
	}()
	return t
}

// discard kills p and reaps it in the background.
func (p *initProc) discard() {
	unix.Close(p.nsfd)
	_ = p.tree().Kill()
}

// exited reports whether p's process has ended.
func (p *initProc) exited() bool {
	fds := []unix.PollFd{{Fd: int32(p.pidfd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 0)
	return err != nil || n > 0
}

// spare is an init made ahead of time, so that starting a command costs
// no init's start: the next command takes it, and the next spare is made
// in the background. At most one is kept; it dies with this process (its
// lifeline). A command that finds the spare still being made waits for it
// (one command per spare: others make their own), rather than making
// another init beside it (which, racing the fill for the init's prepared
// thread, also prepared a second thread).
var spare struct {
	sync.Mutex
	init    string
	p       *initProc
	filling chan struct{} // non-nil while a spare of fillFor is made; closed then
	fillFor string
	claimed bool // a command waits for the spare being made
}

// takeInit returns an init for a new tree and its pid namespace's
// descriptor, which the caller closes: the spare if there is a live one
// for init (or one is being made that no other command waits for), else a
// new one; and has the next spare made.
func takeInit(init string) (*Tree, int, error) {
	spare.Lock()
	if spare.p == nil && spare.filling != nil && spare.fillFor == init && !spare.claimed {
		spare.claimed = true
		c := spare.filling
		spare.Unlock()
		<-c
		spare.Lock()
	}
	p := spare.p
	spare.p = nil
	if p != nil && (spare.init != init || p.exited()) {
		p.discard()
		p = nil
	}
	fill := spare.filling == nil
	if fill {
		spare.filling, spare.fillFor, spare.claimed = make(chan struct{}), init, false
	}
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
	return p.tree(), p.nsfd, nil
}

func fillSpare(init string) {
	p, err := newInit(init)
	spare.Lock()
	defer spare.Unlock()
	close(spare.filling)
	spare.filling = nil
	if err != nil {
		return
	}
	if spare.p != nil {
		p.discard()
		return
	}
	spare.p, spare.init = p, init
}

// newInit starts init (corral's executable; empty: minimalInit) as the
// init of a new pid namespace, from a prepared thread (see onPrepared)
// that emptied its capability sets, set no_new_privs and restricted
// itself with Landlock to reading the system directories and init (the
// static init's thread, to nothing at all: it opens no file): the
// init keeps uid 0 but executes with no capability at all, and an
// unprivileged command can neither signal nor trace it. Its standard
// input is the read end of the tree's lifeline, its output /dev/null (the
// static init has none), and it holds no other descriptor, so it never
// keeps a command's output open.
func newInit(init string) (*initProc, error) {
	exe, args := init, []string{init, InitArg}
	isStatic := false
	if init == "" {
		// The minimal init: the static one (see staticInit), or where
		// there is none, cat reading the lifeline until EOF (its output is
		// /dev/null), the cheapest program that blocks for as long as the
		// tree must live. Neither is corral: the static init makes the
		// kernel reap the command's orphans, cat reaps nothing (they stay
		// zombies until the tree is killed), which suits a bounded
		// command; long-lived ones name corral's init.
		exe, args = "/bin/cat", []string{"corral-init"}
		if s := staticInit(); s != "" {
			exe, isStatic = s, true
		}
	}
	rules := Policy{Init: exe}
	key, prepare := "", func() error { return prepareInit(func() (int, error) { return ruleset(rules) }) }
	if isStatic {
		// A memfd, which Landlock can name no rule for, nor restricts: the
		// static init opens nothing, so its thread is allowed nothing,
		// whatever the paths name, and its key needs no path.
		key, prepare = "init\x00static", prepareStaticInit
	} else {
		var err error
		if key, err = threadKey("init", rules); err != nil {
			return nil, err
		}
	}
	var p *initProc
	var startErr error
	err := onPrepared(key, prepare, func() bool {
		p, startErr = startInitProc(exe, args, !isStatic)
		return true
	})
	if err == nil {
		err = startErr
	}
	if err != nil {
		return nil, err
	}
	// Opened here, by an unrestricted thread, before anything can reap
	// the init (the pid is still its own): see startUser.
	p.nsfd, err = unix.Open(fmt.Sprintf("/proc/%d/ns/pid", p.proc.Pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		p.nsfd = -1
		p.discard()
		return nil, fmt.Errorf("confine: open the pid namespace: %w", err)
	}
	return p, nil
}

// prepareInit prepares the calling (locked) thread for starting inits:
// empty capability sets, restricted by the ruleset makeRuleset makes.
func prepareInit(makeRuleset func() (int, error)) error {
	if err := dropCapabilities(); err != nil {
		return err
	}
	fd, err := makeRuleset()
	if err != nil {
		return err
	}
	err = restrictThread(fd)
	unix.Close(fd)
	return err
}

// prepareStaticInit prepares the calling (locked) thread for starting the
// static init (see staticInit), which opens nothing: restricted by a
// ruleset that handles every access right (as a command's does) and
// allows none.
func prepareStaticInit() error { return prepareInit(denyAllRuleset) }

// devNull is /dev/null, opened once, the output of the inits that have one.
var devNull = sync.OnceValues(func() (*os.File, error) { return os.OpenFile(os.DevNull, os.O_RDWR, 0) })

func startInitProc(exe string, args []string, withOutput bool) (*initProc, error) {
	lifeR, lifeW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("confine: lifeline: %w", err)
	}
	defer lifeR.Close()
	files := []*os.File{lifeR}
	if withOutput {
		null, err := devNull()
		if err != nil {
			lifeW.Close()
			return nil, fmt.Errorf("confine: lifeline: %w", err)
		}
		files = append(files, null, null)
	}
	proc, err := os.StartProcess(exe, args, &os.ProcAttr{
		Env:   []string{},
		Files: files,
		Sys:   &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWPID},
	})
	if err != nil {
		lifeW.Close()
		return nil, fmt.Errorf("confine: start the pid namespace's init: %w", err)
	}
	// Not reaped before Wait (initProc.tree): the pidfd refers to it.
	pidfd, err := unix.PidfdOpen(proc.Pid, 0)
	if err != nil {
		lifeW.Close()
		_ = proc.Kill()
		_, _ = proc.Wait()
		return nil, fmt.Errorf("confine: pidfd_open: %w", err)
	}
	return &initProc{proc: proc, lifeW: lifeW, pidfd: pidfd, nsfd: -1}, nil
}

var offline struct {
	sync.Mutex
	fd  int // 0: not made yet
	dev uint64
	ino uint64 // the namespace's identity, to check fd and the result by
}

// offlineFDMin is the lowest descriptor number the offline namespace's
// descriptor is moved to: far from the low numbers that the process's
// ordinary opens and closes reuse all the time.
const offlineFDMin = 1000

// enterOffline moves the calling (locked) thread into the offline network
// namespace (see offlineNetwork) and checks that it got there. The check
// is what keeps a command off the host's network if the descriptor were
// ever closed by code that did not own it and its number reused for
// another namespace (the host's: a worker in the same process opens its
// own): the thread's namespace must be the offline one, by identity, or
// the start fails.
func enterOffline() error {
	fd, dev, ino, err := offlineNetwork()
	if err != nil {
		return err
	}
	if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("confine: setns(CLONE_NEWNET): %w", err)
	}
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
		return fmt.Errorf("confine: check the network namespace: %w", err)
	}
	if st.Dev != dev || st.Ino != ino {
		return fmt.Errorf("confine: the offline network namespace's descriptor %d now names another namespace (closed by another owner?): refusing to start", fd)
	}
	return nil
}

// offlineNetwork returns a descriptor of the network namespace in which
// the commands of a [User] without [Policy.Network] run, and the
// namespace's identity: it has nothing but a loopback interface that is
// down, so no socket of any protocol (TCP, MPTCP, UDP, raw) reaches
// anything, and the host's abstract Unix sockets are not in it. It is made
// once per process and shared by every such command: what they could
// share there (abstract sockets) the Landlock scope keeps apart. If the
// descriptor no longer names that namespace (see enterOffline), a new
// namespace is made.
func offlineNetwork() (fd int, dev, ino uint64, err error) {
	offline.Lock()
	defer offline.Unlock()
	if offline.fd > 0 {
		var st unix.Stat_t
		if unix.Fstat(offline.fd, &st) == nil && st.Dev == offline.dev && st.Ino == offline.ino {
			return offline.fd, offline.dev, offline.ino, nil
		}
		slog.Error("confine: the offline network namespace's descriptor was closed or replaced by another owner; making a new namespace", "fd", offline.fd)
		offline.fd = 0 // not ours any more: never closed here
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
		return -1, 0, 0, r.err
	}
	if high, err := unix.FcntlInt(uintptr(r.fd), unix.F_DUPFD_CLOEXEC, offlineFDMin); err == nil {
		unix.Close(r.fd)
		r.fd = high
	}
	var st unix.Stat_t
	if err := unix.Fstat(r.fd, &st); err != nil {
		unix.Close(r.fd)
		return -1, 0, 0, fmt.Errorf("confine: the offline network namespace: %w", err)
	}
	offline.fd, offline.dev, offline.ino = r.fd, st.Dev, st.Ino
	return offline.fd, offline.dev, offline.ino, nil
}

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
