package worker

import (
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// dial connects to 127.0.0.1:port in m's network namespace. The socket is
// created on a thread that has joined the namespace and then returns to
// the worker's own (a socket stays in the namespace it was created in);
// if returning fails, the thread stays locked and dies with its goroutine.
func (m *machine) dial(port int) (*os.File, error) {
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
	if err := unix.Connect(r.fd, &unix.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		unix.Close(r.fd)
		return nil, fmt.Errorf("connect 127.0.0.1:%d: %w", port, err)
	}
	return os.NewFile(uintptr(r.fd), "net-dial"), nil
}
