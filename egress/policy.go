package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// Mode is a project's network mode.
type Mode string

const (
	// ModeNone, the default (and the zero Policy's), leaves a machine its
	// loopback only: no listener, no proxy, no way out.
	ModeNone Mode = "none"
	// ModeProxy gives a machine corral's HTTP and SOCKS5 proxies, which
	// connect where the policy allows.
	ModeProxy Mode = "proxy"
)

// Policy is a project's egress policy as stored and set through the API.
// The zero Policy is mode none.
type Policy struct {
	Mode  Mode     `json:"mode"`
	Allow []string `json:"allow,omitempty"`
	Deny  []string `json:"deny,omitempty"`
}

// MaxRules bounds the rules of one list.
const MaxRules = 256

// ErrBadPolicy is wrapped by every error of Policy.Compile and ParseRule.
var ErrBadPolicy = errors.New("egress: bad policy")

// Rule is one parsed allow or deny entry: a domain ("pypi.org"), a
// wildcard domain ("*.pythonhosted.org": every name below it, not itself),
// an address or CIDR ("203.0.113.7", "2001:db8::/32"), each with an
// optional port (":443"; an IPv6 address or CIDR with a port is written in
// brackets: "[2001:db8::/32]:443"). Port 0 means every port.
type Rule struct {
	// Text is the entry as written, which verdicts and journal rows cite.
	Text string
	// Domain is the lower-case domain without "*." ("" for a CIDR rule).
	Domain string
	// Wildcard is set for "*." rules.
	Wildcard bool
	// Prefix is the CIDR of an address rule.
	Prefix netip.Prefix
	// Port is the rule's port, 0 for any.
	Port int
}

// ParseRule parses one rule. Errors wrap ErrBadPolicy.
func ParseRule(s string) (Rule, error) {
	text := strings.TrimSpace(s)
	r := Rule{Text: text}
	bad := func(why string) (Rule, error) {
		return Rule{}, fmt.Errorf("%w: rule %q: %s", ErrBadPolicy, text, why)
	}
	if text == "" {
		return bad("empty")
	}
	host := text
	if strings.HasPrefix(host, "[") { // [v6 or v6/len]:port or [..]
		end := strings.IndexByte(host, ']')
		if end < 0 {
			return bad("unclosed [")
		}
		rest := host[end+1:]
		host = host[1:end]
		if rest != "" {
			if !strings.HasPrefix(rest, ":") {
				return bad("junk after ]")
			}
			p, err := parsePort(rest[1:])
			if err != nil {
				return bad(err.Error())
			}
			r.Port = p
		}
	} else if strings.Count(host, ":") == 1 {
		i := strings.IndexByte(host, ':')
		p, err := parsePort(host[i+1:])
		if err != nil {
			return bad(err.Error())
		}
		host, r.Port = host[:i], p
	}
	if pfx, err := netip.ParsePrefix(host); err == nil {
		r.Prefix = pfx.Masked()
		return r, nil
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if a.Zone() != "" {
			return bad("zoned address")
		}
		r.Prefix = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
		return r, nil
	}
	if strings.Contains(host, "/") || strings.Contains(host, ":") {
		return bad("neither a domain nor an address or CIDR")
	}
	if strings.HasPrefix(host, "*.") {
		r.Wildcard = true
		host = host[2:]
	}
	d, ok := normalizeName(host)
	if !ok {
		return bad("not a domain name")
	}
	r.Domain = d
	return r, nil
}

func parsePort(s string) (int, error) {
	p, err := strconv.Atoi(s)
	if err != nil || p < 1 || p > 65535 || strconv.Itoa(p) != s {
		return 0, fmt.Errorf("bad port %q", s)
	}
	return p, nil
}

// normalizeName lower-cases a host name, drops one trailing dot, and
// reports whether it is a plausible DNS name (letters, digits, '-', '_',
// dot-separated labels of 1–63 bytes, at most 253 bytes, not all digits).
func normalizeName(s string) (string, bool) {
	s = strings.TrimSuffix(strings.ToLower(s), ".")
	if s == "" || len(s) > 253 {
		return "", false
	}
	digits := true
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return "", false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			switch {
			case c >= 'a' && c <= 'z', c == '-', c == '_':
				digits = false
			case c >= '0' && c <= '9':
			default:
				return "", false
			}
		}
	}
	if digits {
		return "", false // "1.2.3" is not a name to resolve
	}
	return s, true
}

// matchName reports whether r, a domain rule, matches name (normalized)
// and port.
func (r Rule) matchName(name string, port int) bool {
	if r.Domain == "" || (r.Port != 0 && r.Port != port) {
		return false
	}
	if r.Wildcard {
		return strings.HasSuffix(name, "."+r.Domain)
	}
	return name == r.Domain
}

// matchAddr reports whether r, an address rule, matches a and port.
func (r Rule) matchAddr(a netip.Addr, port int) bool {
	return r.Domain == "" && r.Prefix.IsValid() && (r.Port == 0 || r.Port == port) && r.Prefix.Contains(a.Unmap())
}

// Rules is a compiled Policy. Its methods are safe for concurrent use.
type Rules struct {
	mode        Mode
	allow, deny []Rule
}

// Compile checks p and returns its rules. An empty mode is ModeNone; rules
// are refused in mode none (they would mean nothing). Errors wrap
// ErrBadPolicy.
func (p Policy) Compile() (*Rules, error) {
	r := &Rules{mode: p.Mode}
	switch p.Mode {
	case "", ModeNone:
		r.mode = ModeNone
		if len(p.Allow)+len(p.Deny) > 0 {
			return nil, fmt.Errorf("%w: allow and deny rules need mode %q", ErrBadPolicy, ModeProxy)
		}
		return r, nil
	case ModeProxy:
	default:
		return nil, fmt.Errorf("%w: unknown mode %q (want %q or %q)", ErrBadPolicy, p.Mode, ModeNone, ModeProxy)
	}
	if len(p.Allow) > MaxRules || len(p.Deny) > MaxRules {
		return nil, fmt.Errorf("%w: more than %d rules", ErrBadPolicy, MaxRules)
	}
	for _, s := range p.Allow {
		x, err := ParseRule(s)
		if err != nil {
			return nil, err
		}
		r.allow = append(r.allow, x)
	}
	for _, s := range p.Deny {
		x, err := ParseRule(s)
		if err != nil {
			return nil, err
		}
		r.deny = append(r.deny, x)
	}
	return r, nil
}

// Normalized returns p with its mode spelt out and its rules trimmed (what
// is stored).
func (p Policy) Normalized() Policy {
	if p.Mode == "" {
		p.Mode = ModeNone
	}
	trim := func(l []string) []string {
		var out []string
		for _, s := range l {
			if s = strings.TrimSpace(s); s != "" {
				out = append(out, s)
			}
		}
		return out
	}
	p.Allow, p.Deny = trim(p.Allow), trim(p.Deny)
	return p
}

// Mode reports the compiled policy's mode.
func (r *Rules) Mode() Mode { return r.mode }

// Verdict is the outcome of a check: Allowed, and the rule that decided
// (the rule's text, or a fixed reason such as "floor" or "no allow rule").
type Verdict struct {
	Allowed bool
	Rule    string
}

// Reasons a Verdict names when no rule of the policy decided.
const (
	ReasonModeNone    = "mode none"
	ReasonNoAllowRule = "no allow rule"
	ReasonFloor       = "floor"
	ReasonBadName     = "bad name"
)

// CheckName is the first check of a request for name (a host name, not an
// address literal) and port: a deny rule for the name refuses; an allow
// rule for it allows, pending CheckAddr of every address it resolves to;
// anything else is refused (ReasonNoAllowRule) before any resolution.
// Allow CIDRs allow address literals only: a name no domain rule allows is
// never looked up, so that code in a machine cannot leak data through the
// host's resolver.
func (r *Rules) CheckName(name string, port int) Verdict {
	if r.mode != ModeProxy {
		return Verdict{Rule: ReasonModeNone}
	}
	for _, x := range r.deny {
		if x.matchName(name, port) {
			return Verdict{Rule: x.Text}
		}
	}
	for _, x := range r.allow {
		if x.matchName(name, port) {
			return Verdict{Allowed: true, Rule: x.Text}
		}
	}
	return Verdict{Rule: ReasonNoAllowRule}
}

// CheckAddr checks one address the request reaches: a deny CIDR refuses;
// byName is the verdict of CheckName for a name (its addresses need no
// allow CIDR), the zero Verdict for an address literal, which needs an
// allow CIDR. The operator's floor is
// checked separately (Floor.Blocks), before this.
func (r *Rules) CheckAddr(a netip.Addr, port int, byName Verdict) Verdict {
	if r.mode != ModeProxy {
		return Verdict{Rule: ReasonModeNone}
	}
	for _, x := range r.deny {
		if x.matchAddr(a, port) {
			return Verdict{Rule: x.Text}
		}
	}
	if byName.Allowed {
		return byName
	}
	for _, x := range r.allow {
		if x.matchAddr(a, port) {
			return Verdict{Allowed: true, Rule: x.Text}
		}
	}
	return Verdict{Rule: ReasonNoAllowRule}
}
