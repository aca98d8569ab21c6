package worker

// The worker's side of protocol 2 (drawn in package wire) and how each
// session crosses into a machine (the control channel of internal/ctl):
//
//	client                      worker (conn, machine)             init
//	  |-- (connect) ------------->| SO_PEERCRED: root or AllowUID, else
//	  |<--- error {forbidden} ----|   this, then discard until close
//	  |-- hello ----------------->|
//	  |<--------------------hello |
//	  |-- exec-start ------------>| validate; acquire the machine
//	  |<----------- exec-accepted | (or exec-rejected {code})
//	  |-- exec-attach [3 fds] --->|-- start {sid} [3 fds] ------------>| fork+exec
//	  |<------------ exec-started |<------------------------ started --|
//	  |   (or, in one frame: exec-run [3 fds], no exec-accepted)
//	  |-- exec-cancel ----------->|-- kill {sid} --------------------->| SIGKILL holder
//	  |<--------------- exec-exit |<------------ exit {code|signal} ---| wait4
//	  |                           |<------------ notStarted {msg} -----| (exec failed)
//	  |-- net-dial -------------->| setns+socket+connect
//	  |<------ net-dialed [1 fd]  |
//	  |-- net-listen ------------>| setns+socket, bind+listen
//	  |<---- net-listening [1 fd] |
//	  |-- file-request ---------->| as the user, openat2 in the machine's
//	  |<-- file-entries …         |   root (files.go)
//	  |<-- file-opened [1 fd] | file-result | error
//	  |-- (close) --------------->| exec-cancel for every open session

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/wire"
	"github.com/corral-sandbox/corral/worker/internal/ctl"
)

// features are the protocol-2 extensions the worker announces.
var features = []string{wire.FeatureUser, wire.FeatureMachineSpec, wire.FeatureMachineReset, wire.FeatureProjectForget, wire.FeatureOOMKilled, wire.FeatureNetListen, wire.FeatureTTY, wire.FeatureFiles, wire.FeatureExecSignal, wire.FeatureExecRun}

// handshakeTimeout bounds how long a new connection may take to say hello.
const handshakeTimeout = 10 * time.Second

// conn serves one protocol-2 connection. Its frames are handled in order
// by one goroutine (serve); the machines' readers send exec-started and
// exec-exit frames on it concurrently.
type conn struct {
	w  *Worker
	wc *wire.Conn

	wg sync.WaitGroup // requests served off the connection's goroutine

	mu       sync.Mutex
	sessions map[string]*session // accepted and not yet ended, by client id
	closed   bool
}

func newConn(w *Worker, wc *wire.Conn) *conn {
	return &conn{w: w, wc: wc, sessions: make(map[string]*session)}
}

// serve runs the connection until it closes or violates the protocol; then
// every session of the connection is cancelled.
func (c *conn) serve() {
	defer c.shutdown()
	uc := c.wc.UnixConn()
	if err := c.w.checkPeer(uc); err != nil {
		c.w.log.Warn("connection refused", "err", err)
		c.send(&wire.Error{Code: wire.CodeForbidden, Message: err.Error()})
		discardUntilEOF(uc)
		return
	}
	_ = uc.SetReadDeadline(time.Now().Add(handshakeTimeout))
	if err := wire.ServerHello(c.wc, c.w.cfg.Name, features...); err != nil {
		c.w.log.Debug("handshake failed", "err", err)
		return
	}
	_ = uc.SetReadDeadline(time.Time{})
	for {
		m, fds, err := c.wc.RecvFDs()
		if err != nil {
			var pe *wire.ProtocolError
			if errors.As(err, &pe) {
				c.w.log.Warn("protocol error, closing connection", "code", pe.Code, "err", pe.Message)
				c.send(pe.Frame()) // bounded: the client may not be reading
			}
			return
		}
		if !c.handle(m, fds) {
			return
		}
	}
}

// forbiddenDrain bounds how long a refused peer's frames are discarded.
const forbiddenDrain = time.Second

// discardUntilEOF stops sending on uc and discards what the peer sends
// (uninterpreted; descriptors in it are closed by the kernel) until it
// closes, for at most forbiddenDrain. Closing a socket with unread frames
// would make the peer's next read fail with ECONNRESET instead of
// delivering the error frame sent just before.
func discardUntilEOF(uc *net.UnixConn) {
	_ = uc.CloseWrite()
	_ = uc.SetReadDeadline(time.Now().Add(forbiddenDrain))
	buf := make([]byte, 512)
	for {
		if _, err := uc.Read(buf); err != nil {
			return
		}
	}
}

// checkPeer returns an error unless uc's peer runs as root or as
// Config.AllowUID. The credentials are those the peer had when it
// connected (SO_PEERCRED), which a later setuid cannot change.
func (w *Worker) checkPeer(uc *net.UnixConn) error {
	raw, err := uc.SyscallConn()
	if err != nil {
		return fmt.Errorf("peer credentials: %w", err)
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return fmt.Errorf("peer credentials: %w", err)
	}
	if cerr != nil {
		return fmt.Errorf("peer credentials: %w", cerr)
	}
	if cred.Uid != 0 && cred.Uid != w.cfg.AllowUID {
		return fmt.Errorf("peer uid %d (pid %d) may not use this worker: it serves only root and uid %d", cred.Uid, cred.Pid, w.cfg.AllowUID)
	}
	return nil
}

// shutdown closes the connection and cancels its sessions.
func (c *conn) shutdown() {
	c.wc.Close()
	defer c.wg.Wait()
	c.mu.Lock()
	c.closed = true
	ss := make([]*session, 0, len(c.sessions))
	for _, s := range c.sessions {
		ss = append(ss, s)
	}
	c.mu.Unlock()
	for _, s := range ss {
		s.m.cancel(s)
	}
}

// send sends m. A client that does not read for Config.SendTimeout would stall
// the machine readers that report to it, so its connection is closed then
// (which cancels its sessions); other failures are noticed by serve.
func (c *conn) send(m wire.Message, files ...*os.File) {
	if err := c.wc.SendTimeout(c.w.cfg.SendTimeout, m, files...); err != nil {
		c.w.log.Debug("send failed", "type", m.Type(), "err", err)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			c.w.log.Warn("client not reading, closing its connection")
			c.wc.Close()
		}
	}
}

// finish forgets s and sends its last frame.
func (c *conn) finish(s *session, last wire.Message) {
	c.mu.Lock()
	if c.sessions[s.id] == s {
		delete(c.sessions, s.id)
	}
	closed := c.closed
	c.mu.Unlock()
	if !closed {
		c.send(last)
	}
}

// handle processes one frame and the descriptors that came with it (which
// it closes); false closes the connection.
func (c *conn) handle(m wire.Message, fds []int) bool {
	switch m := m.(type) {
	case *wire.Ping:
		c.send(&wire.Pong{ID: m.ID})
	case *wire.Pong:
	case *wire.ExecStart:
		if s := c.execStart(m); s != nil {
			c.send(&wire.ExecAccepted{ID: m.ID})
		}
	case *wire.ExecRun:
		// exec-start and exec-attach in one frame: no exec-accepted, the
		// session starts at once (exec-started says it was accepted).
		if m.TTY == nil {
			if why := checkStdio(fds); why != "" {
				closeFDs(fds)
				c.send(&wire.ExecRejected{ID: m.ID, Code: wire.CodeBadField, Message: why})
				break
			}
		}
		if s := c.execStart((*wire.ExecStart)(m)); s != nil {
			s.m.attach(s, fds)
		} else {
			closeFDs(fds)
		}
	case *wire.ExecAttach:
		c.execAttach(m, fds)
	case *wire.ExecCancel:
		c.mu.Lock()
		s := c.sessions[m.ID]
		c.mu.Unlock()
		if s != nil { // unknown or ended: nothing to do (idempotent)
			s.m.cancel(s)
		}
	case *wire.ExecSignal:
		c.mu.Lock()
		s := c.sessions[m.ID]
		c.mu.Unlock()
		if s != nil { // unknown or ended: ignored
			s.m.signal(s, m.Signal)
		}
	case *wire.NetDial:
		c.netDial(m)
	case *wire.NetListen:
		c.netListen(m)
	case *wire.FileRequest:
		c.goFiles(func() { c.fileRequest(m) })
	case *wire.FileWatch:
		c.goFiles(func() { c.fileWatch(m, fds) })
	case *wire.MachineReset:
		// Off the connection's goroutine: it waits for a machine to stop
		// and a tree to be deleted.
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			c.machineReset(m)
		}()
	default:
		closeFDs(fds)
		c.send(&wire.Error{Code: wire.CodeBadFrame, Message: fmt.Sprintf("a client does not send %s", m.Type())})
		return false
	}
	return true
}

// execStart checks and registers an accepted session, or sends
// exec-rejected and returns nil. The caller answers an accepted one.
func (c *conn) execStart(m *wire.ExecStart) *session {
	reject := func(code, format string, args ...any) {
		c.send(&wire.ExecRejected{ID: m.ID, Code: code, Message: fmt.Sprintf(format, args...)})
	}
	if m.ID == "" {
		reject(wire.CodeBadField, "empty id")
		return nil
	}
	if code, msg := checkArgv(m.Argv); code != "" {
		reject(code, "%s", msg)
		return nil
	}
	if code, msg := checkEnv(m.Env); code != "" {
		reject(code, "%s", msg)
		return nil
	}
	if code, msg := checkUser(m.User); code != "" {
		reject(code, "%s", msg)
		return nil
	}
	if m.Cwd != "" && !validCwd(m.Cwd) {
		reject(wire.CodeBadCwd, "cwd %q must be a clean absolute path inside %s or %s", m.Cwd, GuestWorkspace, GuestHome)
		return nil
	}
	c.mu.Lock()
	_, dup := c.sessions[m.ID]
	c.mu.Unlock()
	if dup {
		reject(wire.CodeDuplicateID, "session %q is still running on this connection", m.ID)
		return nil
	}
	lim := c.w.resolve(m.Project.Limits)
	mach, err := c.w.acquire(m.Project.ID, m.Project.Workspace, m.Project.Image, true, lim)
	if err != nil {
		var r *rejection
		if errors.As(err, &r) {
			reject(r.code, "%s", r.msg)
		} else {
			reject(wire.CodeMachineFailed, "%v", err)
		}
		return nil
	}
	mach.setLimits(lim)
	env := buildEnv(m.Env, mach.imageEnv)
	cwd := m.Cwd
	if cwd == "" {
		cwd = mach.imageCwd
	}
	var cred *ctl.Cred
	if m.User != "" && !alwaysKnown(m.User) {
		if cred, err = mach.lookupUser(m.User); err != nil {
			mach.release(true)
			var r *rejection
			if errors.As(err, &r) {
				reject(r.code, "%s", r.msg)
			} else {
				reject(wire.CodeMachineFailed, "%v", err)
			}
			return nil
		}
	}
	c.w.log.Debug("exec accepted", "project", m.Project.ID, "id", m.ID, "account", m.Account, "lease", m.Lease, "program", m.Argv[0], "user", m.User)
	s := mach.newSession(c, m.ID, m.Argv, env, cwd, m.User, cred)
	if m.TTY != nil {
		s.tty = &ctl.Winsize{Rows: m.TTY.Rows, Cols: m.TTY.Cols}
	}
	c.mu.Lock()
	c.sessions[m.ID] = s
	c.mu.Unlock()
	return s
}

func (c *conn) execAttach(m *wire.ExecAttach, stdio []int) {
	c.mu.Lock()
	s := c.sessions[m.ID]
	c.mu.Unlock()
	if s == nil {
		closeFDs(stdio)
	}
	if s != nil && s.tty == nil {
		if why := checkStdio(stdio); why != "" {
			if !s.m.refuseAttach(s, stdio, why) { // closes stdio
				c.send(&wire.Error{ID: m.ID, Code: wire.CodeUnknownSession, Message: fmt.Sprintf("no session %q awaiting attach", m.ID)})
			}
			return
		}
	}
	if s == nil || !s.m.attach(s, stdio) { // attach closes stdio in any case
		c.send(&wire.Error{ID: m.ID, Code: wire.CodeUnknownSession, Message: fmt.Sprintf("no session %q awaiting attach", m.ID)})
	}
}

func (c *conn) netDial(m *wire.NetDial) {
	c.netRequest(m.ID, m.Project, m.Port, (*machine).dial, &wire.NetDialed{ID: m.ID})
}

// checkArgv validates a command line.
func checkArgv(argv []string) (code, msg string) {
	if len(argv) == 0 || argv[0] == "" {
		return wire.CodeBadArgv, "empty argv"
	}
	for i, a := range argv {
		if strings.IndexByte(a, 0) >= 0 {
			return wire.CodeBadArgv, fmt.Sprintf("argv[%d] contains a NUL byte", i)
		}
	}
	return "", ""
}

// maxUser bounds the length of exec-start's user.
const maxUser = 256

// checkUser validates the syntax of a requested user (the machine's init
// says whether it exists).
func checkUser(user string) (code, msg string) {
	if len(user) > maxUser || strings.ContainsAny(user, "\x00\n") {
		return wire.CodeBadUser, fmt.Sprintf("user %.40q is not a user name or uid", user)
	}
	return "", ""
}

// alwaysKnown reports whether every machine knows user, so that no lookup
// is needed before accepting the session (the init resolves it at the
// start): root, and a bare uid that the machine maps.
func alwaysKnown(user string) bool {
	if user == "root" {
		return true
	}
	if user == "" || strings.TrimLeft(user, "0123456789") != "" || len(user) > 5 {
		return false
	}
	uid, err := strconv.Atoi(user)
	return err == nil && uid < RangeSize
}

// checkEnv validates a request's variables.
func checkEnv(req map[string]string) (code, msg string) {
	for k, v := range req {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return wire.CodeBadEnv, fmt.Sprintf("invalid variable name %q", k)
		}
		if strings.IndexByte(v, 0) >= 0 {
			return wire.CodeBadEnv, fmt.Sprintf("variable %q contains a NUL byte", k)
		}
	}
	return "", ""
}

// buildEnv returns a session's environment (req checked by checkEnv):
// PATH=DefaultPath, then the image's variables, then the request's, which
// win — except that a request's PATH equal to DefaultPath (what corral's
// clients send by default) leaves the image's PATH, so that an image's
// tools (/usr/local/go/bin, /opt/venv/bin, ...) are found. The init adds
// HOME, the session user's, unless the image or the request sets it.
func buildEnv(req map[string]string, image []string) []string {
	vars := make(map[string]string, len(image)+len(req)+2)
	vars["PATH"] = DefaultPath
	for _, kv := range image {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" && strings.IndexByte(kv, 0) < 0 {
			vars[k] = v
		}
	}
	imagePath := vars["PATH"]
	for k, v := range req {
		vars[k] = v
	}
	if req["PATH"] == DefaultPath {
		vars["PATH"] = imagePath
	}
	env := make([]string, 0, len(vars))
	for k, v := range vars {
		env = append(env, k+"="+v)
	}
	return env
}

// validCwd reports whether cwd is a clean absolute guest path inside the
// workspace or the home.
func validCwd(cwd string) bool {
	if !path.IsAbs(cwd) || path.Clean(cwd) != cwd || strings.IndexByte(cwd, 0) >= 0 {
		return false
	}
	for _, dir := range []string{GuestWorkspace, GuestHome} {
		if cwd == dir || strings.HasPrefix(cwd, dir+"/") {
			return true
		}
	}
	return false
}
