package worker

import (
	"errors"
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/wire"
)

// netnsSocket returns a TCP socket created in m's network namespace: on a
// thread that joins the namespace and then returns to the worker's own (a
// socket stays in the namespace it was created in, whatever thread later
// connects, binds or listens with it). If returning fails, the thread
// stays locked and dies with its goroutine.
func (m *machine) netnsSocket() (int, error) {
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
	return r.fd, r.err
}

// dial connects to 127.0.0.1:port in m's network namespace.
func (m *machine) dial(port int) (*os.File, error) {
	fd, err := m.netnsSocket()
	if err != nil {
		return nil, err
	}
	if err := unix.Connect(fd, &unix.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("connect 127.0.0.1:%d: %w", port, err)
	}
	return os.NewFile(uintptr(fd), "net-dial"), nil
}

// netRequest answers a net-dial or a net-listen: it acquires the project's
// machine (starting it if needed), makes the socket with open, and sends it
// on reply, or an error frame {id, code, message}. The worker keeps no copy
// of the descriptor.
func (c *conn) netRequest(id string, p wire.Project, port int, open func(*machine, int) (*os.File, error), reply wire.Message) {
	fail := func(code, format string, args ...any) {
		c.send(&wire.Error{ID: id, Code: code, Message: fmt.Sprintf(format, args...)})
	}
	if port < 1 || port > 65535 {
		fail(wire.CodeDialFailed, "port %d out of range", port)
		return
	}
	mach, err := c.w.acquire(p.ID, p.Workspace, p.Image, false, c.w.resolve(p.Limits))
	if err != nil {
		var r *rejection
		if errors.As(err, &r) {
			fail(r.code, "%s", r.msg)
		} else {
			fail(wire.CodeMachineFailed, "%v", err)
		}
		return
	}
	f, err := open(mach, port)
	mach.release(false)
	if err != nil {
		fail(wire.CodeDialFailed, "%v", err)
		return
	}
	c.send(reply, f)
	f.Close()
}
