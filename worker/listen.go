package worker

import (
	"fmt"
	"os"

	"github.com/corral-sandbox/corral/wire"
	"golang.org/x/sys/unix"
)

// listenBacklog is the accept queue of a net-listen socket.
const listenBacklog = 128

// listen returns a TCP socket listening on 127.0.0.1:port in m's network
// namespace (net-listen); see netnsSocket.
func (m *machine) listen(port int) (*os.File, error) {
	fd, err := m.netnsSocket()
	if err != nil {
		return nil, err
	}
	// SO_REUSEADDR: a listener closed a moment ago (a machine whose proxy
	// was just re-armed) leaves TIME_WAIT connections on the port.
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("setsockopt: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("bind 127.0.0.1:%d: %w", port, err)
	}
	if err := unix.Listen(fd, listenBacklog); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("listen 127.0.0.1:%d: %w", port, err)
	}
	return os.NewFile(uintptr(fd), "net-listen"), nil
}

// netListen answers a net-listen: a listening socket inside the project's
// machine (started if needed, as for net-dial), or an error frame.
func (c *conn) netListen(m *wire.NetListen) {
	c.netRequest(m.ID, m.Project, m.Port, (*machine).listen, &wire.NetListening{ID: m.ID})
}
