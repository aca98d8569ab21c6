package projects

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/corral-sandbox/corral/internal/redact"
	"github.com/corral-sandbox/corral/sandbox"
)

// Git imports (a managed project created from a git URL) clone on the
// host, from the root daemon's network position. So that a caller cannot
// make the daemon reach what only the host may reach (SSRF), a clone of a
// remote URL:
//
//   - accepts https and http URLs only (git's protocol.allow is never,
//     with those two always, as export has);
//   - resolves the host once and refuses it unless every address it uses
//     is public: loopback, link-local (cloud metadata 169.254.169.254
//     included), private and unique-local (fd00:ec2::254 included), CGNAT
//     (100.64.0.0/10), unspecified, multicast, benchmark, reserved and
//     broadcast addresses are refused unless the operator allows a range
//     (GitImportOptions.AllowCIDRs, corral daemon --git-import-allow-cidr);
//     a host in a numeric shorthand (2130706433, 0x7f.1, 127.1) is refused;
//   - pins the address it checked (http.curloptResolve) so that a name
//     rebinding between the check and the connection cannot switch it,
//     and follows no redirect;
//   - runs git with no host credentials or configuration: an environment
//     of its own (never os.Environ()), GIT_CONFIG_NOSYSTEM=1, HOME and
//     GIT_CONFIG_GLOBAL pointing at an empty temporary directory and file,
//     no credential helper, no terminal prompt, no proxy;
//   - reports a network failure as one generic "cannot clone: connection
//     failed", so that error texts do not tell ports or hosts apart.
//
// Local paths and file:// URLs are host paths, which the API admits only
// for accounts granted host paths (see App.requireHostPaths); the CLI's
// operator may always use them.

// ErrGitImport is wrapped by Projects.Create for a git URL it does not
// clone: a scheme other than https and http, or a host that resolves to a
// refused address. It matches sandbox.ErrDenied (the API answers 403).
var ErrGitImport = fmt.Errorf("projects: git import refused: %w", sandbox.ErrDenied)

// GitImportOptions configure the clones of git imports. The zero value
// refuses every non-public address and resolves with net.DefaultResolver.
type GitImportOptions struct {
	// AllowCIDRs are address ranges allowed although not public (an
	// internal Git server, a test server on loopback).
	AllowCIDRs []netip.Prefix
	// Resolver resolves host names; nil means net.DefaultResolver.
	Resolver Resolver
	// MaxFiles and MaxBytes bound the checkout of a clone (files, and
	// bytes of their content): the clone is checked before it is checked
	// out, and one beyond is refused (ErrGitImport), so that a "git bomb"
	// of a few objects cannot fill the host. Zero means
	// DefaultImportMaxFiles and DefaultImportMaxBytes; negative, no bound.
	MaxFiles int
	MaxBytes int64
}

// The default bounds of a git import's checkout.
const (
	DefaultImportMaxFiles = 200_000
	DefaultImportMaxBytes = 4 << 30
)

// Resolver resolves host names, as *net.Resolver does.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// refusedRanges are the non-public ranges net/netip has no predicate for.
var refusedRanges = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),       // "this network"
	netip.MustParsePrefix("100.64.0.0/10"),   // CGNAT
	netip.MustParsePrefix("192.0.0.0/24"),    // IETF protocol assignments
	netip.MustParsePrefix("192.0.2.0/24"),    // documentation
	netip.MustParsePrefix("198.18.0.0/15"),   // benchmarking
	netip.MustParsePrefix("198.51.100.0/24"), // documentation
	netip.MustParsePrefix("203.0.113.0/24"),  // documentation
	netip.MustParsePrefix("240.0.0.0/4"),     // reserved, broadcast
	netip.MustParsePrefix("2001:db8::/32"),   // documentation
	netip.MustParsePrefix("100::/64"),        // discard
}

// embeddedIPv4 are IPv6 ranges that carry an IPv4 address in their last
// 32 bits (NAT64), which must be public too.
var embeddedIPv4 = []netip.Prefix{
	netip.MustParsePrefix("64:ff9b::/96"),
	netip.MustParsePrefix("64:ff9b:1::/48"),
}

// addrAllowed reports whether a clone may connect to a.
func (o GitImportOptions) addrAllowed(a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range o.AllowCIDRs {
		if p.Contains(a) {
			return true
		}
	}
	return publicAddr(a)
}

func publicAddr(a netip.Addr) bool {
	a = a.Unmap()
	if !a.IsValid() || a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() ||
		a.IsInterfaceLocalMulticast() || a.IsMulticast() || a.IsPrivate() || a.IsUnspecified() {
		return false
	}
	for _, p := range refusedRanges {
		if p.Contains(a) {
			return false
		}
	}
	for _, p := range embeddedIPv4 {
		if p.Contains(a) {
			b := a.As16()
			return publicAddr(netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]}))
		}
	}
	if a.Is6() && netip.MustParsePrefix("2002::/16").Contains(a) { // 6to4
		b := a.As16()
		return publicAddr(netip.AddrFrom4([4]byte{b[2], b[3], b[4], b[5]}))
	}
	return true
}

// pin resolves u's host once and returns the address to connect to and
// the port, or an error wrapping ErrGitImport.
func (o GitImportOptions) pin(ctx context.Context, u *url.URL) (netip.Addr, int, error) {
	host := u.Hostname()
	if host == "" {
		return netip.Addr{}, 0, fmt.Errorf("%w: the URL has no host", ErrGitImport)
	}
	port := 443
	if u.Scheme == "http" {
		port = 80
	}
	if p := u.Port(); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n <= 0 || n > 65535 {
			return netip.Addr{}, 0, fmt.Errorf("%w: bad port %q", ErrGitImport, p)
		}
		port = n
	}
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a}
	} else if numericLike(host) {
		// 2130706433, 0x7f.1, 127.1: curl reads these as addresses that
		// the check above did not see.
		return netip.Addr{}, 0, fmt.Errorf("%w: host %q is neither a name nor an address in canonical form", ErrGitImport, host)
	} else {
		var res Resolver = net.DefaultResolver
		if o.Resolver != nil {
			res = o.Resolver
		}
		if addrs, err = res.LookupNetIP(ctx, "ip", host); err != nil || len(addrs) == 0 {
			return netip.Addr{}, 0, fmt.Errorf("%w: cannot clone: connection failed", ErrInvalidProject)
		}
	}
	for _, a := range addrs {
		if o.addrAllowed(a) {
			return a.Unmap(), port, nil
		}
	}
	return netip.Addr{}, 0, fmt.Errorf("%w: %s resolves to a loopback, private, link-local or other non-public address (the operator may allow a range with --git-import-allow-cidr)", ErrGitImport, host)
}

// numericLike reports whether host's last label is numeric (all digits, or
// 0x and hex digits): no DNS name ends so, but C resolvers and curl read
// such hosts as IPv4 addresses in a shorthand.
func numericLike(host string) bool {
	host = strings.TrimSuffix(host, ".")
	last := host[strings.LastIndexByte(host, '.')+1:]
	if last == "" {
		return true
	}
	if h, ok := strings.CutPrefix(strings.ToLower(last), "0x"); ok {
		last = h
		if last == "" {
			return true
		}
		for _, c := range last {
			if !strings.ContainsRune("0123456789abcdef", c) {
				return false
			}
		}
		return true
	}
	for _, c := range last {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// gitClone clones the git URL src into the empty directory dir on the
// host, as described above. The URL's credentials never appear in the
// error. progress, if non-nil, receives git's progress lines (redacted),
// only once a connection was made.
func (p *Projects) gitClone(ctx context.Context, src, dir string, progress func(string)) error {
	if strings.HasPrefix(src, "-") {
		return fmt.Errorf("%w: git URL %q", ErrInvalidProject, redact.String(src))
	}
	ctx, cancel := context.WithTimeout(ctx, CloneTimeout)
	defer cancel()
	empty, err := os.MkdirTemp("", "corral-clone-home-")
	if err != nil {
		return fmt.Errorf("projects: %w", err)
	}
	defer os.RemoveAll(empty)
	emptyConfig := filepath.Join(empty, "gitconfig")
	if err := os.WriteFile(emptyConfig, nil, 0o600); err != nil {
		return fmt.Errorf("projects: %w", err)
	}
	args := []string{
		"-c", "protocol.allow=never",
		"-c", "credential.helper=",
		"-c", "core.hooksPath=/dev/null",
		"-c", "core.fsmonitor=false",
		"-c", "transfer.fsckObjects=true",
		"-c", "http.followRedirects=false",
		"-c", "http.proxy=",
	}
	shown := redact.String(src)
	if local, ok := LocalGitPath(src); ok {
		args = append(args, "-c", "protocol.file.allow=always")
		src = local
	} else {
		u, err := url.Parse(src)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Opaque != "" {
			return fmt.Errorf("%w: %s: only https and http git URLs are imported", ErrGitImport, shown)
		}
		addr, port, err := p.GitImport.pin(ctx, u)
		if err != nil {
			return err
		}
		a := addr.String()
		if addr.Is6() {
			a = "[" + a + "]"
		}
		p.logger().Info("git import", "url", shown, "address", a, "port", port)
		args = append(args, "-c", "protocol."+u.Scheme+".allow=always")
		if _, err := netip.ParseAddr(u.Hostname()); err != nil {
			// A name: git (curl) connects to the address checked, whatever
			// the name resolves to by then.
			args = append(args, "-c", "http.curloptResolve="+u.Hostname()+":"+strconv.Itoa(port)+":"+a)
		}
	}
	config := args
	clone := []string{"clone", "--quiet"}
	if progress != nil {
		clone = []string{"clone", "--progress"}
	}
	args = append(args, clone...)
	// Checked out only once its size is known (checkout, below).
	args = append(args, "--no-checkout", "--no-recurse-submodules", "--", src, dir)
	cmd := exec.CommandContext(ctx, "git", args...)
	groupKill(cmd)
	cmd.Env = []string{
		"HOME=" + empty,
		"XDG_CONFIG_HOME=" + empty,
		"GIT_CONFIG_NOSYSTEM=1",
		"GIT_CONFIG_GLOBAL=" + emptyConfig,
		"GIT_TERMINAL_PROMPT=0",
		"GIT_ASKPASS=/bin/false",
		"SSH_ASKPASS=/bin/false",
		"LC_ALL=C",
	}
	if path, ok := os.LookupEnv("PATH"); ok {
		cmd.Env = append(cmd.Env, "PATH="+path)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &limitedBuffer{b: &stderr, n: 64 << 10}
	if progress != nil {
		pw := &progressWriter{f: progress}
		defer pw.flush()
		cmd.Stderr = io.MultiWriter(cmd.Stderr, pw)
	}
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("%w: cannot clone %s: %w", ErrInvalidProject, shown, ctx.Err())
		}
		msg := strings.TrimSpace(stderr.String())
		p.logger().Debug("git import failed", "url", shown, "err", err, "stderr", redact.String(msg))
		return fmt.Errorf("%w: cannot clone %s: %s", ErrInvalidProject, shown, cloneFailure(msg))
	}
	return p.checkout(ctx, dir, shown, config, cmd.Env)
}

// groupKill makes cmd's cancellation kill its whole process group (git
// runs its transport in a remote helper, git-remote-http, which would
// otherwise keep talking to a server that never answers, and keep Wait
// waiting for the pipes it holds), and bounds that wait.
func groupKill(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
}

// checkout checks out the clone at dir if its HEAD's tree holds no more
// than the import's bounds, reading the tree's listing only as far as the
// bounds (a git bomb lists billions of entries). config and env are the
// clone's.
func (p *Projects) checkout(ctx context.Context, dir, shown string, config, env []string) error {
	maxFiles, maxBytes := p.GitImport.MaxFiles, p.GitImport.MaxBytes
	if maxFiles == 0 {
		maxFiles = DefaultImportMaxFiles
	}
	if maxBytes == 0 {
		maxBytes = DefaultImportMaxBytes
	}
	git := func(ctx context.Context, args ...string) *exec.Cmd {
		cmd := exec.CommandContext(ctx, "git", append(append(append([]string{}, config...), "-C", dir), args...)...)
		groupKill(cmd)
		cmd.Env = env
		return cmd
	}
	if err := git(ctx, "rev-parse", "-q", "--verify", "HEAD^{tree}").Run(); err != nil {
		return nil // an empty repository: nothing to check out
	}
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ls := git(lctx, "ls-tree", "-r", "-l", "-z", "HEAD")
	out, err := ls.StdoutPipe()
	if err != nil {
		return fmt.Errorf("projects: %w", err)
	}
	if err := ls.Start(); err != nil {
		return fmt.Errorf("projects: %w", err)
	}
	var files int
	var size int64
	over := ""
	r := bufio.NewReader(out)
	for over == "" {
		entry, err := r.ReadString(0)
		if err != nil {
			break
		}
		// <mode> SP <type> SP <object> SP+ <size> TAB <path>
		meta, _, _ := strings.Cut(entry, "\t")
		f := strings.Fields(meta)
		if len(f) != 4 || f[1] != "blob" {
			continue
		}
		files++
		n, _ := strconv.ParseInt(f[3], 10, 64)
		size += n
		switch {
		case maxFiles > 0 && files > maxFiles:
			over = fmt.Sprintf("more than %d files", maxFiles)
		case maxBytes > 0 && size > maxBytes:
			over = fmt.Sprintf("more than %d bytes", maxBytes)
		}
	}
	if over != "" {
		cancel() // the rest of the listing is not read
	}
	werr := ls.Wait()
	if over != "" {
		return fmt.Errorf("%w: %s: its checkout would hold %s, more than a git import may (%d files, %d bytes)", ErrGitImport, shown, over, maxFiles, maxBytes)
	}
	if werr != nil {
		return fmt.Errorf("%w: cannot list %s: %v", ErrInvalidProject, shown, werr)
	}
	var stderr bytes.Buffer
	co := git(ctx, "checkout", "-q")
	co.Stderr = &limitedBuffer{b: &stderr, n: 64 << 10}
	if err := co.Run(); err != nil {
		return fmt.Errorf("%w: cannot check out %s: %s", ErrInvalidProject, shown, cloneFailure(strings.TrimSpace(stderr.String())))
	}
	return nil
}

// cloneFailure summarizes git's stderr for the caller: network failures
// are one generic text (which port answered how is nobody's business); a
// failure the server reported keeps git's first "fatal:" line, redacted.
func cloneFailure(stderr string) string {
	low := strings.ToLower(stderr)
	for _, s := range []string{"could not resolve", "failed to connect", "connection refused", "connection reset",
		"timed out", "timeout", "couldn't connect", "no route to host", "network is unreachable", "ssl", "tls",
		"empty reply", "recv failure", "send failure", "unable to access", "http/2 stream", "transfer closed"} {
		if strings.Contains(low, s) {
			return "connection failed"
		}
	}
	for _, line := range strings.Split(stderr, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "fatal: "); ok {
			if len(rest) > 200 {
				rest = rest[:200]
			}
			return redact.String(rest)
		}
	}
	return "git failed"
}

// progressWriter splits git's progress output (lines ended by '\r' or
// '\n') into redacted lines for f.
type progressWriter struct {
	f   func(string)
	buf []byte
}

func (w *progressWriter) Write(p []byte) (int, error) {
	for _, c := range p {
		if c == '\r' || c == '\n' {
			w.flush()
			continue
		}
		if len(w.buf) < 512 {
			w.buf = append(w.buf, c)
		}
	}
	return len(p), nil
}

func (w *progressWriter) flush() {
	if line := strings.TrimSpace(string(w.buf)); line != "" && !strings.HasPrefix(line, "fatal:") && !strings.HasPrefix(line, "error:") {
		w.f(redact.String(line))
	}
	w.buf = w.buf[:0]
}

// limitedBuffer keeps at most n bytes and discards the rest.
type limitedBuffer struct {
	b *bytes.Buffer
	n int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := l.n - l.b.Len(); room > 0 {
		l.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}
