package egress

import (
	"fmt"
	"net"
	"net/netip"
)

// Floor is the operator's address floor: ranges no project's policy can
// reach, minus the ranges the operator opened. Its methods are safe for
// concurrent use; it is not modified after NewFloor.
type Floor struct {
	blocked []netip.Prefix
	open    []netip.Prefix
}

// DefaultBlocked are the ranges the floor refuses by default: "this"
// network, loopback, the private ranges, CGNAT (and Alibaba's metadata
// address in it), link-local (the cloud metadata address 169.254.169.254
// in it), IETF protocol assignments, documentation and benchmarking
// ranges, multicast and reserved space, and their IPv6 counterparts (the
// unique-local range holds AWS's fd00:ec2::254). IPv4-mapped IPv6
// addresses are checked as IPv4.
var DefaultBlocked = []string{
	"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
	"172.16.0.0/12", "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "192.168.0.0/16",
	"198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4",
	"::/128", "::1/128", "64:ff9b::/96", "64:ff9b:1::/48", "100::/64", "2001::/23", "2001:db8::/32",
	"2002::/16", "fc00::/7", "fe80::/10", "fec0::/10", "ff00::/8",
}

// NewFloor returns the default floor plus the host's own addresses (when
// hostAddrs is set), with the open CIDRs (the operator's
// --egress-allow-cidr) taken out of it.
func NewFloor(open []string, hostAddrs bool) (*Floor, error) {
	f := &Floor{}
	for _, s := range DefaultBlocked {
		f.blocked = append(f.blocked, netip.MustParsePrefix(s))
	}
	if hostAddrs {
		addrs, err := net.InterfaceAddrs()
		if err != nil {
			return nil, fmt.Errorf("egress: host addresses: %w", err)
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(n.IP); ok {
					ip = ip.Unmap()
					f.blocked = append(f.blocked, netip.PrefixFrom(ip, ip.BitLen()))
				}
			}
		}
	}
	for _, s := range open {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("egress: allow-cidr %q: %w", s, err)
		}
		f.open = append(f.open, p.Masked())
	}
	return f, nil
}

// Blocks reports whether the floor refuses a (an unspecified or invalid
// address is always refused).
func (f *Floor) Blocks(a netip.Addr) bool {
	a = a.Unmap()
	if !a.IsValid() || a.IsUnspecified() {
		return true
	}
	for _, p := range f.open {
		if p.Contains(a) {
			return false
		}
	}
	for _, p := range f.blocked {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
