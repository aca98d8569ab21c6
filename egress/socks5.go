package egress

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"
)

// SOCKS5 (RFC 1928), the subset a proxy without authentication serves:
// method 0 (no authentication) and the CONNECT command, to an IPv4, IPv6
// or domain address. No maintained SOCKS5 server library is served by the
// module proxy (github.com/things-go/go-socks5 is not), so this is written
// here, small.
const (
	socksVersion = 5
	socksNoAuth  = 0
	socksNoMeth  = 0xff
	socksConnect = 1

	socksOK            = 0
	socksFailure       = 1
	socksNotAllowed    = 2
	socksHostUnreach   = 4
	socksRefused       = 5
	socksCmdNotSupport = 7
	socksAtypNotSupp   = 8
)

// ServeSOCKS5 serves a SOCKS5 proxy on ln for m (CONNECT only, no
// authentication), each request checked against m's policy. A refusal is
// answered with reply 2, "connection not allowed by ruleset". It returns
// when ln is closed, closing ln.
func (m *Machine) ServeSOCKS5(ln net.Listener) error {
	if !m.track(ln) {
		return net.ErrClosed
	}
	defer m.untrack(ln)
	return m.serveSOCKS5(ln)
}

// serveSOCKS5 is ServeSOCKS5 for a tracked listener.
func (m *Machine) serveSOCKS5(ln net.Listener) error {
	ln = bounded{ln, m}
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.socks(c)
		}()
	}
}

// socks serves one SOCKS5 client connection.
func (m *Machine) socks(client net.Conn) {
	defer client.Close()
	// The handshake must finish promptly; the tunnel then has the idle
	// timeout of the upstream connection.
	client.SetDeadline(time.Now().Add(30 * time.Second))
	var hdr [2]byte
	if _, err := io.ReadFull(client, hdr[:]); err != nil || hdr[0] != socksVersion {
		return
	}
	methods := make([]byte, hdr[1])
	if _, err := io.ReadFull(client, methods); err != nil {
		return
	}
	method := byte(socksNoMeth)
	for _, x := range methods {
		if x == socksNoAuth {
			method = socksNoAuth
		}
	}
	if _, err := client.Write([]byte{socksVersion, method}); err != nil || method == socksNoMeth {
		return
	}
	var req [4]byte
	if _, err := io.ReadFull(client, req[:]); err != nil || req[0] != socksVersion {
		return
	}
	var host string
	switch req[3] {
	case 1, 4:
		b := make([]byte, 4)
		if req[3] == 4 {
			b = make([]byte, 16)
		}
		if _, err := io.ReadFull(client, b); err != nil {
			return
		}
		a, _ := netip.AddrFromSlice(b)
		host = a.Unmap().String()
	case 3:
		var n [1]byte
		if _, err := io.ReadFull(client, n[:]); err != nil {
			return
		}
		b := make([]byte, n[0])
		if _, err := io.ReadFull(client, b); err != nil {
			return
		}
		host = string(b)
	default:
		socksReply(client, socksAtypNotSupp)
		return
	}
	var pb [2]byte
	if _, err := io.ReadFull(client, pb[:]); err != nil {
		return
	}
	if req[1] != socksConnect {
		socksReply(client, socksCmdNotSupport)
		return
	}
	port := int(binary.BigEndian.Uint16(pb[:]))
	up, err := m.open(context.Background(), "socks5", host, port)
	if err != nil {
		code := byte(socksHostUnreach)
		var oe *net.OpError
		switch {
		case isDenied(err):
			code = socksNotAllowed
		case errors.As(err, &oe):
			code = socksRefused
		}
		socksReply(client, code)
		return
	}
	defer up.Close()
	if err := socksReply(client, socksOK); err != nil {
		return
	}
	client.SetDeadline(time.Time{})
	relay(client, up)
}

func isDenied(err error) bool { _, ok := IsDenied(err); return ok }

// socksReply sends a reply with a zero bound address (clients do not use
// it for CONNECT through a proxy that dials on their behalf).
func socksReply(c net.Conn, code byte) error {
	_, err := c.Write([]byte{socksVersion, code, 0, 1, 0, 0, 0, 0, 0, 0})
	return err
}

// relay copies both ways until both directions end, half-closing as each
// one does; the upstream's idle timeout ends a silent tunnel.
func relay(client net.Conn, up net.Conn) {
	done := make(chan struct{}, 2)
	go func() {
		io.Copy(up, client)
		if hc, ok := up.(interface{ CloseWrite() error }); ok {
			hc.CloseWrite()
		}
		done <- struct{}{}
	}()
	go func() {
		_, err := io.Copy(client, up)
		if hc, ok := client.(interface{ CloseWrite() error }); ok && err == nil {
			hc.CloseWrite()
		} else {
			client.Close() // an idle or failed upstream ends the tunnel
		}
		done <- struct{}{}
	}()
	<-done
	<-done
}
