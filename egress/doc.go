// Package egress is corral's per-machine network policy and the service
// that enforces it: a machine keeps only its loopback, and a project in
// mode proxy gets an HTTP(S) proxy on its 127.0.0.1:3128 and a SOCKS5 proxy
// on 127.0.0.1:1080 whose listening sockets the worker made inside the
// machine's network namespace (protocol-2 extension "net-listen",
// machine.Gateway.Listen) and handed to core. Nothing else leaves the
// machine: a program that ignores the proxy environment reaches nothing.
//
// # Policy
//
// A [Policy] is mode "none" (the default) or "proxy" with allow and deny
// rules ([ParseRule]): domains ("pypi.org"), wildcards ("*.pythonhosted.org",
// the names below it, not itself), addresses and CIDRs ("203.0.113.0/24",
// "[2001:db8::/32]:443"), each with an optional port. Deny wins. A name is
// allowed only by a domain rule, and a name no rule allows is refused
// before any lookup (the host's resolver is no side channel); CIDR allow
// rules allow address literals. Under every policy is the operator's
// [Floor]: loopback, private, link-local (the metadata address), CGNAT,
// documentation, multicast and reserved ranges, their IPv6 counterparts and
// the host's own addresses, minus the ranges the operator opened
// (corral daemon --egress-allow-cidr).
//
// # Enforcement
//
// For each connection ([Machine.ServeHTTP]: CONNECT, and plain http://
// requests by their absolute URI; [Machine.ServeSOCKS5]: CONNECT to a
// domain or an address, no authentication) the service checks the name,
// resolves it on the host, checks every resolved address against the floor
// and the rules again (one bad address refuses the request: no DNS
// rebinding onto the floor) and dials the checked address, never the name.
// It intercepts no TLS. A refusal is HTTP 403 with the rule in the body, or
// SOCKS5 reply 2 ("connection not allowed by ruleset"). The policy is read
// per connection: [Machine.SetPolicy] applies to the next one.
//
// # Bounds and audit
//
// Per machine: at most Options.MaxConns concurrent connections (64) and
// twice as many accepted client connections (a connection accepted beyond
// them is closed unserved: a guest's idle connections cannot exhaust the
// serving process's descriptors), an optional byte rate for all of them together (Options.BytesPerSecond, both
// directions), an idle timeout per connection (5 minutes). Every attempt
// yields a [Record] (account, project, protocol, name, address, port,
// verdict allowed/denied/failed, the deciding rule, bytes in and out,
// duration) when it is refused or when the connection ends.
//
// # In corral
//
// [Manager] is core's egress service (core.Build starts it): before every
// managed session it arms a proxy-mode project's machine (starting the
// machine first with a session of its own when it does not run, so that
// the proxies listen before the real program does), under the policy it
// reads then or, through [Manager.SessionPolicy], the one the command's
// preparation read with its tenancy (whose version the command's lease
// insert checks, so a policy changed by any process applies to the next
// command), returns the proxy environment ([Env]) for the session, journals every record in the store
// (GET /v1/projects/{id}/egress/log), re-reads live machines' policies
// every second, and closes the listeners when the project's last session
// ends.
package egress
