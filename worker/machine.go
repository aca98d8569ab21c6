package worker

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/wire"
	"github.com/corral-sandbox/corral/worker/internal/cgroup"
	"github.com/corral-sandbox/corral/worker/internal/ctl"
)

// machineStartTimeout bounds a machine's cold start.
const machineStartTimeout = 30 * time.Second

// machine is the host side of one project's machine.
type machine struct {
	w         *Worker
	id        int64
	workspace string // resolved host path
	requested string // the path as requested when the machine started
	gen       int    // distinguishes successive machines of a project

	// Set by start before ready is closed; read-only afterwards.
	ready    chan struct{}
	startErr error
	hostUID  uint32
	initPID  int
	idmapped bool
	cmd      *exec.Cmd
	ctl      *ctl.Conn
	cg       *cgroup.Group
	netns    *os.File

	dead chan struct{} // closed once the init is gone and cleaned up

	mu        sync.Mutex
	refs      int // sessions plus in-flight net-dials
	sessions  int
	stopping  bool
	idle      *time.Timer // one per machine, re-armed: no timer per exec
	idleSince time.Time   // when refs last dropped to zero
	nextSID   uint64
	bySID     map[uint64]*session
}

func (w *Worker) newMachine(id int64, ws, requested string, slot int) *machine {
	w.gen++
	return &machine{
		w: w, id: id, workspace: ws, requested: requested, gen: w.gen,
		hostUID: w.cfg.UIDBase + uint32(slot)*RangeSize,
		ready:   make(chan struct{}), dead: make(chan struct{}),
		bySID: make(map[uint64]*session),
	}
}

// hold counts a reference. Called with m.mu held.
func (m *machine) hold(session bool) {
	m.refs++
	if session {
		m.sessions++
	}
	if m.idle != nil {
		m.idle.Stop()
	}
}

// release drops a reference taken by acquire.
func (m *machine) release(session bool) {
	m.mu.Lock()
	m.releaseLocked(session)
	m.mu.Unlock()
}

func (m *machine) releaseLocked(session bool) {
	m.refs--
	if session {
		m.sessions--
	}
	if m.refs == 0 && !m.stopping && m.startErr == nil {
		m.idleSince = time.Now()
		if m.idle == nil {
			m.idle = time.AfterFunc(m.w.cfg.IdleGrace, m.idleStop)
		} else {
			m.idle.Reset(m.w.cfg.IdleGrace)
		}
	}
}

// idleStop stops m if it has been idle for the grace when its timer fires
// (a firing that raced with a re-arm finds it idle for less, and the
// re-armed timer fires again).
func (m *machine) idleStop() {
	m.w.mu.Lock()
	m.mu.Lock()
	if m.refs != 0 || m.stopping || time.Since(m.idleSince) < m.w.cfg.IdleGrace {
		m.mu.Unlock()
		m.w.mu.Unlock()
		return
	}
	m.stopping = true
	if m.w.machines[m.id] == m {
		delete(m.w.machines, m.id)
	}
	m.mu.Unlock()
	m.w.mu.Unlock()
	m.stop("idle")
}

// stop kills the init, which takes every process of the machine with it;
// the waiter goroutine then cleans up. Idempotent; does not block.
func (m *machine) stop(reason string) {
	<-m.ready
	m.w.log.Info("stopping machine", "project", m.id, "init", m.initPID, "reason", reason)
	m.mu.Lock()
	m.stopping = true
	m.mu.Unlock()
	if m.startErr != nil {
		return
	}
	_ = m.cmd.Process.Signal(syscall.SIGKILL)
	m.ctl.Close()
}

// start performs the cold start; it closes m.ready when done, with
// m.startErr set on failure.
func (m *machine) start() {
	defer close(m.ready)
	if err := m.boot(); err != nil {
		m.w.log.Error("machine start failed", "project", m.id, "err", err)
		m.startErr = &rejection{wire.CodeMachineFailed, err.Error()}
		m.mu.Lock()
		m.stopping = true
		m.mu.Unlock()
		m.w.forget(m)
		close(m.dead)
		return
	}
	m.w.log.Info("machine started", "project", m.id, "init", m.initPID, "hostUID", m.hostUID, "idmapped", m.idmapped)
	go m.read()
	go m.wait()
}

func (m *machine) boot() (err error) {
	w := m.w
	var cleanups []func()
	defer func() {
		if err != nil {
			for i := len(cleanups) - 1; i >= 0; i-- {
				cleanups[i]()
			}
		}
	}()

	var wsStat unix.Stat_t
	if err := unix.Stat(m.workspace, &wsStat); err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	home := filepath.Join(w.cfg.HomesRoot, strconv.FormatInt(m.id, 10))
	if err := os.MkdirAll(home, 0o700); err != nil {
		return fmt.Errorf("home: %w", err)
	}

	m.cg, err = w.cgroups.New(fmt.Sprintf("machine-%d.%d", m.id, m.gen), cgroup.Limits{Memory: w.memLimit, Pids: w.pidLimit})
	if err != nil {
		return err
	}
	cleanups = append(cleanups, func() { _ = m.cg.Destroy() })

	cfg := &ctl.Config{
		Hostname: "project-" + strconv.FormatInt(m.id, 10),
		UID:      GuestUID, GID: GuestGID, GuestWorkspace: GuestWorkspace, GuestHome: GuestHome,
		Mask:     w.masks,
		GoHolder: w.cfg.GoHolders,
		// Enough holders kept for the sessions the machine admits.
		MaxSessions: w.cfg.MaxSessions,
	}
	if w.pidLimit > 0 {
		// Leave room under the pids limit for the init's own threads and
		// for its ready pid namespace holders (a few threads each).
		cfg.NProc = int(max(w.pidLimit-32, w.pidLimit/2, 1))
	}
	mounts, err := m.workspaceMounts(home, wsStat.Uid, wsStat.Gid)
	if err != nil {
		return err
	}
	defer closeAll(mounts)

	ctlConn, initEnd, err := ctl.Pair()
	if err != nil {
		return err
	}
	cleanups = append(cleanups, func() { ctlConn.Close() })
	m.ctl = ctlConn

	cmd := exec.Command(w.cfg.SelfExe, initArg)
	cmd.Env = []string{}
	cmd.Stderr = os.Stderr
	cmd.ExtraFiles = []*os.File{initEnd}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID |
			syscall.CLONE_NEWNET | syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS,
		UidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(m.hostUID), Size: RangeSize}},
		GidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(m.hostUID), Size: RangeSize}},
		GidMappingsEnableSetgroups: true,
		Credential:                 &syscall.Credential{Uid: 0, Gid: 0, Groups: []uint32{}},
	}
	err = cmd.Start()
	initEnd.Close()
	if err != nil {
		return fmt.Errorf("start init: %w", err)
	}
	m.cmd, m.initPID = cmd, cmd.Process.Pid
	cleanups = append(cleanups, func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	// The init waits for its config before doing anything, so it is in the
	// machine's cgroup before it can fork.
	if err := m.cg.Add(m.initPID); err != nil {
		return err
	}
	if err := ctlConn.Send(&ctl.Msg{Op: ctl.OpConfig, Config: cfg}, mounts...); err != nil {
		return err
	}
	closeAll(mounts)
	mounts = nil
	reply, _, err := ctlConn.RecvTimeout(machineStartTimeout)
	switch {
	case err != nil:
		return fmt.Errorf("init: %w", err)
	case reply.Op == ctl.OpFail:
		return fmt.Errorf("init: %s", reply.Message)
	case reply.Op != ctl.OpReady:
		return fmt.Errorf("init: unexpected %q", reply.Op)
	}
	if m.netns, err = os.Open("/proc/" + strconv.Itoa(m.initPID) + "/ns/net"); err != nil {
		return fmt.Errorf("open machine netns: %w", err)
	}
	return nil
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

func closeAll(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
}

// workspaceMounts prepares the workspace and the home as detached mounts
// (open_tree clones the worker makes with its own access, so the init
// needs none to the host paths), idmapped where the filesystem allows so
// that the host owner of the workspace is the guest user. Where it does
// not, the clone is used as is and the fallback is logged; the home is then
// chowned to the guest user's host id. It returns the workspace's mount,
// then the home's.
func (m *machine) workspaceMounts(home string, uid, gid uint32) (mounts []*os.File, err error) {
	defer func() {
		if err != nil {
			closeAll(mounts)
		}
	}()
	guestUID, guestGID := m.hostUID+GuestUID, m.hostUID+GuestGID
	userns, err := holdUserns(m.w.cfg.SelfExe, uid, gid, guestUID, guestGID)
	if err != nil {
		m.w.log.Warn("idmapped mounts unavailable, falling back to plain binds", "project", m.id, "err", err)
	} else {
		defer userns.Close()
	}
	ws, idmapped, err := cloneTree(m.workspace, userns)
	if err != nil {
		return nil, err
	}
	mounts = append(mounts, ws)
	if !idmapped {
		m.w.log.Warn("workspace not idmapped, bound as is: files the guest creates belong to its host id",
			"project", m.id, "workspace", m.workspace, "hostUID", guestUID)
	}
	m.idmapped = idmapped
	// Owned by the workspace's owner, for the idmapping; re-owned below if
	// that fails.
	if err := os.Chown(home, int(uid), int(gid)); err != nil {
		return mounts, fmt.Errorf("home: %w", err)
	}
	hm, idmapped, err := cloneTree(home, userns)
	if err != nil {
		return mounts, err
	}
	mounts = append(mounts, hm)
	if !idmapped {
		m.w.log.Warn("home not idmapped, chowned to the guest user's host id", "project", m.id, "hostUID", guestUID)
		if err := os.Chown(home, int(guestUID), int(guestGID)); err != nil {
			return mounts, fmt.Errorf("home: %w", err)
		}
	}
	return mounts, nil
}

// holdUserns returns a descriptor of a fresh user namespace mapping host
// uid/gid to id host (the idmapping of the guest user's files). A helper
// process (this binary, see MaybeRunInit) creates it and is killed once
// the descriptor is open.
func holdUserns(self string, uid, gid, hostUID, hostGID uint32) (*os.File, error) {
	r, wr, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer wr.Close()
	cmd := exec.Command(self, holdArg)
	cmd.Env = []string{}
	cmd.Stdin = r
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: int(uid), HostID: int(hostUID), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: int(gid), HostID: int(hostGID), Size: 1}},
	}
	err = cmd.Start()
	r.Close()
	if err != nil {
		return nil, fmt.Errorf("userns helper: %w", err)
	}
	f, err := os.Open("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/ns/user")
	// The helper has served its purpose once the namespace is open; no
	// need to wait for its runtime to start and see EOF.
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if err != nil {
		return nil, fmt.Errorf("userns helper: %w", err)
	}
	return f, nil
}

// cloneTree clones the mount tree at path as a detached mount, idmapped
// through userns when userns is not nil and the filesystem allows it.
func cloneTree(path string, userns *os.File) (f *os.File, idmapped bool, err error) {
	fd, err := unix.OpenTree(unix.AT_FDCWD, path, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
	if err != nil {
		return nil, false, fmt.Errorf("open_tree %s: %w", path, err)
	}
	if userns != nil {
		attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(userns.Fd())}
		if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, attr); err == nil {
			idmapped = true
		} else {
			// EINVAL: the filesystem does not support idmapping. The failed
			// call changed nothing; clone again to be sure of a clean tree.
			unix.Close(fd)
			if fd, err = unix.OpenTree(unix.AT_FDCWD, path, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE); err != nil {
				return nil, false, fmt.Errorf("open_tree %s: %w", path, err)
			}
		}
	}
	return os.NewFile(uintptr(fd), "mount:"+path), idmapped, nil
}

// wait reaps the init and cleans up after it.
func (m *machine) wait() {
	_ = m.cmd.Wait()
	m.mu.Lock()
	m.stopping = true
	if m.idle != nil {
		m.idle.Stop()
	}
	m.mu.Unlock()
	m.ctl.Close()
	m.w.forget(m)
	if err := m.cg.Destroy(); err != nil {
		m.w.log.Error("machine cgroup cleanup failed", "project", m.id, "err", err)
	}
	m.netns.Close()
	m.w.log.Info("machine stopped", "project", m.id, "init", m.initPID)
	close(m.dead)
}

// read dispatches the init's reports until the channel closes; then every
// session still known ends with a "machine-failed" error frame (its exit
// was not observed, so none is reported).
func (m *machine) read() {
	for {
		msg, files, err := m.ctl.Recv()
		closeAll(files)
		if err != nil {
			break
		}
		m.onReport(msg)
	}
	_ = m.cmd.Process.Signal(syscall.SIGKILL)
	m.mu.Lock()
	m.stopping = true
	var orphans []*session
	for sid, s := range m.bySID {
		delete(m.bySID, sid)
		s.state = stateDone
		orphans = append(orphans, s)
		m.releaseLocked(true)
	}
	m.mu.Unlock()
	for _, s := range orphans {
		s.c.finish(s, &wire.Error{ID: s.id, Code: wire.CodeMachineFailed, Message: "the machine stopped"})
	}
}

func (m *machine) onReport(msg *ctl.Msg) {
	m.mu.Lock()
	s := m.bySID[msg.SID]
	if s == nil {
		m.mu.Unlock()
		return
	}
	switch msg.Op {
	case ctl.OpStarted:
		s.state = stateRunning
		m.mu.Unlock()
		s.c.send(&wire.ExecStarted{ID: s.id})
		return
	case ctl.OpNotStarted, ctl.OpExit:
		delete(m.bySID, msg.SID)
		s.state = stateDone
		m.releaseLocked(true)
	default:
		m.mu.Unlock()
		return
	}
	m.mu.Unlock()
	exit := &wire.ExecExit{ID: s.id, Code: msg.Code, Signal: msg.Signal}
	if msg.Op == ctl.OpNotStarted {
		exit.NotStarted, exit.Message = true, msg.Message
	}
	s.c.finish(s, exit)
}

// Session states, guarded by machine.mu.
const (
	statePending  = iota // accepted, not attached
	stateStarting        // start sent to the init
	stateRunning         // started
	stateDone            // exit (or an error) sent or being sent
)

// session is one accepted exec.
type session struct {
	id    string // the client's
	sid   uint64 // the machine's
	c     *conn
	m     *machine
	argv  []string
	env   []string
	cwd   string
	state int
}

// newSession registers an accepted session on m (which holds a session
// reference for it).
func (m *machine) newSession(c *conn, id string, argv, env []string, cwd string) *session {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.nextSID++
	s := &session{id: id, sid: m.nextSID, c: c, m: m, argv: argv, env: env, cwd: cwd}
	m.bySID[s.sid] = s
	return s
}

// attach starts s with stdio. It reports false if s was no longer pending
// (then stdio are closed and nothing happens).
func (m *machine) attach(s *session, stdio []int) bool {
	defer closeFDs(stdio)
	m.mu.Lock()
	if s.state != statePending {
		m.mu.Unlock()
		return false
	}
	s.state = stateStarting
	m.mu.Unlock()
	err := m.ctl.SendFDs(&ctl.Msg{Op: ctl.OpStart, SID: s.sid, Argv: s.argv, Env: s.env, Cwd: s.cwd}, stdio...)
	if err == nil || errors.Is(err, ctl.ErrClosed) {
		return true // on ErrClosed the init is gone: read() ends the session
	}
	m.mu.Lock()
	if s.state != stateStarting {
		m.mu.Unlock()
		return true
	}
	delete(m.bySID, s.sid)
	s.state = stateDone
	m.releaseLocked(true)
	m.mu.Unlock()
	s.c.finish(s, &wire.ExecExit{ID: s.id, NotStarted: true, Message: "cannot pass the command to the machine: " + err.Error()})
	return true
}

// cancel kills s's process tree, or ends it if it was not started. An
// exit follows either way (or has been sent already). Idempotent.
func (m *machine) cancel(s *session) {
	m.mu.Lock()
	switch s.state {
	case statePending:
		delete(m.bySID, s.sid)
		s.state = stateDone
		m.releaseLocked(true)
		m.mu.Unlock()
		s.c.finish(s, &wire.ExecExit{ID: s.id, NotStarted: true, Message: "cancelled before it was attached"})
	case stateStarting, stateRunning:
		m.mu.Unlock()
		_ = m.ctl.Send(&ctl.Msg{Op: ctl.OpKill, SID: s.sid})
	default:
		m.mu.Unlock()
	}
}

// dial connects to 127.0.0.1:port in m's network namespace. The socket is
// created on a thread that has joined the namespace and then returns to
// the worker's own (a socket stays in the namespace it was created in);
// if returning fails, the thread stays locked and dies with its goroutine.
func (m *machine) dial(port int) (*os.File, error) {
	type result struct {
		fd  int
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Setns(int(m.netns.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- result{-1, fmt.Errorf("setns: %w", err)}
			return
		}
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if unix.Setns(int(m.w.hostNet.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		ch <- result{fd, err}
	}()
	r := <-ch
	if r.err != nil {
		return nil, r.err
	}
	if err := unix.Connect(r.fd, &unix.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		unix.Close(r.fd)
		return nil, fmt.Errorf("connect 127.0.0.1:%d: %w", port, err)
	}
	return os.NewFile(uintptr(r.fd), "net-dial"), nil
}
