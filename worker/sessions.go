package worker

import (
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/wire"
	"github.com/corral-sandbox/corral/worker/internal/ctl"
)

// Session states, guarded by machine.mu.
const (
	statePending  = iota // accepted, not attached
	stateStarting        // start sent to the init
	stateRunning         // started
	stateDone            // exit (or an error) sent or being sent
)

// session is one accepted exec.
type session struct {
	id   string // the client's
	sid  uint64 // the machine's
	c    *conn
	m    *machine
	argv []string
	env  []string
	cwd  string
	// user and cred are whom it runs as: cred as looked up, else user
	// (alwaysKnown), else the machine's default user.
	user string
	cred *ctl.Cred
	// tty, for a terminal session (wire.FeatureTTY), is its initial size.
	tty   *ctl.Winsize
	state int
	// oomBase is the machine's OOM kill count when s started; cancelled
	// is set by exec-cancel. Both under machine.mu.
	oomBase   int64
	cancelled bool
}

// newSession registers an accepted session on m (which holds a session
// reference for it).
func (m *machine) newSession(c *conn, id string, argv, env []string, cwd, user string, cred *ctl.Cred) *session {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.nextSID++
	s := &session{id: id, sid: m.nextSID, c: c, m: m, argv: argv, env: env, cwd: cwd, user: user, cred: cred}
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
	// A SIGKILL while the count rose is the OOM killer's (see onReport).
	base, _ := m.cg.OOMKills()
	m.mu.Lock()
	s.oomBase = base
	m.mu.Unlock()
	fds := stdio
	if s.tty != nil {
		fds = nil // the init makes the session's stdio: the pty's slave
	}
	err := m.ctl.SendFDs(s.startMsg(), fds...)
	if err == nil || errors.Is(err, ctl.ErrClosed) {
		return true // on ErrClosed the init is gone: read() ends the session
	}
	m.endNotStarted(s, stateStarting, "cannot pass the command to the machine: "+err.Error())
	return true
}

// endNotStarted ends s, if it is still in state from (pending, or starting
// before the init got it), as not started: it is forgotten, its machine
// reference released, and its exit, notStarted with why, sent. It reports
// whether it did.
func (m *machine) endNotStarted(s *session, from int, why string) bool {
	m.mu.Lock()
	if s.state != from {
		m.mu.Unlock()
		return false
	}
	delete(m.bySID, s.sid)
	s.state = stateDone
	m.releaseLocked(true)
	m.mu.Unlock()
	s.c.finish(s, &wire.ExecExit{ID: s.id, NotStarted: true, Message: why})
	return true
}

// startMsg is s's start for the init.
func (s *session) startMsg() *ctl.Msg {
	m := &ctl.Msg{Op: ctl.OpStart, SID: s.sid, Argv: s.argv, Env: s.env, Cwd: s.cwd, Cred: s.cred, TTY: s.tty}
	if s.cred == nil {
		m.User = s.user
	}
	return m
}

// cancel kills s's process tree, or ends it if it was not started. An
// exit follows either way (or has been sent already). Idempotent.
func (m *machine) cancel(s *session) {
	if m.endNotStarted(s, statePending, "cancelled before it was attached") {
		return
	}
	m.mu.Lock()
	switch s.state {
	case stateStarting, stateRunning:
		s.cancelled = true
		m.mu.Unlock()
		_ = m.ctl.Send(&ctl.Msg{Op: ctl.OpKill, SID: s.sid})
	default:
		m.mu.Unlock()
	}
}

// signal sends sig (a signal's name) to s's process tree if s runs; an
// unknown name is ignored (the client checks names before sending).
func (m *machine) signal(s *session, sig string) {
	if unix.SignalNum(sig) == 0 {
		return
	}
	m.mu.Lock()
	running := s.state == stateRunning
	m.mu.Unlock()
	if running {
		_ = m.ctl.Send(&ctl.Msg{Op: ctl.OpSignal, SID: s.sid, Signal: sig})
	}
}

// lookupTimeout bounds how long the init may take to resolve a user.
const lookupTimeout = 10 * time.Second

// lookupUser asks m's init whom user names (see ctl's lookup). It fails
// with a *rejection: "bad-user" for a user the machine does not know,
// "machine-failed" when the init does not answer.
func (m *machine) lookupUser(user string) (*ctl.Cred, error) {
	m.mu.Lock()
	if m.lookupsClosed {
		m.mu.Unlock()
		return nil, &rejection{wire.CodeMachineFailed, "the machine stopped"}
	}
	m.nextSID++
	sid := m.nextSID
	ch := make(chan *ctl.Msg, 1)
	if m.lookups == nil {
		m.lookups = make(map[uint64]chan *ctl.Msg)
	}
	m.lookups[sid] = ch
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		delete(m.lookups, sid)
		m.mu.Unlock()
	}()
	if err := m.ctl.Send(&ctl.Msg{Op: ctl.OpLookup, SID: sid, User: user}); err != nil {
		return nil, &rejection{wire.CodeMachineFailed, fmt.Sprintf("cannot ask the machine for user %q: %v", user, err)}
	}
	t := time.NewTimer(lookupTimeout)
	defer t.Stop()
	select {
	case r, ok := <-ch:
		switch {
		case !ok:
			return nil, &rejection{wire.CodeMachineFailed, "the machine stopped"}
		case r.Cred == nil:
			return nil, &rejection{wire.CodeBadUser, r.Message}
		}
		return r.Cred, nil
	case <-t.C:
		return nil, &rejection{wire.CodeMachineFailed, fmt.Sprintf("the machine did not resolve user %q within %v", user, lookupTimeout)}
	}
}
