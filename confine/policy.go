package confine

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/landlock-lsm/go-landlock/landlock"
	llsys "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"
)

// Policy is what a confined command may do. The zero Policy may read and
// execute the system directories only, write nowhere, make no TCP
// connection, and keeps the caller's user.
type Policy struct {
	// Writable are absolute, existing directories the command may read,
	// execute and write beneath (the project root, the actor's roots).
	Writable []string
	// Readable are further absolute, existing directories it may read and
	// execute beneath, besides [SystemDirs].
	Readable []string
	// Network lets the command use the host's network. Without it, a
	// [User]'s command runs in a network namespace of its own with no
	// usable interface (no protocol reaches anything, and the host's
	// abstract Unix sockets are not there), and, on a kernel with Landlock
	// ABI 4 or newer, binding and connecting TCP sockets is denied as well.
	// Without a User that Landlock rule is all there is, and it covers
	// TCP only: not UDP, nor MPTCP (IPPROTO_MPTCP sockets pass it), which
	// the non-root case cannot close.
	Network bool
	// User, if non-nil, is the unprivileged user the command runs as:
	// only a root caller can switch to it. The command then also runs
	// with an empty capability bounding set (and no ambient or inheritable
	// capability), in a new pid namespace whose init is Init, so that the
	// whole tree it starts can be killed at once (see [Tree]).
	User *User
	// Init, if not empty, is corral's own executable, started as the init
	// (PID 1) of the command's pid namespace with [InitArg] (its main must
	// call [MaybeRun] first): it reaps the orphans the command leaves while
	// it runs. Empty means a minimal init: a static program of three
	// system calls held in a sealed memfd, which makes the kernel reap
	// the orphans and waits for its lifeline's end (on machines that
	// cannot have it, /bin/cat reading its lifeline, which reaps nothing,
	// so orphans stay zombies until the command's tree is killed). Either
	// costs far less to start than a Go program: right for bounded
	// commands, not for long-lived sessions.
	Init string
}

// User is a host user and group id. A command switched to it has no
// supplementary groups.
type User struct {
	UID, GID uint32
}

// SystemDirs are the directories every confined command may read and
// execute beneath: programs and libraries, configuration, devices, and the
// kernel's /proc and /sys. Landlock cannot hide a file beneath an allowed
// directory, so secrets there (/etc/shadow, other processes' /proc
// entries) are protected by their permissions: a command switched to an
// unprivileged [User] cannot read them, a command that keeps the caller's
// user can read what the caller can. Directories that do not exist are
// skipped. Everything else (/home, /root, /var, /srv, /opt, /run, /tmp,
// /mnt, /media) is unreadable unless it lies beneath a writable or
// readable root.
var SystemDirs = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/dev", "/proc", "/sys"}

// resolvConf is read by resolvers; on many hosts it is a symlink into
// /run, which is granted (as a file) when the network is allowed.
const resolvConf = "/etc/resolv.conf"

// resolvConfTarget returns the file resolvConf is a symlink to, or an
// error if it is none.
func resolvConfTarget() (string, error) {
	target, err := filepath.EvalSymlinks(resolvConf)
	if err != nil {
		return "", err
	}
	if target == resolvConf {
		return "", errors.New("not a symlink")
	}
	return target, nil
}

// readFile is readExec for a rule on a file.
const readFile = llsys.AccessFSExecute | llsys.AccessFSReadFile

// netTCP is what Network allows: binding and connecting TCP sockets.
const netTCP = landlock.AccessNetSet(llsys.AccessNetBindTCP | llsys.AccessNetConnectTCP)

// scopes are the IPC scopes every confined command is restricted to (ABI
// 6): it cannot signal a process outside its Landlock domain (the daemon,
// other commands), nor connect to an abstract Unix socket created outside
// it.
const scopes = landlock.ScopedSet(llsys.ScopeSignal | llsys.ScopeAbstractUnixSocket)

func (p Policy) check() error {
	for _, d := range append(append([]string(nil), p.Writable...), p.Readable...) {
		if !strings.HasPrefix(d, "/") {
			return fmt.Errorf("confine: root %q is not absolute", d)
		}
	}
	if p.User != nil && (p.User.UID == 0 || p.User.GID == 0) {
		return errors.New("confine: a confined command never runs as uid or gid 0")
	}
	if p.Init != "" && !filepath.IsAbs(p.Init) {
		return fmt.Errorf("confine: init %q is not an absolute path", p.Init)
	}
	return nil
}

// ruleset builds the Landlock ruleset of p: read and execute beneath the
// system directories, p.Readable and p.Writable, write beneath p.Writable
// and to the harmless devices, no TCP unless p.Network, and the signal and
// abstract-socket scopes, each as far as the kernel's ABI goes (file
// system rights are always exactly those of ABI 3). Strict: a kernel below
// MinABI, a relative or missing root, any rule the kernel refuses is an
// error. The returned descriptor is close-on-exec; the caller closes it.
func ruleset(p Policy) (int, error) {
	abi, err := Available()
	if err != nil {
		return -1, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if err := p.check(); err != nil {
		return -1, err
	}
	cfg := landlock.Config{HandledAccessFS: handled}
	if abi >= 4 && !p.Network {
		cfg.HandledAccessNet = netTCP
	}
	if abi >= 6 {
		cfg.Scoped = scopes
	}
	rules := []landlock.Rule{
		landlock.PathAccess(readExec, SystemDirs...).IgnoreIfMissing(),
		landlock.PathAccess(handled, p.Writable...),
		landlock.PathAccess(handled&accessFile, devices...).IgnoreIfMissing(),
	}
	if len(p.Readable) > 0 {
		rules = append(rules, landlock.PathAccess(readExec, p.Readable...))
	}
	if p.Init != "" {
		rules = append(rules, landlock.PathAccess(readFile, p.Init))
	}
	if p.Network {
		if target, err := resolvConfTarget(); err == nil {
			rules = append(rules, landlock.PathAccess(llsys.AccessFSReadFile, target).IgnoreIfMissing())
		}
	}
	fd, _, err := cfg.NewRulesetFD(rules...)
	if err != nil {
		return -1, fmt.Errorf("confine: landlock: %w", err)
	}
	if fd < 0 {
		// Only best-effort configurations may enforce nothing.
		return -1, errors.New("confine: landlock: no ruleset to enforce")
	}
	return fd, nil
}

// denyAllRuleset returns a Landlock ruleset that handles what a command's
// ruleset handles (files, TCP, scopes) and allows nothing.
func denyAllRuleset() (int, error) {
	abi, err := Available()
	if err != nil {
		return -1, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	cfg := landlock.Config{HandledAccessFS: handled}
	if abi >= 4 {
		cfg.HandledAccessNet = netTCP
	}
	if abi >= 6 {
		cfg.Scoped = scopes
	}
	fd, _, err := cfg.NewRulesetFD()
	if err != nil {
		return -1, fmt.Errorf("confine: landlock: %w", err)
	}
	if fd < 0 {
		return -1, errors.New("confine: landlock: no ruleset to enforce")
	}
	return fd, nil
}

// dropCapabilities empties the calling thread's capability bounding,
// ambient and inheritable sets, keeping its effective and permitted sets
// (which the thread still needs to create a pid namespace and to switch
// users). The thread must be locked and discarded afterwards: processes
// it forks inherit the empty sets, and a process that switches from root
// to an unprivileged user loses its effective and permitted sets as well,
// so that nothing it executes can ever regain a capability. It fails if
// the thread lacks CAP_SETPCAP (the caller is not root).
func dropCapabilities() error {
	for c := 0; ; c++ {
		err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0)
		if errors.Is(err, unix.EINVAL) {
			if c == 0 {
				return fmt.Errorf("confine: prctl(PR_CAPBSET_DROP): %w", err)
			}
			break // past the kernel's last capability
		}
		if err != nil {
			return fmt.Errorf("confine: prctl(PR_CAPBSET_DROP, %d): %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("confine: prctl(PR_CAP_AMBIENT_CLEAR_ALL): %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("confine: capget: %w", err)
	}
	data[0].Inheritable, data[1].Inheritable = 0, 0
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("confine: capset: %w", err)
	}
	return nil
}
