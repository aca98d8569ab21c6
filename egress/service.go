package egress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// Resolver resolves host names on the host; *net.Resolver implements it.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Options configure a Service. The zero value is usable: the default floor
// without the host's addresses (NewService adds them), the system
// resolver, the defaults below.
type Options struct {
	// Floor is the operator's floor; nil means NewFloor(nil, true).
	Floor *Floor
	// Resolver resolves names; nil means net.DefaultResolver. Tests inject
	// one to map names to chosen addresses.
	Resolver Resolver
	// DialTimeout bounds resolution plus dialing; 0 means 10s.
	DialTimeout time.Duration
	// IdleTimeout closes a connection with no byte in either direction for
	// that long; 0 means 5 minutes.
	IdleTimeout time.Duration
	// MaxConns bounds a machine's concurrent connections; 0 means 64.
	// Its proxies hold at most twice as many accepted client connections
	// (tunnels and handshakes together); one beyond is closed unserved.
	MaxConns int
	// BytesPerSecond bounds a machine's traffic (both directions of all its
	// connections together); 0 means unlimited.
	BytesPerSecond int
	// Audit receives a Record for every connection attempt, when it is
	// refused or when the connection ends. It must not block for long.
	Audit func(Record)
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Verdicts of a Record.
const (
	VerdictAllowed = "allowed"
	VerdictDenied  = "denied"
	// VerdictFailed: allowed, but resolving or dialing failed.
	VerdictFailed = "failed"
)

// Record is one connection attempt, for the journal.
type Record struct {
	Account, Project int64
	// Protocol is "http", "connect" or "socks5".
	Protocol string
	// Name is the requested host (a name or an address literal).
	Name string
	// Addr is the address dialed, or the one refused ("" when refused by
	// name or when resolution failed).
	Addr    string
	Port    int
	Verdict string
	// Rule is the rule or reason that decided (see Verdict).
	Rule string
	// Error says why a failed attempt failed.
	Error    string
	BytesIn  int64 // from upstream to the machine
	BytesOut int64 // from the machine to upstream
	Start    time.Time
	Duration time.Duration
}

// Service is corral's egress service: per machine, the proxies that serve
// the listeners made in the machine (machine.Gateway.Listen) under the
// machine's policy. Create it with NewService.
type Service struct {
	opts  Options
	floor *Floor
	res   Resolver
	log   *slog.Logger
}

// NewService returns a Service configured by opts.
func NewService(opts Options) (*Service, error) {
	s := &Service{opts: opts, floor: opts.Floor, res: opts.Resolver, log: opts.Logger}
	if s.floor == nil {
		f, err := NewFloor(nil, true)
		if err != nil {
			return nil, err
		}
		s.floor = f
	}
	if s.res == nil {
		s.res = net.DefaultResolver
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.opts.DialTimeout <= 0 {
		s.opts.DialTimeout = 10 * time.Second
	}
	if s.opts.IdleTimeout <= 0 {
		s.opts.IdleTimeout = 5 * time.Minute
	}
	if s.opts.MaxConns <= 0 {
		s.opts.MaxConns = 64
	}
	return s, nil
}

// Machine is one machine's share of the service: its policy, its limits
// and its open connections. Methods are safe for concurrent use.
type Machine struct {
	s                *Service
	account, project int64
	rules            atomic.Pointer[Rules]
	slots            chan struct{}
	clients          chan struct{} // accepted client connections
	limiter          *rate.Limiter // nil: unlimited

	mu        sync.Mutex
	closed    bool
	listeners map[net.Listener]struct{}
	conns     map[*conn]struct{}
	wg        sync.WaitGroup
}

// NewMachine returns the machine of project (owned by account) under
// policy p.
func (s *Service) NewMachine(account, project int64, p Policy) (*Machine, error) {
	m := &Machine{s: s, account: account, project: project,
		slots:     make(chan struct{}, s.opts.MaxConns),
		clients:   make(chan struct{}, 2*s.opts.MaxConns),
		listeners: make(map[net.Listener]struct{}), conns: make(map[*conn]struct{})}
	if bps := s.opts.BytesPerSecond; bps > 0 {
		m.limiter = rate.NewLimiter(rate.Limit(bps), max(bps, 32<<10))
	}
	if err := m.SetPolicy(p); err != nil {
		return nil, err
	}
	return m, nil
}

// SetPolicy replaces the machine's policy; it applies to the next
// connection (open ones keep going). Errors wrap ErrBadPolicy.
func (m *Machine) SetPolicy(p Policy) error {
	r, err := p.Compile()
	if err != nil {
		return err
	}
	m.rules.Store(r)
	return nil
}

// Close closes the machine's listeners and connections and waits for its
// serving goroutines. It is idempotent.
func (m *Machine) Close() error {
	m.mu.Lock()
	m.closed = true
	for ln := range m.listeners {
		ln.Close()
	}
	for c := range m.conns {
		c.Conn.Close()
	}
	m.mu.Unlock()
	m.wg.Wait()
	return nil
}

// track registers ln for Close; false when the machine is closed (ln is
// then closed).
func (m *Machine) track(ln net.Listener) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		ln.Close()
		return false
	}
	m.listeners[ln] = struct{}{}
	m.wg.Add(1)
	return true
}

// bounded is ln whose accepted connections count against m's clients:
// one accepted while they are all taken is closed at once, so that a
// guest opening connections it never uses holds a bounded number of the
// serving process's descriptors.
type bounded struct {
	net.Listener
	m *Machine
}

func (b bounded) Accept() (net.Conn, error) {
	for {
		c, err := b.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case b.m.clients <- struct{}{}:
			return &clientConn{Conn: c, m: b.m}, nil
		default:
			c.Close()
		}
	}
}

// clientConn is an accepted client connection; Close frees its place.
type clientConn struct {
	net.Conn
	m    *Machine
	once sync.Once
}

func (c *clientConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { <-c.m.clients })
	return err
}

func (m *Machine) untrack(ln net.Listener) {
	m.mu.Lock()
	delete(m.listeners, ln)
	m.mu.Unlock()
	ln.Close()
	m.wg.Done()
}

// denied is a refusal: its Verdict and the record already sent.
type denied struct{ v Verdict }

func (d *denied) Error() string { return "egress: denied by " + d.v.Rule }

// IsDenied reports whether err is a policy refusal, and the rule.
func IsDenied(err error) (string, bool) {
	var d *denied
	if errors.As(err, &d) {
		return d.v.Rule, true
	}
	return "", false
}

// open checks a request for host:port against the floor and the policy,
// resolves it on the host, checks every address again and dials the first
// that answers, returning the connection (counted, limited, journaled when
// closed). A refusal is a *denied error (see IsDenied); every attempt is
// journaled.
func (m *Machine) open(ctx context.Context, proto, host string, port int) (net.Conn, error) {
	rec := Record{Account: m.account, Project: m.project, Protocol: proto, Name: host, Port: port, Start: time.Now()}
	deny := func(v Verdict, addr string) error {
		rec.Verdict, rec.Rule, rec.Addr = VerdictDenied, v.Rule, addr
		m.audit(rec)
		return &denied{v}
	}
	fail := func(v Verdict, err error) error {
		rec.Verdict, rec.Rule, rec.Error = VerdictFailed, v.Rule, err.Error()
		m.audit(rec)
		return err
	}
	rules := m.rules.Load()
	if rules.Mode() != ModeProxy {
		return nil, deny(Verdict{Rule: ReasonModeNone}, "")
	}
	if port < 1 || port > 65535 {
		return nil, deny(Verdict{Rule: ReasonBadName}, "")
	}
	var addrs []netip.Addr
	var byName Verdict
	if a, err := netip.ParseAddr(host); err == nil && a.Zone() == "" {
		addrs = []netip.Addr{a.Unmap()}
	} else {
		name, ok := normalizeName(host)
		if !ok {
			return nil, deny(Verdict{Rule: ReasonBadName}, "")
		}
		rec.Name = name
		byName = rules.CheckName(name, port)
		if !byName.Allowed {
			return nil, deny(byName, "")
		}
		ctx, cancel := context.WithTimeout(ctx, m.s.opts.DialTimeout)
		addrs, err = m.s.res.LookupNetIP(ctx, "ip", name)
		cancel()
		if err == nil && len(addrs) == 0 {
			err = fmt.Errorf("no address for %s", name)
		}
		if err != nil {
			return nil, fail(byName, fmt.Errorf("resolve %s: %w", name, err))
		}
	}
	// Every address must pass: one that does not means the name points
	// somewhere it must not (DNS rebinding onto the floor, say).
	var v Verdict
	for i, a := range addrs {
		a = a.Unmap()
		addrs[i] = a
		if m.s.floor.Blocks(a) {
			return nil, deny(Verdict{Rule: ReasonFloor}, a.String())
		}
		if v = rules.CheckAddr(a, port, byName); !v.Allowed {
			return nil, deny(v, a.String())
		}
	}
	select {
	case m.slots <- struct{}{}:
	default:
		return nil, deny(Verdict{Rule: fmt.Sprintf("limit: %d connections", cap(m.slots))}, "")
	}
	ctx, cancel := context.WithTimeout(ctx, m.s.opts.DialTimeout)
	defer cancel()
	var d net.Dialer
	var lastErr error
	for _, a := range addrs {
		// The checked address, never the name: no second resolution.
		nc, err := d.DialContext(ctx, "tcp", net.JoinHostPort(a.String(), strconv.Itoa(port)))
		if err != nil {
			lastErr = err
			continue
		}
		rec.Verdict, rec.Rule, rec.Addr = VerdictAllowed, v.Rule, a.String()
		c := &conn{Conn: nc, m: m, rec: rec, idle: m.s.opts.IdleTimeout}
		c.touch()
		m.mu.Lock()
		if m.closed {
			m.mu.Unlock()
			nc.Close()
			<-m.slots
			return nil, fail(v, errors.New("machine stopped"))
		}
		m.conns[c] = struct{}{}
		m.mu.Unlock()
		return c, nil
	}
	<-m.slots
	rec.Addr = addrs[len(addrs)-1].String()
	return nil, fail(v, lastErr)
}

func (m *Machine) audit(r Record) {
	if r.Duration == 0 && r.Verdict != VerdictAllowed {
		r.Duration = time.Since(r.Start)
	}
	if m.s.opts.Audit != nil {
		m.s.opts.Audit(r)
	}
	m.s.log.Debug("egress", "project", r.Project, "protocol", r.Protocol, "name", r.Name, "addr", r.Addr,
		"port", r.Port, "verdict", r.Verdict, "rule", r.Rule, "in", r.BytesIn, "out", r.BytesOut)
}

// conn is an upstream connection: it counts bytes, spends the machine's
// rate budget, enforces the idle timeout, and journals itself when closed.
type conn struct {
	net.Conn
	m        *Machine
	rec      Record
	idle     time.Duration
	in, out  atomic.Int64
	last     atomic.Int64 // unix nanoseconds of the last byte
	closeOne sync.Once
}

func (c *conn) touch() { c.last.Store(time.Now().UnixNano()) }

func (c *conn) idleFor() time.Duration { return time.Duration(time.Now().UnixNano() - c.last.Load()) }

func (c *conn) wait(n int) error {
	l := c.m.limiter
	if l == nil {
		return nil
	}
	for n > 0 {
		k := min(n, l.Burst())
		if err := l.WaitN(context.Background(), k); err != nil {
			return err
		}
		n -= k
	}
	return nil
}

func (c *conn) Read(b []byte) (int, error) {
	if l := c.m.limiter; l != nil && len(b) > l.Burst() {
		b = b[:l.Burst()]
	}
	for {
		c.Conn.SetReadDeadline(time.Now().Add(c.idle))
		n, err := c.Conn.Read(b)
		if n > 0 {
			c.touch()
			c.in.Add(int64(n))
			if werr := c.wait(n); werr != nil && err == nil {
				err = werr
			}
			return n, err
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() && c.idleFor() < c.idle {
			continue // the other direction is busy
		}
		return n, err
	}
}

func (c *conn) Write(b []byte) (int, error) {
	if err := c.wait(len(b)); err != nil {
		return 0, err
	}
	c.Conn.SetWriteDeadline(time.Now().Add(c.idle))
	n, err := c.Conn.Write(b)
	if n > 0 {
		c.touch()
		c.out.Add(int64(n))
	}
	return n, err
}

// CloseWrite half-closes the upstream (a tunnel whose client finished
// sending).
func (c *conn) CloseWrite() error {
	if hc, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return hc.CloseWrite()
	}
	return nil
}

// CloseRead is CloseWrite's counterpart.
func (c *conn) CloseRead() error {
	if hc, ok := c.Conn.(interface{ CloseRead() error }); ok {
		return hc.CloseRead()
	}
	return nil
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.closeOne.Do(func() {
		m := c.m
		m.mu.Lock()
		delete(m.conns, c)
		m.mu.Unlock()
		<-m.slots
		r := c.rec
		r.BytesIn, r.BytesOut, r.Duration = c.in.Load(), c.out.Load(), time.Since(r.Start)
		m.audit(r)
	})
	return err
}

// spliceChunk is how much one splice may move before the idle deadline is
// renewed and the counters updated.
const spliceChunk = 4 << 20

// WriteTo copies from the upstream to w (io.Copy's fast path). Without a
// rate limit, and when w is a TCP connection, the kernel moves the bytes
// (splice), chunk by chunk, each under the idle deadline.
func (c *conn) WriteTo(w io.Writer) (int64, error) {
	rf, ok := w.(io.ReaderFrom)
	tc, tcp := c.Conn.(*net.TCPConn)
	if _, wtcp := w.(*net.TCPConn); c.m.limiter != nil || !ok || !tcp || !wtcp {
		return io.Copy(w, struct{ io.Reader }{c})
	}
	var total int64
	for {
		tc.SetReadDeadline(time.Now().Add(c.idle))
		n, err := rf.ReadFrom(&io.LimitedReader{R: tc, N: spliceChunk})
		total += n
		if n > 0 {
			c.touch()
			c.in.Add(n)
		}
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && c.idleFor() < c.idle {
				continue
			}
			return total, err
		}
		if n < spliceChunk {
			return total, nil // end of stream
		}
	}
}

// ReadFrom copies from r to the upstream (io.Copy's fast path), spliced
// when r is a TCP connection and there is no rate limit.
func (c *conn) ReadFrom(r io.Reader) (int64, error) {
	tc, tcp := c.Conn.(*net.TCPConn)
	if _, rtcp := r.(*net.TCPConn); c.m.limiter != nil || !tcp || !rtcp {
		return io.Copy(struct{ io.Writer }{c}, r)
	}
	var total int64
	for {
		tc.SetWriteDeadline(time.Now().Add(c.idle))
		n, err := tc.ReadFrom(&io.LimitedReader{R: r, N: spliceChunk})
		total += n
		if n > 0 {
			c.touch()
			c.out.Add(n)
		}
		if err != nil || n < spliceChunk {
			return total, err
		}
	}
}
