package projects

import (
	"net/netip"
	"testing"
)

func TestPublicAddr(t *testing.T) {
	for _, tc := range []struct {
		addr string
		want bool
	}{
		{"140.82.112.3", true}, {"2606:4700::1111", true}, {"8.8.8.8", true},
		{"127.0.0.1", false}, {"127.1.2.3", false}, {"::1", false}, {"::ffff:127.0.0.1", false},
		{"10.1.2.3", false}, {"172.16.0.1", false}, {"192.168.1.1", false}, {"fd00::1", false},
		{"169.254.169.254", false}, {"fd00:ec2::254", false}, {"fe80::1", false},
		{"100.64.0.1", false}, {"0.0.0.0", false}, {"::", false}, {"0.1.2.3", false},
		{"224.0.0.1", false}, {"255.255.255.255", false}, {"198.18.0.1", false},
		{"64:ff9b::a00:1", false}, {"64:ff9b::808:808", true}, {"2002:7f00:1::", false},
	} {
		if got := publicAddr(netip.MustParseAddr(tc.addr)); got != tc.want {
			t.Errorf("publicAddr(%s) = %v, want %v", tc.addr, got, tc.want)
		}
	}
	o := GitImportOptions{AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}
	if !o.addrAllowed(netip.MustParseAddr("10.9.9.9")) || o.addrAllowed(netip.MustParseAddr("127.0.0.1")) {
		t.Error("AllowCIDRs not applied")
	}
}
