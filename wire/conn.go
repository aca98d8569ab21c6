package wire

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// oobFDs is how many descriptors the receive buffer has room for: more than
// any message carries, so that a packet with too many descriptors is seen
// (and its descriptors closed) rather than cut by the kernel.
const oobFDs = 16

// Conn is one protocol-2 connection over a connected SOCK_SEQPACKET Unix
// socket. Send is safe for concurrent use; Recv must be called from one
// goroutine at a time, concurrently with Send. Close may be called at any
// time and unblocks a pending Recv (which then returns an error wrapping
// net.ErrClosed).
type Conn struct {
	uc     *net.UnixConn
	sendMu sync.Mutex
	recvMu sync.Mutex
	// buf and oob receive packets; guarded by recvMu, made on first use.
	buf []byte
	oob []byte
}

// NewConn returns a Conn over c, which must be a connected "unixpacket"
// socket. The Conn takes ownership of c.
func NewConn(c *net.UnixConn) *Conn {
	return &Conn{uc: c}
}

// Dial connects to the "unixpacket" socket at path. It performs no
// handshake; see ClientHello.
func Dial(ctx context.Context, path string) (*Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unixpacket", path)
	if err != nil {
		return nil, fmt.Errorf("wire: dial %s: %w", path, err)
	}
	return NewConn(c.(*net.UnixConn)), nil
}

// Listen creates a "unixpacket" listener at path, replacing a stale socket
// file left there by a previous listener (any other kind of file is an
// error), and sets the socket's mode to 0600. Between bind and chmod the
// socket has the mode the umask gives it, so path's directory should not be
// writable by others. Closing the listener removes the socket file.
func Listen(path string) (*net.UnixListener, error) {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != os.ModeSocket {
			return nil, fmt.Errorf("wire: listen %s: exists and is not a socket", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("wire: listen %s: remove stale socket: %w", path, err)
		}
	}
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("wire: listen: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("wire: listen %s: %w", path, err)
	}
	return l, nil
}

// UnixConn returns the underlying socket, for deadlines and credentials.
// Reading or writing it directly breaks the framing.
func (c *Conn) UnixConn() *net.UnixConn { return c.uc }

// Close closes the connection. Descriptors queued on it but not yet received
// are released by the kernel.
func (c *Conn) Close() error { return c.uc.Close() }

// Send encodes m and sends it as one packet with files attached as
// SCM_RIGHTS. len(files) must equal FDCount(m). Send does not close files;
// the caller may close them as soon as Send returns, since the peer then
// holds its own references. Encoding errors are *ProtocolError and nothing
// is sent.
func (c *Conn) Send(m Message, files ...*os.File) error {
	b, err := Encode(m)
	if err != nil {
		return err
	}
	if want := FDCount(m); len(files) != want {
		return fmt.Errorf("wire: send %s: %d files, want %d", m.Type(), len(files), want)
	}
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	err = withFDs(files, make([]int, 0, len(files)), func(fds []int) error {
		return c.write(b, rights(fds))
	})
	if err != nil {
		return fmt.Errorf("wire: send %s: %w", m.Type(), err)
	}
	return nil
}

// rights is the control message carrying fds (none for none).
func rights(fds []int) []byte {
	if len(fds) == 0 {
		return nil
	}
	return unix.UnixRights(fds...)
}

// write sends one packet; the caller holds sendMu.
func (c *Conn) write(b, oob []byte) error {
	n, oobn, err := c.uc.WriteMsgUnix(b, oob, nil)
	if err == nil && (n != len(b) || oobn != len(oob)) {
		err = io.ErrShortWrite
	}
	return err
}

// SendFDs is Send with descriptor numbers instead of files; the caller
// keeps them open until SendFDs returns (and closes them when it likes).
func (c *Conn) SendFDs(m Message, fds ...int) error {
	b, err := Encode(m)
	if err != nil {
		return err
	}
	if want := FDCount(m); len(fds) != want {
		return fmt.Errorf("wire: send %s: %d descriptors, want %d", m.Type(), len(fds), want)
	}
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	if err := c.write(b, rights(fds)); err != nil {
		return fmt.Errorf("wire: send %s: %w", m.Type(), err)
	}
	return nil
}

// SendTimeout is Send for a sender that must not wait long for a peer that
// does not read: when the socket's buffer is full, it waits at most d for
// room, then fails with an error wrapping os.ErrDeadlineExceeded (the frame
// was not sent). A frame that fits at once is sent without setting a
// deadline, which spares the runtime a timer per frame. SendTimeout
// overrides any write deadline set on the socket.
func (c *Conn) SendTimeout(d time.Duration, m Message, files ...*os.File) error {
	b, err := Encode(m)
	if err != nil {
		return err
	}
	if want := FDCount(m); len(files) != want {
		return fmt.Errorf("wire: send %s: %d files, want %d", m.Type(), len(files), want)
	}
	rc, err := c.uc.SyscallConn()
	if err != nil {
		return fmt.Errorf("wire: send %s: %w", m.Type(), err)
	}
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	err = withFDs(files, make([]int, 0, len(files)), func(fds []int) error {
		oob := rights(fds)
		var serr error
		if err := rc.Write(func(fd uintptr) bool {
			for {
				serr = unix.Sendmsg(int(fd), b, oob, nil, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
				if serr != unix.EINTR {
					return true // one attempt: no waiting here
				}
			}
		}); err != nil {
			return err
		}
		if serr != unix.EAGAIN {
			return serr
		}
		if err := c.uc.SetWriteDeadline(time.Now().Add(d)); err != nil {
			return err
		}
		defer c.uc.SetWriteDeadline(time.Time{})
		return c.write(b, oob)
	})
	if err != nil {
		return fmt.Errorf("wire: send %s: %w", m.Type(), err)
	}
	return nil
}

// withFDs calls fn with the descriptors of files, holding each file's
// descriptor open (and without switching it to blocking mode, as File.Fd
// would) for the duration of fn.
func withFDs(files []*os.File, fds []int, fn func([]int) error) error {
	if len(files) == 0 {
		return fn(fds)
	}
	if files[0] == nil {
		return errors.New("nil file")
	}
	rc, err := files[0].SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) {
		ferr = withFDs(files[1:], append(fds, int(fd)), fn)
	}); err != nil {
		return err
	}
	return ferr
}

// Recv receives one packet and decodes it. It receives the packet with
// MSG_CMSG_CLOEXEC and MSG_TRUNC, which also gives the full length of a
// packet longer than MaxFrame. The returned files are the packet's
// descriptors in order, FDCount of the message; the caller owns them.
//
// On any error every descriptor received with the packet is closed and no
// file is returned. A protocol violation (too large, fd count mismatch, bad
// JSON, unknown type, bad field) is a *ProtocolError and the packet has been
// consumed; the protocol then requires answering an error frame (see
// ProtocolError.Frame) and closing the connection. When the peer has closed
// the connection Recv returns io.EOF. Other errors are I/O errors from the
// socket.
func (c *Conn) Recv() (Message, []*os.File, error) {
	m, fds, err := c.RecvFDs()
	if err != nil {
		return nil, nil, err
	}
	if len(fds) == 0 {
		return m, nil, nil
	}
	files := make([]*os.File, len(fds))
	for i, fd := range fds {
		files[i] = os.NewFile(uintptr(fd), fmt.Sprintf("wire:%s[%d]", m.Type(), i))
	}
	return m, files, nil
}

// RecvFDs is Recv returning the packet's descriptors as descriptor numbers
// (close-on-exec), which the caller owns and must close. It suits a caller
// that passes them on: wrapping each in an *os.File costs a system call.
func (c *Conn) RecvFDs() (Message, []int, error) {
	c.recvMu.Lock()
	defer c.recvMu.Unlock()
	b, fds, err := c.recvPacket()
	if err != nil {
		closeFDs(fds)
		return nil, nil, err
	}
	m, err := Decode(b, len(fds))
	if err != nil {
		closeFDs(fds)
		return nil, nil, err
	}
	return m, fds, nil
}

// recvPacket reads one packet into c's buffer (valid until the next call).
// The descriptors it returns must be closed by the caller, also when err
// != nil.
//
// One recvmsg with MSG_TRUNC both receives a packet of up to MaxFrame
// bytes and learns the full length of a longer one (which it consumes with
// its descriptors, as a protocol error) — what peeking with
// MSG_PEEK|MSG_TRUNC first would tell, in one system call instead of two.
func (c *Conn) recvPacket() (b []byte, fds []int, err error) {
	rc, err := c.uc.SyscallConn()
	if err != nil {
		return nil, nil, fmt.Errorf("wire: recv: %w", err)
	}
	if c.buf == nil {
		c.buf = make([]byte, MaxFrame)
		c.oob = make([]byte, unix.CmsgSpace(oobFDs*4))
	}
	var size, oobn, flags int
	var opErr error
	err = rc.Read(func(fd uintptr) bool {
		for {
			var rerr error
			size, oobn, flags, _, rerr = unix.Recvmsg(int(fd), c.buf, c.oob, unix.MSG_CMSG_CLOEXEC|unix.MSG_TRUNC)
			switch {
			case rerr == nil:
				return true
			case errors.Is(rerr, unix.EINTR):
				continue
			case errors.Is(rerr, unix.EAGAIN):
				return false
			}
			opErr = rerr
			return true
		}
	})
	if err == nil {
		err = opErr
	}
	if err != nil {
		return nil, nil, fmt.Errorf("wire: recv: %w", err)
	}
	fds, perr := ParseRights(c.oob[:oobn])
	if size == 0 {
		// The peer closed the connection (a zero-length packet, which no
		// valid frame is, reads the same and ends the connection too).
		return nil, fds, io.EOF
	}
	if perr != nil {
		return nil, fds, protoErr(CodeFDMismatch, "bad control message: %v", perr)
	}
	if flags&unix.MSG_CTRUNC != 0 {
		return nil, fds, protoErr(CodeFDMismatch, "packet carried more than %d descriptors", oobFDs)
	}
	if size > MaxFrame {
		return nil, fds, protoErr(CodeTooLarge, "packet is %d bytes, limit %d", size, MaxFrame)
	}
	if flags&unix.MSG_TRUNC != 0 {
		return nil, fds, protoErr(CodeBadFrame, "packet truncated: read %d bytes", size)
	}
	return c.buf[:size], fds, nil
}

// ParseRights returns every descriptor in the SCM_RIGHTS messages of oob
// (the control data of one recvmsg): the one parser of passed descriptors,
// for this package's frames and the worker's packets to its machines. On
// error it still returns the descriptors it found, which the caller must
// close.
func ParseRights(oob []byte) ([]int, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	var firstErr error
	for i := range msgs {
		if msgs[i].Header.Level != unix.SOL_SOCKET || msgs[i].Header.Type != unix.SCM_RIGHTS {
			continue
		}
		got, err := unix.ParseUnixRights(&msgs[i])
		if err != nil && firstErr == nil {
			firstErr = err
		}
		fds = append(fds, got...)
	}
	return fds, firstErr
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// ClientHello performs the client's side of the handshake on a new
// connection: it sends hello{protocol:2} and waits for the worker's hello.
// When the worker answers with an error frame, or with a hello of another
// protocol, the error is a *ProtocolError (code "unsupported-protocol" for
// a version refusal). The caller closes c on error.
func ClientHello(c *Conn) (*Hello, error) {
	if err := c.Send(&Hello{Protocol: Protocol}); err != nil {
		return nil, err
	}
	m, files, err := c.Recv()
	if err != nil {
		return nil, fmt.Errorf("wire: handshake: %w", err)
	}
	closeFiles(files)
	switch m := m.(type) {
	case *Hello:
		if m.Protocol != Protocol {
			return nil, protoErr(CodeUnsupportedProtocol, "worker speaks protocol %d, want %d", m.Protocol, Protocol)
		}
		return m, nil
	case *Error:
		return nil, &ProtocolError{Code: m.Code, Message: m.Message}
	default:
		return nil, protoErr(CodeBadFrame, "handshake: got %s, want hello", m.Type())
	}
}

// ServerHello performs the worker's side of the handshake: it reads the
// first frame and, if it is hello{protocol:2}, answers hello{protocol:2,
// worker, features}. Otherwise it sends an error frame — "unsupported-protocol" for
// another protocol version, "bad-frame" for a first frame that is not a
// hello, the violation's code for an invalid frame — and returns a
// *ProtocolError (or the I/O error); the caller then closes c.
func ServerHello(c *Conn, worker string, features ...string) error {
	m, files, err := c.Recv()
	if err != nil {
		var pe *ProtocolError
		if errors.As(err, &pe) {
			_ = c.Send(pe.Frame())
		}
		return fmt.Errorf("wire: handshake: %w", err)
	}
	closeFiles(files)
	h, ok := m.(*Hello)
	if !ok {
		pe := protoErr(CodeBadFrame, "first frame is %s, want hello", m.Type())
		_ = c.Send(pe.Frame())
		return pe
	}
	if h.Protocol != Protocol {
		pe := protoErr(CodeUnsupportedProtocol, "protocol %d is not supported, this worker speaks %d", h.Protocol, Protocol)
		_ = c.Send(pe.Frame())
		return pe
	}
	return c.Send(&Hello{Protocol: Protocol, Worker: worker, Features: features})
}

func closeFiles(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}
