package machine

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/wire"
)

// conn is one handshaken connection to the worker and the requests in
// flight on it. Its reader (serve) runs on the gateway's connection
// goroutine and is the only goroutine that receives.
type conn struct {
	g     *Gateway
	wc    *wire.Conn
	hello *wire.Hello // the worker's: its name and features

	ended chan struct{} // closed when serve returns
	lost  chan struct{} // closed when lose has finished every request
	// lossErr wraps ErrInterrupted; written before lost is closed and
	// read only after.
	lossErr error

	mu       sync.Mutex
	dead     bool // lose has taken the maps; nothing new may be added
	cause    error
	sessions map[string]*Session
	dials    map[string]chan dialResult
	pings    map[string]chan struct{}
	// entries collects file-entries frames by request id (files.go).
	entries map[string][]wire.FileStat
}

// dialResult answers a net-dial (file) or a machine-reset (neither), or
// reports its failure.
type dialResult struct {
	file *os.File
	err  error
	msg  wire.Message // a file request's answer (files.go)
}

func newConn(g *Gateway, wc *wire.Conn, hello *wire.Hello) *conn {
	return &conn{
		g:        g,
		wc:       wc,
		hello:    hello,
		ended:    make(chan struct{}),
		lost:     make(chan struct{}),
		sessions: make(map[string]*Session),
		dials:    make(map[string]chan dialResult),
		pings:    make(map[string]chan struct{}),
	}
}

// errDead is returned when registering a request on a connection that is
// being torn down.
var errDead = fmt.Errorf("%w: connection is closing", ErrInterrupted)

// fail ends the connection with cause (the first cause wins). The reader
// then returns and lose interrupts everything in flight.
func (c *conn) fail(cause error) {
	c.mu.Lock()
	if c.cause == nil {
		c.cause = cause
	}
	c.mu.Unlock()
	c.wc.Close()
}

func (c *conn) addSession(s *Session) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead {
		return errDead
	}
	if _, ok := c.sessions[s.ID]; ok {
		return fmt.Errorf("machine: session id %q is already in use", s.ID)
	}
	c.sessions[s.ID] = s
	return nil
}

func (c *conn) session(id string, remove bool) *Session {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.sessions[id]
	if remove && s != nil {
		delete(c.sessions, id)
	}
	return s
}

// addDial registers a dial waiter; nil when the connection is dying.
func (c *conn) addDial(id string) chan dialResult {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead {
		return nil
	}
	w := make(chan dialResult, 1)
	c.dials[id] = w
	return w
}

// removeDial unregisters a dial waiter and reports whether it was still
// registered (if not, exactly one result is or will be in its channel).
func (c *conn) removeDial(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.dials[id]
	delete(c.dials, id)
	return ok
}

func (c *conn) takeDial(id string) chan dialResult {
	c.mu.Lock()
	defer c.mu.Unlock()
	w := c.dials[id]
	delete(c.dials, id)
	return w
}

// ping sends a ping and returns a channel closed by its pong.
func (c *conn) ping(id string) (<-chan struct{}, error) {
	ch := make(chan struct{})
	c.mu.Lock()
	if c.dead {
		c.mu.Unlock()
		return nil, errDead
	}
	c.pings[id] = ch
	c.mu.Unlock()
	if err := c.wc.Send(&wire.Ping{ID: id}); err != nil {
		c.fail(err)
		return nil, fmt.Errorf("%w: %w", ErrInterrupted, err)
	}
	return ch, nil
}

// serve receives and dispatches frames until the connection fails, and
// returns why.
func (c *conn) serve() error {
	defer close(c.ended)
	for {
		m, files, err := c.wc.Recv()
		if err == nil {
			err = c.dispatch(m, files)
		}
		if err == nil {
			continue
		}
		c.mu.Lock()
		cause := c.cause
		c.mu.Unlock()
		if cause != nil {
			return cause
		}
		var pe *wire.ProtocolError
		if errors.As(err, &pe) {
			_ = c.wc.Send(pe.Frame())
		}
		if errors.Is(err, io.EOF) {
			err = errors.New("worker closed the connection")
		}
		return err
	}
}

// dispatch handles one frame from the worker. A non-nil error ends the
// connection.
func (c *conn) dispatch(m wire.Message, files []*os.File) error {
	log := c.g.log
	switch m := m.(type) {
	case *wire.Ping:
		if err := c.wc.Send(&wire.Pong{ID: m.ID}); err != nil {
			return err
		}
	case *wire.Pong:
		c.mu.Lock()
		ch := c.pings[m.ID]
		delete(c.pings, m.ID)
		c.mu.Unlock()
		if ch != nil {
			close(ch)
		}
	case *wire.ExecAccepted:
		if s := c.session(m.ID, false); s != nil {
			s.accepted.Store(true)
		} else {
			log.Debug("frame for unknown session", "type", m.Type(), "id", m.ID)
		}
	case *wire.ExecStarted:
		c.event(m.ID, m, false)
	case *wire.ExecRejected:
		c.g.noteRejection(m.Code, m.Message)
		if s := c.event(m.ID, m, true); s != nil {
			s.finish(Exit{}, rejected(m.Code, m.Message))
		}
	case *wire.ExecExit:
		s := c.session(m.ID, true)
		if s == nil {
			log.Debug("exec-exit for unknown session", "id", m.ID)
			return nil
		}
		switch {
		case m.NotStarted:
			msg := m.Message
			if msg == "" {
				msg = "the worker could not start the program"
			}
			s.finish(Exit{}, fmt.Errorf("%w: %s", ErrNotStarted, msg))
		case m.Code != nil:
			code := *m.Code
			s.finish(Exit{Code: &code}, nil)
		default:
			s.finish(Exit{Signal: m.Signal, OOMKilled: m.OOMKilled}, nil)
		}
	case *wire.MachineResetDone:
		if w := c.takeDial(m.ID); w != nil {
			w <- dialResult{}
		}
	case *wire.ExecTTY:
		if s := c.session(m.ID, false); s != nil {
			s.setTTY(files[0])
		} else {
			log.Debug("exec-tty for unknown session", "id", m.ID)
			closeFiles(files)
		}
	case *wire.NetDialed:
		w := c.takeDial(m.ID)
		if w == nil {
			log.Debug("net-dialed for unknown dial", "id", m.ID)
			closeFiles(files)
			return nil
		}
		w <- dialResult{file: files[0]}
	case *wire.FileEntries, *wire.FileOpened, *wire.FileResult:
		c.fileFrame(m, files)
	case *wire.NetListening: // a net-listen answer shares the dial waiters
		w := c.takeDial(m.ID)
		if w == nil {
			log.Debug("net-listening for unknown listen", "id", m.ID)
			closeFiles(files)
			return nil
		}
		w <- dialResult{file: files[0]}
	case *wire.Error:
		if m.ID == "" {
			return fmt.Errorf("worker error: %w", m)
		}
		rej := rejected(m.Code, m.Message)
		if w := c.takeDial(m.ID); w != nil {
			c.g.noteRejection(m.Code, m.Message)
			w <- dialResult{err: rej}
			return nil
		}
		if s := c.session(m.ID, false); s != nil && !s.startedByWorker {
			c.session(m.ID, true)
			s.post(m)
			s.finish(Exit{}, rej)
			return nil
		}
		if s := c.session(m.ID, true); s != nil {
			// A started session ends with an error frame only when its
			// exit could not be observed: the machine died under it.
			log.Info("session lost with its machine", "id", m.ID, "code", m.Code, "message", m.Message)
			s.finish(Exit{}, fmt.Errorf("%w: %s: %s", ErrMachineFailed, m.Code, m.Message))
			return nil
		}
		if m.Code == wire.CodeUnknownSession {
			// The answer to the attach pipelined behind a rejected start.
			log.Debug("worker error frame for a finished session", "id", m.ID, "message", m.Message)
			return nil
		}
		log.Warn("worker error frame", "id", m.ID, "code", m.Code, "message", m.Message)
	default:
		log.Warn("unexpected frame from worker ignored", "type", m.Type())
		closeFiles(files)
	}
	return nil
}

// event posts m to session id's start events, removing the session when
// remove is set, and returns the session (nil if unknown).
func (c *conn) event(id string, m wire.Message, remove bool) *Session {
	s := c.session(id, remove)
	if s == nil {
		c.g.log.Debug("frame for unknown session", "type", m.Type(), "id", id)
		return nil
	}
	if _, ok := m.(*wire.ExecStarted); ok {
		s.startedByWorker = true
	}
	s.post(m)
	return s
}

// lose interrupts everything in flight on the connection: OnInterrupted
// first, then every session's Wait and every pending call.
func (c *conn) lose(cause error) {
	c.wc.Close()
	c.mu.Lock()
	c.dead = true
	if c.cause != nil {
		cause = c.cause
	}
	sessions, dials := c.sessions, c.dials
	c.sessions, c.dials, c.pings = nil, nil, nil
	c.mu.Unlock()

	if errors.Is(cause, ErrClosed) {
		c.g.log.Info("worker connection closed")
	} else {
		c.g.log.Warn("worker connection lost", "err", cause, "sessions", len(sessions))
	}
	err := fmt.Errorf("%w: %w", ErrInterrupted, cause)
	if len(sessions) > 0 && c.g.opts.OnInterrupted != nil {
		c.g.opts.OnInterrupted(sortedKeys(sessions))
	}
	c.lossErr = err
	for _, s := range sessions {
		s.finish(Exit{}, err)
	}
	for _, w := range dials {
		w <- dialResult{err: err}
	}
	close(c.lost)
}

// stdioPairs makes a session's three socketpairs and returns their near
// ends (stdin's, then stdout's and stderr's) and far ends (in order, for
// the worker). On error it has closed everything it made.
//
// Sockets are costly to make (on a VM, each system call is a few
// microseconds), so each end gets the cheapest wrapping its use allows: the
// far ends none (they go out as numbers); stdout's and stderr's near ends
// an *os.File in the runtime's poller, which os.NewFile registers because
// the pairs are made non-blocking (the worker makes the far ends blocking
// again); stdin's a stdinEnd, which registers only once written to. Reads
// and writes then wait in the poller and honour deadlines, without the
// descriptor duplication and socket queries of net.FileConn.
func stdioPairs() (stdin *stdinEnd, out [2]*os.File, far [3]int, err error) {
	far = [3]int{-1, -1, -1}
	near := [3]int{-1, -1, -1}
	for i := range near {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
		if err != nil {
			closeFDs(near[:])
			closeFDs(far[:])
			return nil, [2]*os.File{}, [3]int{-1, -1, -1}, fmt.Errorf("machine: socketpair: %w", err)
		}
		near[i], far[i] = fds[0], fds[1]
	}
	out = [2]*os.File{os.NewFile(uintptr(near[1]), "session-stdout"), os.NewFile(uintptr(near[2]), "session-stderr")}
	return newStdinEnd(near[0]), out, far, nil
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}

func closeFiles(files []*os.File) {
	for _, f := range files {
		if f != nil {
			f.Close()
		}
	}
}

func sockType(uc *net.UnixConn) (string, error) {
	rc, err := uc.SyscallConn()
	if err != nil {
		return "", err
	}
	var typ int
	var gerr error
	if err := rc.Control(func(fd uintptr) {
		typ, gerr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TYPE)
	}); err != nil {
		return "", err
	}
	if gerr != nil {
		return "", gerr
	}
	switch typ {
	case unix.SOCK_SEQPACKET:
		return "unixpacket", nil
	case unix.SOCK_STREAM:
		return "unix", nil
	case unix.SOCK_DGRAM:
		return "unixgram", nil
	}
	return fmt.Sprintf("type-%d", typ), nil
}
