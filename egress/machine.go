package egress

import (
	"context"
	"fmt"
	"net"
	"strconv"

	"github.com/corral-sandbox/corral/machine"
)

// Listener makes listeners inside a machine; *machine.Gateway implements
// it (net-listen).
type Listener interface {
	Listen(ctx context.Context, p machine.Project, port int) (net.Listener, error)
}

// Arm asks for the machine's proxy listeners (HTTPPort and SOCKSPort on
// its loopback) through g and serves them in the background until Close,
// which closes them: the descriptors are core's, and they last exactly as
// long as m. The machine must be running (a session started it). On error
// nothing is left open.
func (m *Machine) Arm(ctx context.Context, g Listener, p machine.Project) error {
	hl, err := g.Listen(ctx, p, HTTPPort)
	if err != nil {
		return fmt.Errorf("egress: HTTP proxy listener: %w", err)
	}
	sl, err := g.Listen(ctx, p, SOCKSPort)
	if err != nil {
		hl.Close()
		return fmt.Errorf("egress: SOCKS5 proxy listener: %w", err)
	}
	// Tracked before Arm returns, so that a Close right after it waits
	// for them.
	if !m.track(hl) {
		sl.Close()
		return net.ErrClosed
	}
	if !m.track(sl) {
		m.untrack(hl)
		return net.ErrClosed
	}
	go func() { defer m.untrack(hl); m.serveHTTP(hl) }()
	go func() { defer m.untrack(sl); m.serveSOCKS5(sl) }()
	return nil
}

// Env is the environment of a proxy-mode machine's sessions: the HTTP
// proxy for http and https in both spellings, SOCKS5 for the rest, and no
// proxy for the machine's own loopback.
func Env() map[string]string {
	h := "http://127.0.0.1:" + strconv.Itoa(HTTPPort)
	return map[string]string{
		"HTTP_PROXY": h, "HTTPS_PROXY": h, "http_proxy": h, "https_proxy": h,
		"ALL_PROXY": "socks5h://127.0.0.1:" + strconv.Itoa(SOCKSPort),
		"NO_PROXY":  "localhost,127.0.0.1", "no_proxy": "localhost,127.0.0.1",
	}
}
