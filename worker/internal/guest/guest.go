// Package guest is the init of a machine: PID 1 of its pid namespace, run
// as a re-execution of the worker's own binary. It builds the machine's
// filesystem, then forks sessions on the worker's behalf and reports their
// exits, over the control channel of package ctl on descriptor 3. Each
// session runs in a pid namespace of its own, held by a holder (Holder,
// another re-execution of the binary).
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
	"strconv"
	"strings"
	"syscall"
	"time"

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
	m, fds, err := c.Recv()
	if err != nil || m.Op != ctl.OpConfig || m.Config == nil {
		fmt.Fprintln(os.Stderr, "corral machine init: no config:", err)
		os.Exit(2)
	}
	mounts := make([]*os.File, len(fds))
	for i, fd := range fds {
		mounts[i] = os.NewFile(uintptr(fd), "mount")
	}
	openSessionCgroups(m.Config) // while the host's paths are visible
	if err := setup(m.Config, mounts); err != nil {
		_ = c.Send(&ctl.Msg{Op: ctl.OpFail, Message: err.Error()})
		os.Exit(1)
	}
	in := &pid1{c: c, cfg: m.Config, byPID: make(map[int]*session), bySID: make(map[uint64]*session), childs2: -1}
	if err := in.preparePidNS(); err != nil {
		_ = c.Send(&ctl.Msg{Op: ctl.OpFail, Message: err.Error()})
		os.Exit(1)
	}
	if err := in.preparePrivilege(); err != nil {
		_ = c.Send(&ctl.Msg{Op: ctl.OpFail, Message: err.Error()})
		os.Exit(1)
	}
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
	// First, through the /proc the init was born with (see
	// setUserNSLimits).
	if err := setUserNSLimits(cfg.MaxSessions); err != nil {
		return err
	}
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
	// Swallowed rather than ignored: an ignored disposition survives fork
	// and exec, and sessions must start with every signal at its default
	// (Go resets the signals it handles in the child).
	signal.Notify(make(chan os.Signal, 1), syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGPIPE)
	return nil
}

// preparePrivilege resolves the default user and restricts the threads
// that fork sessions (see caps.go): this one for the default user's
// class, another for the other class. Called last before ready: what the
// init does on this thread afterwards must be allowed by the syscall
// policy.
func (in *pid1) preparePrivilege() error {
	db, err := loadUserDB()
	if err != nil {
		return fmt.Errorf("default user: %w", err)
	}
	spec, fallbackGID := in.cfg.DefaultUser, int64(-1)
	if spec == "" {
		spec, fallbackGID = strconv.Itoa(in.cfg.UID), int64(in.cfg.GID)
	}
	if in.defaultCred, err = db.resolve(spec, fallbackGID); err != nil {
		return fmt.Errorf("default user: %w", err)
	}
	in.setHome(in.defaultCred)
	other := rootCaps
	if in.defaultCred.UID == 0 {
		other = nil
	}
	if in.other, err = newForkThread(other); err != nil {
		return fmt.Errorf("session thread: %w", err)
	}
	if in.childs2, err = openChildren(os.Getpid(), in.other.tid); err != nil {
		return fmt.Errorf("open session thread's children list: %w", err)
	}
	if err := restrictThread(capsFor(in.defaultCred.UID)); err != nil {
		return fmt.Errorf("session thread: %w", err)
	}
	return nil
}

// capsFor returns the capabilities sessions of uid may hold.
func capsFor(uid uint32) []int {
	if uid == 0 {
		return rootCaps
	}
	return nil
}

// threadFor returns the thread that forks sessions of uid (nil: the
// loop's).
func (in *pid1) threadFor(uid uint32) *forkThread {
	if (uid == 0) == (in.defaultCred.UID == 0) {
		return nil
	}
	return in.other
}

// setHome makes the HOME of the default user, unless root, the guest home
// (the per-project home directory), whatever passwd says.
func (in *pid1) setHome(c *ctl.Cred) {
	if c.UID != 0 && c.UID == in.defaultCred.UID {
		c.Home = in.cfg.GuestHome
	}
}

// lookup answers a lookup request.
func (in *pid1) lookup(m *ctl.Msg) {
	reply := &ctl.Msg{Op: ctl.OpLookedUp, SID: m.SID}
	db, err := loadUserDB()
	if err == nil {
		reply.Cred, err = db.resolve(m.User, -1)
	}
	if err != nil {
		reply.Message = err.Error()
	} else {
		in.setHome(reply.Cred)
	}
	_ = in.c.Send(reply)
}

// pid1 is the init's state. Everything runs on the init's one locked
// thread, in loop: a single goroutine blocked in a single system call
// (ppoll) keeps Go's scheduler out of the exec path, and the order of the
// reports (started before exit) follows from program order. The lock also
// matters for correctness: start points this thread's pid_ns_for_children
// at a holder's namespace for the duration of one fork, and the runtime
// creates no thread from a locked one (it would inherit that namespace,
// which the kernel refuses for threads).
//
// The other goroutines are the holder pool's spawner, which shares only
// the pool with the loop (under the pool's mutex), os/signal's, and the
// other forking thread's (forkThread), which runs the forks of the
// sessions of the other privilege class than the default user's while
// the loop waits for it: what is said here of the loop's thread holds for
// it too (it is locked, restricted, and sets its own pid_ns_for_children
// for a fork).
type pid1 struct {
	c     *ctl.Endpoint
	cfg   *ctl.Config
	home  nsHome // the init's namespaces, to return to after a fork
	pool  *holderPool
	byPID map[int]*session // running sessions by pid of main process and of holder
	bySID map[uint64]*session
	poll  []unix.PollFd
	// spawned are the holders spawned for a session (when the pool was
	// empty), until reaped. They are children of the pool's spawner
	// thread (spawnNow), not of this one; kept so that nsEmpty would not
	// take one for a stray were it ever spawned here.
	spawned map[int]bool
	// strays are children of this thread that it did not fork: processes
	// a session made with clone(CLONE_PARENT), by pidfd. They are polled
	// (so that a holder tearing down their namespace, which waits until
	// they are reaped, is not kept waiting) from when they are noticed
	// until reaped.
	strays map[int]int
	childs int // this thread's /proc children file
	// defaultCred is the default user; other forks the sessions of the
	// other class (root or not), whose children file is childs2.
	defaultCred *ctl.Cred
	other       *forkThread
	childs2     int
	// otherForked is set once the other thread forked a session: until
	// then it has no child to look at.
	otherForked bool
	buf         []byte
	// yielded is when the loop last yielded (see yieldEvery).
	yielded time.Time
}

// yieldEvery is how often a busy loop yields to the scheduler. The loop
// goroutine blocks only in system calls, so without this it would run on
// one scheduling tick forever; the runtime's monitor then takes it for a
// goroutine hogging its P (after 10 ms) and, each time, goes back to
// polling every 20 µs: about two wake-ups of the monitor's thread per
// command (a tenth of the init's CPU time per command). A yield now and
// then starts a new tick, for a few futex calls. An idle loop, blocked in
// ppoll, does not yield and lets the monitor sleep.
const yieldEvery = 5 * time.Millisecond

// session is one running session: its main process, a child of the init,
// and the holder of its pid namespace. Its exit is reported once the main
// process is reaped and nothing else is left in the namespace: at once if
// nothing was (the holder then goes back to the pool), else once the
// killed holder is reaped.
type session struct {
	sid    uint64
	pid    int // main process; 0 once reaped
	pidfd  int
	holder *holder // nil once reaped or back in the pool
	exit   *ctl.Msg
}

// preparePidNS readies what start needs: this thread's own fs (to enter
// holders' mount namespaces), the init's own namespaces and the holder
// pool. Called once, after setup (the pool's /dev/null is the machine's).
func (in *pid1) preparePidNS() error {
	if err := unshareFS(); err != nil {
		return err
	}
	var err error
	if in.home, err = openNSHome(); err != nil {
		return err
	}
	initOOMGuard()
	if in.childs, err = openChildren(os.Getpid(), unix.Gettid()); err != nil {
		return fmt.Errorf("open own children list: %w", err)
	}
	in.spawned = make(map[int]bool)
	in.strays = make(map[int]int)
	in.buf = make([]byte, 64<<10)
	null, err := openNull()
	if err != nil {
		return err
	}
	in.pool, err = newHolderPool(null, in.home, in.fatal, in.cfg.GoHolder, retainFor(in.cfg.MaxSessions))
	return err
}

// fatal reports an error after which the init cannot go on (a thread
// stuck in a holder's namespaces); the caller exits.
func (in *pid1) fatal(err error) {
	_ = in.c.Send(&ctl.Msg{Op: ctl.OpFail, Message: err.Error()})
}

// loop serves the worker's requests and reports exits until the control
// channel closes.
func (in *pid1) loop() {
	for {
		in.poll = append(in.poll[:0], unix.PollFd{Fd: int32(in.c.FD()), Events: unix.POLLIN})
		for pid, s := range in.byPID {
			fd := s.pidfd
			if pid != s.pid {
				fd = s.holder.pidfd
			}
			in.poll = append(in.poll, unix.PollFd{Fd: int32(fd), Events: unix.POLLIN})
		}
		for _, fd := range in.strays {
			in.poll = append(in.poll, unix.PollFd{Fd: int32(fd), Events: unix.POLLIN})
		}
		if now := time.Now(); now.Sub(in.yielded) >= yieldEvery {
			runtime.Gosched()
			in.yielded = now
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
		m, fds, err := in.c.TryRecv()
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
			in.start(m, fds)
		case ctl.OpLookup:
			in.lookup(m)
		case ctl.OpKill:
			if s, ok := in.bySID[m.SID]; ok && s.holder != nil {
				// The kernel kills every process of the holder's
				// namespace, the main process included, wherever
				// they forked to.
				s.holder.kill()
				killSessionCgroup(m.SID)
			}
		case ctl.OpSignal:
			if s, ok := in.bySID[m.SID]; ok && s.holder != nil && !s.holder.killed {
				if sig := unix.SignalNum(m.Signal); sig != 0 {
					signalNamespace(s.holder, sig)
				}
			}
		default:
			closeFDs(fds)
		}
	}
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// start starts a session with stdio (three descriptors it closes), or,
// for a start with TTY (and no descriptors), on a new pseudo-terminal.
func (in *pid1) start(m *ctl.Msg, stdio []int) {
	defer closeFDs(stdio)
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
	for _, fd := range stdio {
		_ = setBlocking(fd)
	}
	cred := in.defaultCred
	switch {
	case m.Cred != nil:
		cred = m.Cred
	case m.User != "":
		// One every machine knows (root, a mapped uid): resolved here,
		// without a lookup before the session was accepted.
		db, err := loadUserDB()
		if err == nil {
			cred, err = db.resolve(m.User, -1)
		}
		if err != nil {
			notStarted(err.Error())
			return
		}
		in.setHome(cred)
	}
	env := m.Env
	if envHome(env) < 0 {
		env = append(env, "HOME="+cred.Home)
	}
	pidfd := -1
	attr := &syscall.ProcAttr{
		Dir: m.Cwd,
		Env: env,
		Sys: &syscall.SysProcAttr{
			Setsid:     true,
			Credential: &syscall.Credential{Uid: cred.UID, Gid: cred.GID, Groups: cred.Groups},
			PidFD:      &pidfd,
		},
	}
	master := -1
	if m.TTY != nil {
		// A terminal session: the slave is its stdio and, in the new
		// session, its controlling terminal. The init keeps neither end
		// once the session started: the master goes to the worker.
		var slave int
		master, slave, err = openPTY(m.TTY, cred.UID)
		if err != nil {
			notStarted(err.Error())
			return
		}
		defer unix.Close(slave)
		defer func() {
			if master >= 0 {
				unix.Close(master)
			}
		}()
		attr.Files = []uintptr{uintptr(slave), uintptr(slave), uintptr(slave)}
		attr.Sys.Setctty, attr.Sys.Ctty = true, 0
	} else {
		attr.Files = []uintptr{uintptr(stdio[0]), uintptr(stdio[1]), uintptr(stdio[2])}
	}
	thread := in.threadFor(cred.UID)
	if thread != nil {
		in.otherForked = true
	}
	var (
		h   *holder
		pid int
	)
	for attempt := 1; ; attempt++ {
		var spawned bool
		if attempt == 1 {
			h, spawned, err = in.pool.get()
		} else {
			h, err = in.pool.fresh()
			spawned = err == nil
		}
		if err != nil {
			notStarted(err.Error())
			return
		}
		if spawned {
			in.spawned[h.pid] = true
		}
		cg := newSessionCgroup(m.SID)
		attr.Sys.UseCgroupFD, attr.Sys.CgroupFD = cg >= 0, cg
		thread.do(func() { pid, err = in.forkIn(h, path, m.Argv, attr) })
		if cg >= 0 {
			unix.Close(cg)
			if err != nil && !errors.Is(err, errEnter) {
				// Perhaps CLONE_INTO_CGROUP refused: go on without.
				disableSessionCgroups(m.SID)
				attr.Sys.UseCgroupFD, attr.Sys.CgroupFD = false, 0
				thread.do(func() { pid, err = in.forkIn(h, path, m.Argv, attr) })
			}
		}
		// A holder that died in the pool (the OOM killer?) takes no
		// process into its namespace: setns through its pidfd fails once
		// it is exiting (ESRCH, or EPERM while its exit is under way), the
		// fork (ENOMEM) once its namespace is dead. Discard it and any
		// other dead one, and try once more with a holder spawned for
		// this session: the pool's others may be dying too.
		if err == nil || attempt == maxForkAttempts ||
			!errors.Is(err, errEnter) && !(errors.Is(err, unix.ENOMEM) && !h.alive()) {
			break
		}
		h.discard()
		in.pool.purge()
	}
	if err != nil {
		removeSessionCgroup(m.SID)
		// The child that failed to exec ran nothing of the session's
		// and has been reaped: the namespace is as it was.
		if h.alive() {
			in.pool.put(h)
		} else {
			h.discard()
			in.pool.replenish()
		}
		if _, serr := os.Stat(m.Cwd); serr != nil {
			notStarted(fmt.Sprintf("chdir %s: %v", m.Cwd, unwrapPathErr(serr)))
			return
		}
		notStarted(fmt.Sprintf("exec %s: %v", path, err))
		return
	}
	s := &session{sid: m.SID, pid: pid, pidfd: pidfd, holder: h}
	in.byPID[pid] = s
	in.byPID[h.pid] = s
	in.bySID[m.SID] = s
	if master >= 0 {
		mf := os.NewFile(uintptr(master), "pty-master")
		master = -1
		_ = in.c.Send(&ctl.Msg{Op: ctl.OpStarted, SID: m.SID, TTY: m.TTY}, mf)
		mf.Close()
		return
	}
	_ = in.c.Send(&ctl.Msg{Op: ctl.OpStarted, SID: m.SID})
}

// maxForkAttempts bounds the holders a start tries when they turn out
// dead: one from the pool, then one spawned for it.
const maxForkAttempts = 2

// errEnter marks a failure to enter a holder's namespaces: the holder
// is unusable, whatever the reason.
var errEnter = errors.New("enter the session's namespaces")

// forkIn forks and execs a child of the init inside h's namespaces:
// enterHolder moves this thread into h's mount namespace (the child sees
// the holder's /proc) and sets where its next child goes in pid terms, not
// the thread's own pid namespace, so the child is an ordinary process
// there (not its PID 1) whose parent is the init. The thread then returns
// to the init's namespaces; if it cannot, the init cannot go on safely and
// exits (the machine fails).
func (in *pid1) forkIn(h *holder, path string, argv []string, attr *syscall.ProcAttr) (int, error) {
	if err := enterHolder(h); err != nil {
		return 0, fmt.Errorf("%w: %w", errEnter, err)
	}
	pid, err := guardedFork(func() (int, error) { return syscall.ForkExec(path, argv, attr) })
	if serr := in.home.restore(); serr != nil {
		in.fatal(serr)
		os.Exit(1)
	}
	return pid, err
}

func unwrapPathErr(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// reap collects every child that has ended. A session's main process is
// reaped first (its holder, were it tearing its namespace down, would wait
// for that). Its exit is kept; if nothing else is left in the session's
// namespace, the exit is reported at once and the holder goes back to the
// pool; otherwise the holder is killed, which kills whatever the session
// left behind, and the exit is reported once the holder is reaped too,
// when no process of the session remains. Other children (a discarded
// holder, a process a session made a child of the init with CLONE_PARENT,
// a failed exec's child should ForkExec not have reaped it) are just
// reaped.
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
		delete(in.spawned, pid)
		if fd, ok := in.strays[pid]; ok {
			unix.Close(fd)
			delete(in.strays, pid)
		}
		s, ok := in.byPID[pid]
		if !ok || (!ws.Exited() && !ws.Signaled()) {
			continue
		}
		delete(in.byPID, pid)
		if pid == s.pid {
			unix.Close(s.pidfd)
			s.pid, s.pidfd = 0, -1
			s.exit = exitMsg(s.sid, ws)
			if s.holder != nil {
				// Also when cancelled (the holder already killed): this
				// notices strays, whose reaping the holder waits for.
				if in.nsEmpty(s.holder) && !s.holder.killed {
					delete(in.byPID, s.holder.pid)
					in.pool.put(s.holder)
					s.holder = nil
				} else {
					s.holder.kill()
				}
			}
		} else {
			s.holder.close()
			s.holder = nil
			in.pool.replenish()
		}
		if s.pid == 0 && s.holder == nil {
			removeSessionCgroup(s.sid)
			delete(in.bySID, s.sid)
			_ = in.c.Send(s.exit)
		}
	}
}

// nsEmpty reports whether h's namespace holds no process but h, once the
// main process of its session has been reaped. Every other process of the
// namespace is then in h's subtree — the main process's children were
// reparented to h before it became reapable, and orphans go to h — or,
// made by clone(CLONE_PARENT) from the main process or from such a
// process, a child of the thread that forked it (either forking thread):
// a stray. So the namespace is empty if neither thread has a stray (none
// can appear once there is none) and then
// h has no child. Nothing can enter an empty namespace but a fork by the
// init. Any doubt (a /proc file unreadable) answers false, and the holder
// is killed.
//
// Strays found are registered for polling, whichever session they belong
// to: while one lives, every session ending kills its holder.
func (in *pid1) nsEmpty(h *holder) bool {
	empty := true
	for _, childs := range []int{in.childs, in.childs2} {
		if childs < 0 || childs == in.childs2 && !in.otherForked {
			continue
		}
		b, err := readAt(childs, in.buf)
		if err != nil {
			return false
		}
		for f := range strings.FieldsSeq(string(b)) {
			pid, err := strconv.Atoi(f)
			if err != nil {
				return false
			}
			if _, ok := in.byPID[pid]; ok || in.spawned[pid] {
				continue
			}
			empty = false
			if _, ok := in.strays[pid]; !ok {
				// An unreaped child: its pid cannot have been reused.
				if fd, err := unix.PidfdOpen(pid, 0); err == nil {
					in.strays[pid] = fd
				}
			}
		}
	}
	if !empty {
		return false
	}
	b, err := readAt(h.childs, in.buf)
	return err == nil && len(b) == 0
}

// exitMsg reports the observed end of a session's main process.
func exitMsg(sid uint64, ws unix.WaitStatus) *ctl.Msg {
	msg := &ctl.Msg{Op: ctl.OpExit, SID: sid}
	if ws.Exited() {
		code := ws.ExitStatus()
		msg.Code = &code
		return msg
	}
	msg.Signal = unix.SignalName(ws.Signal())
	if msg.Signal == "" {
		msg.Signal = fmt.Sprintf("SIG%d", int(ws.Signal()))
	}
	return msg
}

// envHome returns the index of env's HOME, or -1.
func envHome(env []string) int {
	for i, kv := range env {
		if strings.HasPrefix(kv, "HOME=") {
			return i
		}
	}
	return -1
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
	var st unix.Stat_t
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, file)
		if err := unix.Stat(p, &st); err == nil && st.Mode&unix.S_IFMT == unix.S_IFREG && st.Mode&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("exec %q: executable file not found in $PATH", file)
}
