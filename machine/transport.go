package machine

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"

	"github.com/corral-sandbox/corral/wire"
)

// PrivilegedTransport gives the gateway connections to the privileged
// worker. It is handed to the gateway explicitly: nothing in corral
// discovers the worker on its own.
type PrivilegedTransport interface {
	// Connect returns a new, connected protocol-2 connection to the worker,
	// before the handshake (the gateway performs it). It must honour ctx.
	// An error wrapping ErrTransportExhausted means no connection will ever
	// be available again; the gateway then stops reconnecting.
	Connect(ctx context.Context) (*wire.Conn, error)
}

// ErrTransportExhausted is returned (wrapped) by a transport that can never
// provide another connection, such as a ConnTransport whose one inherited
// connection has been handed out.
var ErrTransportExhausted = errors.New("machine: privileged transport can provide no further connection")

// SocketTransport dials the worker's "unixpacket" socket at Path for every
// connection. The zero value has no path and fails to connect.
type SocketTransport struct {
	Path string
}

// Connect dials Path.
func (t SocketTransport) Connect(ctx context.Context) (*wire.Conn, error) {
	if t.Path == "" {
		return nil, errors.New("machine: SocketTransport without a path")
	}
	return wire.Dial(ctx, t.Path)
}

// ConnTransport wraps one already-connected socket to the worker, such as
// the one a delegated runner process inherits. It cannot reconnect: the
// first Connect returns the connection, every later one fails with
// ErrTransportExhausted, so losing that connection is final for the
// gateway. Create it with NewConnTransport or ConnTransportFromFile.
type ConnTransport struct {
	mu   sync.Mutex
	conn *net.UnixConn
}

// NewConnTransport returns a transport over c, a connected "unixpacket"
// socket, and takes ownership of c.
func NewConnTransport(c *net.UnixConn) *ConnTransport {
	return &ConnTransport{conn: c}
}

// ConnTransportFromFile returns a transport over the connected
// SOCK_SEQPACKET socket f (for example an inherited descriptor opened with
// os.NewFile). f is closed in every case; the transport holds its own copy.
func ConnTransportFromFile(f *os.File) (*ConnTransport, error) {
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("machine: inherited worker connection: %w", err)
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		c.Close()
		return nil, fmt.Errorf("machine: inherited worker connection is %T, not a Unix socket", c)
	}
	st, err := sockType(uc)
	if err != nil {
		uc.Close()
		return nil, fmt.Errorf("machine: inherited worker connection: %w", err)
	}
	if st != "unixpacket" {
		uc.Close()
		return nil, fmt.Errorf("machine: inherited worker connection is a %s socket, want unixpacket", st)
	}
	return NewConnTransport(uc), nil
}

// Connect returns the wrapped connection the first time and an error
// wrapping ErrTransportExhausted afterwards.
func (t *ConnTransport) Connect(ctx context.Context) (*wire.Conn, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.conn == nil {
		return nil, fmt.Errorf("%w: the inherited worker connection was already used", ErrTransportExhausted)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c := t.conn
	t.conn = nil
	return wire.NewConn(c), nil
}

// Dial connects to the worker's "unixpacket" socket at path, with no
// handshake: the connection is for a Gateway's transport (see
// NewConnTransport), which makes it, or to hand to a process that makes
// its own.
func Dial(ctx context.Context, path string) (*net.UnixConn, error) {
	c, err := wire.Dial(ctx, path)
	if err != nil {
		return nil, fmt.Errorf("machine: %w", err)
	}
	return c.UnixConn(), nil
}

// Handshake dials the worker's socket at path and runs protocol 2's
// handshake on it, then closes the connection: it reports whether a
// worker serves there (a launcher's readiness check). ctx bounds it.
func Handshake(ctx context.Context, path string) error {
	c, err := wire.Dial(ctx, path)
	if err != nil {
		return fmt.Errorf("machine: %w", err)
	}
	defer c.Close()
	if d, ok := ctx.Deadline(); ok {
		_ = c.UnixConn().SetDeadline(d)
	}
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	if _, err := wire.ClientHello(c); err != nil {
		return fmt.Errorf("machine: handshake with the worker at %s: %w", path, err)
	}
	return nil
}
