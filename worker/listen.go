package worker

import (
	"errors"
	"fmt"
	"os"
	"runtime"

	"github.com/corral-sandbox/corral/wire"
	"golang.org/x/sys/unix"
)

// listenBacklog is the accept queue of a net-listen socket.
const listenBacklog = 128

// listen returns a TCP socket listening on 127.0.0.1:port in m's network
// namespace (net-listen). Like dial, the socket is created on a thread that
// has joined the namespace and then returns to the worker's own; bind and
// listen act on the socket, wherever the calling thread is. The worker keeps
// no copy: the caller sends the descriptor and closes its own.
func (m *machine) listen(port int) (*os.File, error) {
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
	// SO_REUSEADDR: a listener closed a moment ago (a machine whose proxy
	// was just re-armed) leaves TIME_WAIT connections on the port.
	if err := unix.SetsockoptInt(r.fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
		unix.Close(r.fd)
		return nil, fmt.Errorf("setsockopt: %w", err)
	}
	if err := unix.Bind(r.fd, &unix.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		unix.Close(r.fd)
		return nil, fmt.Errorf("bind 127.0.0.1:%d: %w", port, err)
	}
	if err := unix.Listen(r.fd, listenBacklog); err != nil {
		unix.Close(r.fd)
		return nil, fmt.Errorf("listen 127.0.0.1:%d: %w", port, err)
	}
	return os.NewFile(uintptr(r.fd), "net-listen"), nil
}

// netListen answers a net-listen: a listening socket inside the project's
// running machine, or an error frame. It never starts a machine.
func (c *conn) netListen(m *wire.NetListen) {
	fail := func(code, format string, args ...any) {
		c.send(&wire.Error{ID: m.ID, Code: code, Message: fmt.Sprintf(format, args...)})
	}
	if m.Port < 1 || m.Port > 65535 {
		fail(wire.CodeDialFailed, "port %d out of range", m.Port)
		return
	}
	mach, err := c.w.acquire(m.Project.ID, m.Project.Workspace, m.Project.Image, false, c.w.resolve(m.Project.Limits))
	if err != nil {
		var r *rejection
		if errors.As(err, &r) {
			fail(r.code, "%s", r.msg)
		} else {
			fail(wire.CodeMachineFailed, "%v", err)
		}
		return
	}
	f, err := mach.listen(m.Port)
	mach.release(false)
	if err != nil {
		fail(wire.CodeDialFailed, "%v", err)
		return
	}
	c.send(&wire.NetListening{ID: m.ID}, f)
	f.Close()
}
