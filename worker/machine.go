package worker

import (
	"errors"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/corral-sandbox/corral/wire"
	"github.com/corral-sandbox/corral/worker/internal/cgroup"
	"github.com/corral-sandbox/corral/worker/internal/ctl"
)

// machine is the host side of one project's machine.
type machine struct {
	w         *Worker
	id        int64
	workspace string   // resolved host path
	requested string   // the path as requested when the machine started
	imageName string   // as requested ("" is the base image)
	gen       int      // distinguishes successive machines of a project
	prev      *machine // the project's machine before this one, until boot saw it dead

	// Set by start before ready is closed; read-only afterwards.
	ready    chan struct{}
	startErr error
	hostUID  uint32
	initPID  int
	idmapped bool
	// The image's name and id, and its defaults for sessions.
	image    string
	imageID  string
	imageEnv []string
	imageCwd string
	cmd      *exec.Cmd
	ctl      *ctl.Conn
	cg       *cgroup.Group
	sessCG   *cgroup.Group // the parent of the sessions' groups (cg, on v2)
	netns    *os.File

	// defaultUser is whom sessions run as unless they name a user (the
	// init's Config.DefaultUser; empty means uid and gid GuestUID, GuestGID).
	defaultUser string

	dead chan struct{} // closed once the init is gone and cleaned up

	limMu sync.Mutex    // serialises limit changes
	lim   machineLimits // as applied
	disk  *diskRef      // the project's disk, if it has one
	// diskMnt is where disk is mounted.
	diskMnt string

	mu        sync.Mutex
	refs      int // sessions plus in-flight net-dials
	sessions  int
	stopping  bool
	idle      *time.Timer // one per machine, re-armed: no timer per exec
	idleSince time.Time   // when refs last dropped to zero
	nextSID   uint64
	bySID     map[uint64]*session
	// lookups wait for the init's answers to user lookups, by sid; closed
	// (and lookupsClosed set) when the control channel closes.
	lookups       map[uint64]chan *ctl.Msg
	lookupsClosed bool
}

func (w *Worker) newMachine(id int64, ws, requested, img string, slot int, lim machineLimits) *machine {
	w.gen++
	return &machine{
		w: w, id: id, workspace: ws, requested: requested, imageName: img, gen: w.gen, lim: lim,
		hostUID: w.hostUIDOf(slot),
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
		var r *rejection
		if errors.As(err, &r) {
			m.startErr = r
		} else {
			m.startErr = &rejection{wire.CodeMachineFailed, err.Error()}
		}
		m.mu.Lock()
		m.stopping = true
		m.mu.Unlock()
		m.w.forget(m)
		m.w.buried(m)
		close(m.dead)
		return
	}
	m.w.log.Info("machine started", "project", m.id, "init", m.initPID, "hostUID", m.hostUID, "idmapped", m.idmapped)
	go m.read()
	go m.wait()
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
	if m.sessCG != m.cg {
		_ = m.sessCG.Destroy()
	}
	m.netns.Close()
	m.closeDisk()
	m.w.log.Info("machine stopped", "project", m.id, "init", m.initPID)
	m.w.buried(m)
	close(m.dead)
}

// read dispatches the init's reports until the channel closes; then every
// session still known ends with a "machine-failed" error frame (its exit
// was not observed, so none is reported).
func (m *machine) read() {
	for {
		msg, files, err := m.ctl.Recv()
		if err != nil {
			break
		}
		m.onReport(msg, files)
		closeAll(files)
	}
	_ = m.cmd.Process.Signal(syscall.SIGKILL)
	m.mu.Lock()
	m.stopping = true
	m.lookupsClosed = true
	for sid, ch := range m.lookups {
		close(ch)
		delete(m.lookups, sid)
	}
	var orphans []*session
	var starting []bool
	for sid, s := range m.bySID {
		delete(m.bySID, sid)
		starting = append(starting, s.state == stateStarting)
		s.state = stateDone
		orphans = append(orphans, s)
		m.releaseLocked(true)
	}
	m.mu.Unlock()
	for i, s := range orphans {
		if starting[i] {
			// Passed to the init, whose report did not come: the program
			// may have run. The client learns it started, and then that
			// its outcome is unknown (not that it was refused).
			s.c.send(&wire.ExecStarted{ID: s.id})
		}
		s.c.finish(s, &wire.Error{ID: s.id, Code: wire.CodeMachineFailed, Message: "the machine stopped"})
	}
}

// onReport handles one report of the init and the descriptors it carried
// (a terminal session's master), which the caller closes afterwards.
func (m *machine) onReport(msg *ctl.Msg, files []*os.File) {
	m.mu.Lock()
	if msg.Op == ctl.OpLookedUp {
		if ch := m.lookups[msg.SID]; ch != nil {
			ch <- msg // buffered, one answer per lookup
			delete(m.lookups, msg.SID)
		}
		m.mu.Unlock()
		return
	}
	s := m.bySID[msg.SID]
	if s == nil {
		m.mu.Unlock()
		return
	}
	switch msg.Op {
	case ctl.OpStarted:
		s.state = stateRunning
		m.mu.Unlock()
		if len(files) == 1 && s.tty != nil {
			// The client holds the master from now on; the worker's copy
			// is closed by the caller.
			s.c.send(&wire.ExecTTY{ID: s.id}, files[0])
		}
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
	cancelled, base := s.cancelled, s.oomBase
	m.mu.Unlock()
	exit := &wire.ExecExit{ID: s.id, Code: msg.Code, Signal: msg.Signal}
	if msg.Op == ctl.OpNotStarted {
		exit.NotStarted, exit.Message = true, msg.Message
	}
	// The kernel's OOM killer sends SIGKILL and counts the kill in the
	// machine's cgroup: a session killed by SIGKILL, not cancelled, while
	// the count rose is taken for its victim (another session's OOM kill
	// during its life and a SIGKILL from elsewhere would also match).
	if msg.Signal == "SIGKILL" && !cancelled {
		if n, err := m.cg.OOMKills(); err == nil && n > base {
			exit.OOMKilled = true
			m.w.log.Info("session killed by the OOM killer", "project", m.id, "id", s.id)
		}
	}
	s.c.finish(s, exit)
}
