// Package machine is the machine runtime gateway: core's client of the
// privileged worker. A Gateway holds one persistent protocol-2 connection
// (package wire) to the worker, obtained from the PrivilegedTransport it was
// given; runs commands in project machines as Sessions whose standard
// streams are socketpairs created here and attached in the worker as the
// command's descriptors 0, 1 and 2; and dials ports inside machines.
//
// Nothing here discovers the worker: without a transport every call fails
// with ErrNoPrivilegedTransport.
//
// When the connection is lost, every session in flight on it is
// interrupted: the worker cancels them, Options.OnInterrupted is called with
// their ids, and only then do their Wait calls return an error wrapping
// ErrInterrupted. The gateway reconnects with bounded exponential backoff.
package machine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/corral-sandbox/corral/internal/errdefs"
	"github.com/corral-sandbox/corral/wire"
)

// ErrNoPrivilegedTransport is returned by every Gateway call when the
// gateway was built without a transport.
var ErrNoPrivilegedTransport = errdefs.New(errdefs.Unavailable, "no privileged transport in this process")

// Errors callers branch on. All are wrapped; test with errors.Is.
var (
	// ErrInterrupted means the connection to the worker was lost (or the
	// gateway closed) while a call or session was in flight. For a
	// session it is a transport failure: the command's outcome is unknown
	// and the worker has cancelled it.
	ErrInterrupted = errors.New("machine: connection to the worker lost")
	// ErrUnavailable means no connection to the worker could be made; the
	// request was not sent.
	ErrUnavailable = errdefs.New(errdefs.Unavailable, "machine: worker unavailable")
	// ErrNotStarted means the worker could not start the program (it was
	// never executed); it comes from Session.Wait.
	ErrNotStarted = errors.New("machine: command not started")
	// ErrMachineFailed means the session's machine died under it (its
	// init was killed, it ran out of memory, its cgroup was removed): the
	// worker could not observe the command's end, whose outcome is
	// unknown, and everything of the machine was killed. For a session it
	// is a transport failure, like ErrInterrupted.
	ErrMachineFailed = errors.New("machine: the machine stopped under the session")
	// ErrClosed means the Gateway was closed.
	ErrClosed = errors.New("machine: gateway closed")
	// ErrPingTimeout is the cause of an interruption detected because the
	// worker stopped answering pings.
	ErrPingTimeout = errors.New("machine: worker did not answer ping")
)

// Options configure a Gateway. The zero value is usable.
type Options struct {
	// OnInterrupted, if non-nil, is called when the connection to the
	// worker is lost (or the gateway is closed) with the ids of the
	// sessions that were in flight on it, sorted; it is not called when
	// none were. It is called once per lost connection, from the gateway's
	// connection goroutine, before the Wait (and pending Exec) of any of
	// those sessions returns, and before reconnecting; it should record the
	// interruption and return promptly.
	OnInterrupted func(sessionIDs []string)
	// Logger receives connection events. Nil discards them.
	Logger *slog.Logger
	// PingInterval is how often the gateway pings the worker; a ping not
	// answered by the next one ends the connection (cause ErrPingTimeout).
	// Zero means 10 seconds; negative disables pings.
	PingInterval time.Duration
	// HandshakeTimeout bounds connecting and the hello exchange. Zero
	// means 5 seconds.
	HandshakeTimeout time.Duration
	// MinBackoff and MaxBackoff bound the delay between failed connection
	// attempts, which doubles from MinBackoff up to MaxBackoff. Zero means
	// 50 milliseconds and 5 seconds. A call waiting for a connection cuts
	// the current delay short, but attempts are never closer together than
	// MinBackoff.
	MinBackoff time.Duration
	MaxBackoff time.Duration
}

// Gateway is core's client of the privileged worker. Its methods are safe
// for concurrent use. Create it with New; release it with Close.
type Gateway struct {
	transport PrivilegedTransport
	opts      Options
	log       *slog.Logger

	ctx    context.Context // ended by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
	kick   chan struct{}
	nextID atomic.Uint64

	mu       sync.Mutex
	cur      *conn         // the live connection, or nil
	changed  chan struct{} // closed and replaced whenever the state below changes
	failures int           // failed connection attempts so far
	lastErr  error         // why the last attempt failed
	permErr  error         // non-nil: the transport will never connect again
	closed   bool

	// startFailed and startFailure are when the worker last refused a
	// request because it could not start a machine, and its message.
	startFailed  time.Time
	startFailure string
}

// LastStartFailure returns when the worker last refused a request with
// "machine-failed" (it could not start the project's machine) and the
// worker's message; the zero time if it never did.
func (g *Gateway) LastStartFailure() (time.Time, string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.startFailed, g.startFailure
}

// noteRejection records a machine start failure.
func (g *Gateway) noteRejection(code, msg string) {
	if code != wire.CodeMachineFailed {
		return
	}
	g.mu.Lock()
	g.startFailed, g.startFailure = time.Now(), msg
	g.mu.Unlock()
}

// New returns a gateway that reaches the worker through transport and
// starts connecting in the background. A nil transport is allowed: every
// call of that gateway then fails with ErrNoPrivilegedTransport, and it
// starts nothing.
func New(transport PrivilegedTransport, opts Options) *Gateway {
	if opts.PingInterval == 0 {
		opts.PingInterval = 10 * time.Second
	}
	if opts.HandshakeTimeout <= 0 {
		opts.HandshakeTimeout = 5 * time.Second
	}
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = 50 * time.Millisecond
	}
	if opts.MaxBackoff <= 0 {
		opts.MaxBackoff = 5 * time.Second
	}
	if opts.MaxBackoff < opts.MinBackoff {
		opts.MaxBackoff = opts.MinBackoff
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	g := &Gateway{
		transport: transport,
		opts:      opts,
		log:       log.With("component", "machine-gateway"),
		kick:      make(chan struct{}, 1),
		changed:   make(chan struct{}),
	}
	g.ctx, g.cancel = context.WithCancel(context.Background())
	if transport != nil {
		g.wg.Add(1)
		go g.run()
	}
	return g
}

// HasTransport reports whether the gateway was given a transport. A
// gateway without one (or a nil *Gateway) fails every call with
// ErrNoPrivilegedTransport.
func (g *Gateway) HasTransport() bool { return g != nil && g.transport != nil }

// Close closes the connection to the worker, which cancels every session
// on it: their Wait returns an error wrapping both ErrInterrupted and
// ErrClosed, after OnInterrupted was called with their ids. Later calls
// fail with ErrClosed. Close blocks until the gateway's goroutines have
// ended; it is idempotent and returns nil.
func (g *Gateway) Close() error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		g.wg.Wait()
		return nil
	}
	g.closed = true
	cur := g.cur
	g.signalLocked()
	g.mu.Unlock()
	g.cancel()
	if cur != nil {
		cur.fail(ErrClosed)
	}
	g.wg.Wait()
	return nil
}

// signalLocked wakes everyone waiting for a state change. g.mu is held.
func (g *Gateway) signalLocked() {
	close(g.changed)
	g.changed = make(chan struct{})
}

// connection returns the live connection, waiting for one to be made. It
// fails with ErrNoPrivilegedTransport, ErrClosed, ctx's error, or
// ErrUnavailable (wrapping the cause) when an attempt that ended after the
// call began failed.
func (g *Gateway) connection(ctx context.Context) (*conn, error) {
	if g == nil || g.transport == nil {
		return nil, ErrNoPrivilegedTransport
	}
	g.mu.Lock()
	seen := g.failures
	for {
		switch {
		case g.closed:
			g.mu.Unlock()
			return nil, ErrClosed
		case g.cur != nil:
			c := g.cur
			g.mu.Unlock()
			return c, nil
		case g.permErr != nil:
			err := g.permErr
			g.mu.Unlock()
			return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
		case g.failures != seen:
			err := g.lastErr
			g.mu.Unlock()
			return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		ch := g.changed
		g.mu.Unlock()
		select {
		case g.kick <- struct{}{}:
		default:
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		g.mu.Lock()
	}
}

// run is the connection goroutine: connect, serve until lost, repeat.
func (g *Gateway) run() {
	defer g.wg.Done()
	backoff := g.opts.MinBackoff
	var lastAttempt time.Time
	for g.ctx.Err() == nil {
		lastAttempt = time.Now()
		c, err := g.connect()
		if err != nil {
			if g.ctx.Err() != nil {
				return
			}
			g.mu.Lock()
			g.failures++
			g.lastErr = err
			perm := errors.Is(err, ErrTransportExhausted)
			if perm {
				g.permErr = err
			}
			g.signalLocked()
			g.mu.Unlock()
			if perm {
				g.log.Warn("worker connection cannot be re-established", "err", err)
				return
			}
			if g.failures == 1 || g.failures%20 == 0 {
				g.log.Warn("cannot connect to worker; retrying", "err", err, "attempts", g.failures, "backoff", backoff)
			} else {
				g.log.Debug("cannot connect to worker; retrying", "err", err, "backoff", backoff)
			}
			if !g.sleep(backoff, lastAttempt) {
				return
			}
			backoff = min(backoff*2, g.opts.MaxBackoff)
			continue
		}
		backoff = g.opts.MinBackoff
		g.mu.Lock()
		if g.closed {
			g.mu.Unlock()
			c.wc.Close()
			return
		}
		g.cur = c
		g.signalLocked()
		g.mu.Unlock()
		g.log.Info("connected to worker", "worker", c.hello.Worker)

		if g.opts.PingInterval > 0 {
			g.wg.Add(1)
			go g.keepalive(c)
		}
		cause := c.serve()

		g.mu.Lock()
		if g.cur == c {
			g.cur = nil
			g.signalLocked()
		}
		g.mu.Unlock()
		c.lose(cause)
	}
}

// sleep waits d after last, returning early (but not before MinBackoff
// after last) when a caller is waiting. It reports false when the gateway
// closed.
func (g *Gateway) sleep(d time.Duration, last time.Time) bool {
	t := time.NewTimer(time.Until(last.Add(d)))
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-g.ctx.Done():
		return false
	case <-g.kick:
	}
	if wait := time.Until(last.Add(g.opts.MinBackoff)); wait > 0 {
		t.Reset(wait)
		select {
		case <-t.C:
		case <-g.ctx.Done():
			return false
		}
	}
	return true
}

// connect makes one connection and performs the handshake.
func (g *Gateway) connect() (*conn, error) {
	ctx, cancel := context.WithTimeout(g.ctx, g.opts.HandshakeTimeout)
	defer cancel()
	wc, err := g.transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	// Bound the handshake by ctx; Close (through g.ctx) interrupts it.
	stop := context.AfterFunc(ctx, func() { wc.UnixConn().SetDeadline(time.Unix(1, 0)) })
	h, err := wire.ClientHello(wc)
	if !stop() {
		err = errors.Join(err, ctx.Err())
	}
	if err == nil {
		err = wc.UnixConn().SetDeadline(time.Time{})
	}
	if err != nil {
		wc.Close()
		return nil, fmt.Errorf("machine: worker handshake: %w", err)
	}
	return newConn(g, wc, h), nil
}

// keepalive pings the worker every PingInterval and ends the connection
// when a ping is still unanswered at the next tick.
func (g *Gateway) keepalive(c *conn) {
	defer g.wg.Done()
	t := time.NewTicker(g.opts.PingInterval)
	defer t.Stop()
	var outstanding <-chan struct{}
	for {
		select {
		case <-c.ended:
			return
		case <-t.C:
		}
		if outstanding != nil {
			select {
			case <-outstanding:
			default:
				g.log.Warn("worker did not answer ping; dropping connection", "interval", g.opts.PingInterval)
				c.fail(ErrPingTimeout)
				return
			}
		}
		ch, err := c.ping(g.newID("ping"))
		if err != nil {
			return // the connection is failing; serve notices
		}
		outstanding = ch
	}
}

// Ping sends a ping to the worker and waits for its pong (connecting
// first if needed). It is a health check.
func (g *Gateway) Ping(ctx context.Context) error {
	c, err := g.connection(ctx)
	if err != nil {
		return err
	}
	ch, err := c.ping(g.newID("ping"))
	if err != nil {
		return err
	}
	select {
	case <-ch:
		return nil
	case <-c.lost:
		return c.lossErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (g *Gateway) newID(kind string) string {
	return fmt.Sprintf("%s-%d", kind, g.nextID.Add(1))
}

// Dial connects to port on the loopback of project's machine, through the
// worker (net-dial). The returned connection is the worker's socket; the
// caller closes it. A worker refusal is a *RejectedError (wrapping
// ErrDialFailed when nothing listens, ErrNoMachine when the project has no
// running machine); a lost connection wraps
// ErrInterrupted; ctx bounds the whole call.
func (g *Gateway) Dial(ctx context.Context, p Project, port int) (net.Conn, error) {
	f, err := g.netRequest(ctx, p, port, "dial", "", func(id string, wp wire.Project) wire.Message {
		return &wire.NetDial{ID: id, Project: wp, Port: port}
	})
	if err != nil {
		return nil, err
	}
	defer f.Close()
	nc, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("machine: dial port %d of project %d: %w", port, p.ID, err)
	}
	return nc, nil
}

// Reset discards the state project p's machine keeps between starts: the
// upper layer of its root filesystem (what guest root installed or changed
// outside the workspace and the home), stopping the machine first. The
// worker refuses while the machine has sessions: a *RejectedError
// wrapping ErrBusy. A worker without the extension (wire's
// FeatureMachineReset) makes it an error wrapping ErrUnsupported; a lost
// connection wraps ErrInterrupted; ctx bounds the whole call. Resetting a
// project without a machine or state succeeds.
func (g *Gateway) Reset(ctx context.Context, p Project) error {
	return g.reset(ctx, p, false)
}

// Forget discards everything the worker keeps of deleted project p: what
// Reset discards, and also its home and disk; its id range is freed for
// another project. Errors are Reset's; a worker without wire's
// FeatureProjectForget makes it an error wrapping ErrUnsupported.
func (g *Gateway) Forget(ctx context.Context, p Project) error {
	return g.reset(ctx, p, true)
}

// reset sends a machine-reset, with "forget" if forget.
func (g *Gateway) reset(ctx context.Context, p Project, forget bool) error {
	c, err := g.connection(ctx)
	if err != nil {
		return err
	}
	feature, what := wire.FeatureMachineReset, "reset"
	if forget {
		feature, what = wire.FeatureProjectForget, "forget"
	}
	if !c.hello.Has(feature) {
		return fmt.Errorf("%w: machine %s (feature %q)", ErrUnsupported, what, feature)
	}
	id := g.newID("reset")
	w := c.addDial(id)
	if w == nil {
		return c.lossErr
	}
	if err := c.wc.Send(&wire.MachineReset{ID: id, Project: wire.Project{ID: p.ID, Workspace: p.Workspace}, Forget: forget}); err != nil {
		c.removeDial(id)
		c.fail(err)
		return fmt.Errorf("%w: %w", ErrInterrupted, err)
	}
	select {
	case r := <-w:
		if r.err != nil {
			return fmt.Errorf("machine: %s project %d: %w", what, p.ID, r.err)
		}
		return nil
	case <-ctx.Done():
		c.removeDial(id)
		return ctx.Err()
	}
}

// sortedKeys returns the ids of m, sorted.
func sortedKeys[V any](m map[string]V) []string {
	ids := make([]string, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

func newSessionID() string { return uuid.NewString() }
