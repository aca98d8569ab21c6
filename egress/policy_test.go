package egress

import (
	"errors"
	"net/netip"
	"testing"
)

func TestParseRule(t *testing.T) {
	tests := []struct {
		in       string
		domain   string
		wildcard bool
		prefix   string
		port     int
		bad      bool
	}{
		{in: "pypi.org", domain: "pypi.org"},
		{in: " PyPI.org. ", domain: "pypi.org"},
		{in: "*.pythonhosted.org", domain: "pythonhosted.org", wildcard: true},
		{in: "github.com:443", domain: "github.com", port: 443},
		{in: "10.1.2.0/24", prefix: "10.1.2.0/24"},
		{in: "10.1.2.9/24", prefix: "10.1.2.0/24"},
		{in: "203.0.113.7", prefix: "203.0.113.7/32"},
		{in: "203.0.113.7:22", prefix: "203.0.113.7/32", port: 22},
		{in: "2001:db8::/32", prefix: "2001:db8::/32"},
		{in: "[2001:db8::/32]:443", prefix: "2001:db8::/32", port: 443},
		{in: "[::1]", prefix: "::1/128"},
		{in: "", bad: true},
		{in: "*", bad: true},
		{in: "*.", bad: true},
		{in: "a..b", bad: true},
		{in: "-a.com", bad: true},
		{in: "a.com:0", bad: true},
		{in: "a.com:65536", bad: true},
		{in: "a.com:08", bad: true},
		{in: "a.com:", bad: true},
		{in: "ex ample.com", bad: true},
		{in: "1.2.3", bad: true},
		{in: "10.0.0.0/33", bad: true},
		{in: "fe80::1%eth0", bad: true},
		{in: "[::1", bad: true},
		{in: "a*.b.com", bad: true},
		{in: "*.*.b.com", bad: true},
	}
	for _, tt := range tests {
		r, err := ParseRule(tt.in)
		if tt.bad {
			if !errors.Is(err, ErrBadPolicy) {
				t.Errorf("ParseRule(%q) = %+v, %v; want ErrBadPolicy", tt.in, r, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseRule(%q): %v", tt.in, err)
			continue
		}
		var want netip.Prefix
		if tt.prefix != "" {
			want = netip.MustParsePrefix(tt.prefix)
		}
		if r.Domain != tt.domain || r.Wildcard != tt.wildcard || r.Prefix != want || r.Port != tt.port {
			t.Errorf("ParseRule(%q) = %+v", tt.in, r)
		}
	}
}

func TestRules(t *testing.T) {
	rules, err := Policy{Mode: ModeProxy,
		Allow: []string{"pypi.org", "*.pythonhosted.org", "github.com:443", "198.51.100.0/24", "*.example.com"},
		Deny:  []string{"evil.example.com", "198.51.100.66", "*.pythonhosted.org:80"},
	}.Compile()
	if err != nil {
		t.Fatal(err)
	}
	names := []struct {
		name    string
		port    int
		allowed bool
		rule    string
	}{
		{"pypi.org", 443, true, "pypi.org"},
		{"pypi.org", 80, true, "pypi.org"},
		{"files.pythonhosted.org", 443, true, "*.pythonhosted.org"},
		{"a.b.pythonhosted.org", 443, true, "*.pythonhosted.org"},
		{"pythonhosted.org", 443, false, ReasonNoAllowRule},            // the wildcard is not the apex
		{"files.pythonhosted.org", 80, false, "*.pythonhosted.org:80"}, // deny wins
		{"github.com", 443, true, "github.com:443"},
		{"github.com", 22, false, ReasonNoAllowRule},
		{"evil.example.com", 443, false, "evil.example.com"},
		{"good.example.com", 443, true, "*.example.com"},
		{"notpypi.org", 443, false, ReasonNoAllowRule},
		{"pypi.org.evil.net", 443, false, ReasonNoAllowRule},
	}
	for _, tt := range names {
		v := rules.CheckName(tt.name, tt.port)
		if v.Allowed != tt.allowed || v.Rule != tt.rule {
			t.Errorf("CheckName(%s, %d) = %+v, want %v %q", tt.name, tt.port, v, tt.allowed, tt.rule)
		}
	}
	addrs := []struct {
		addr    string
		byName  Verdict
		allowed bool
		rule    string
	}{
		{"198.51.100.7", Verdict{}, true, "198.51.100.0/24"},
		{"198.51.100.66", Verdict{}, false, "198.51.100.66"},
		{"198.51.100.66", Verdict{Allowed: true, Rule: "pypi.org"}, false, "198.51.100.66"}, // deny CIDR wins over an allowed name
		{"::ffff:198.51.100.7", Verdict{}, true, "198.51.100.0/24"},
		{"192.0.2.1", Verdict{}, false, ReasonNoAllowRule},
		{"192.0.2.1", Verdict{Allowed: true, Rule: "pypi.org"}, true, "pypi.org"},
	}
	for _, tt := range addrs {
		v := rules.CheckAddr(netip.MustParseAddr(tt.addr), 443, tt.byName)
		if v.Allowed != tt.allowed || v.Rule != tt.rule {
			t.Errorf("CheckAddr(%s, %+v) = %+v, want %v %q", tt.addr, tt.byName, v, tt.allowed, tt.rule)
		}
	}
	none, _ := Policy{}.Compile()
	if v := none.CheckName("pypi.org", 443); v.Allowed || v.Rule != ReasonModeNone {
		t.Errorf("mode none CheckName = %+v", v)
	}
}

func TestCompileRefuses(t *testing.T) {
	for _, p := range []Policy{
		{Mode: "open"},
		{Mode: ModeNone, Allow: []string{"pypi.org"}},
		{Mode: ModeProxy, Allow: []string{"bad rule"}},
		{Mode: ModeProxy, Deny: []string{"10.0.0.0/99"}},
		{Mode: ModeProxy, Allow: make([]string, MaxRules+1)},
	} {
		if _, err := p.Compile(); !errors.Is(err, ErrBadPolicy) {
			t.Errorf("Compile(%+v) = %v, want ErrBadPolicy", p, err)
		}
	}
}

func TestFloor(t *testing.T) {
	f, err := NewFloor(nil, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "100.64.0.1", "100.100.100.200",
		"169.254.169.254", "0.0.0.0", "::", "::1", "fe80::1", "fd00:ec2::254", "::ffff:169.254.169.254", "::ffff:127.0.0.1",
		"224.0.0.1", "255.255.255.255", "64:ff9b::a9fe:a9fe"} {
		if !f.Blocks(netip.MustParseAddr(a)) {
			t.Errorf("default floor lets %s through", a)
		}
	}
	for _, a := range []string{"1.1.1.1", "151.101.0.223", "2606:4700::1111"} {
		if f.Blocks(netip.MustParseAddr(a)) {
			t.Errorf("default floor blocks %s", a)
		}
	}
	open, err := NewFloor([]string{"127.0.0.0/8"}, false)
	if err != nil {
		t.Fatal(err)
	}
	if open.Blocks(netip.MustParseAddr("127.0.0.1")) || !open.Blocks(netip.MustParseAddr("169.254.169.254")) ||
		open.Blocks(netip.MustParseAddr("::ffff:127.0.0.2")) {
		t.Error("allow-cidr 127.0.0.0/8 opens the wrong ranges")
	}
	if _, err := NewFloor([]string{"nonsense"}, false); err == nil {
		t.Error("NewFloor accepted a bad CIDR")
	}
}
