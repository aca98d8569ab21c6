package guest

import (
	"slices"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/worker/internal/ctl"
)

// Per-session cgroups (cgroup v2 only). The worker delegates the
// machine's cgroup to guest root and names it in Config.SessionCgroup;
// the init opens it first thing (before it leaves the host's mount
// table) and forks each session's main process straight into a child
// group of its own, "s-<sid>", with CLONE_INTO_CGROUP: every process of
// the session, including those that leave its pid namespace's tree by
// reparenting, stays in that group, which a kill empties at once
// (cgroup.kill) besides the holder's namespace kill. The group is removed
// when the session's exit is reported; the machine's own limits, on the
// parent, bound it with the rest. On v1 (no SessionCgroup) the holder's
// pid namespace kill alone is the tree kill, exact as well.
//
// CLONE_INTO_CGROUP exists only in clone3, to which the sessions' syscall
// policy — inherited from the forking threads, which are under it —
// answers ENOSYS (as Docker's does: its flags are in memory, out of a
// filter's reach). Where the policy refuses clone3 (PolicyAllowsClone3),
// the init does not try: sessions get no group of their own and the
// holder's kill remains the tree kill, on v2 as on v1.

// sessionCgroups is the machine's delegated cgroup directory, or -1.
var sessionCgroups = -1

// openSessionCgroups opens the delegated directory; failing, sessions
// simply get no group of their own.
func openSessionCgroups(cfg *ctl.Config) {
	if cfg.SessionCgroup == "" || !PolicyAllowsClone3() {
		return
	}
	if fd, err := unix.Open(cfg.SessionCgroup, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err == nil {
		sessionCgroups = fd
	}
}

func sessionCgroupName(sid uint64) string { return "s-" + strconv.FormatUint(sid, 10) }

// newSessionCgroup creates session sid's group and returns a descriptor
// of it for CLONE_INTO_CGROUP (the caller closes it after the fork), or
// -1 without session groups.
func newSessionCgroup(sid uint64) int {
	if sessionCgroups < 0 {
		return -1
	}
	name := sessionCgroupName(sid)
	if err := unix.Mkdirat(sessionCgroups, name, 0o755); err != nil && err != unix.EEXIST {
		return -1
	}
	fd, err := unix.Openat(sessionCgroups, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		_ = unix.Unlinkat(sessionCgroups, name, unix.AT_REMOVEDIR)
		return -1
	}
	return fd
}

// disableSessionCgroups turns session groups off for good (a kernel that
// refused CLONE_INTO_CGROUP) after removing sid's.
func disableSessionCgroups(sid uint64) {
	removeSessionCgroup(sid)
	unix.Close(sessionCgroups)
	sessionCgroups = -1
}

// killSessionCgroup kills every process of session sid's group.
func killSessionCgroup(sid uint64) {
	if sessionCgroups < 0 {
		return
	}
	fd, err := unix.Openat(sessionCgroups, sessionCgroupName(sid)+"/cgroup.kill", unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	_, _ = unix.Write(fd, []byte("1"))
	unix.Close(fd)
}

// removeSessionCgroup removes session sid's (empty) group. One left
// behind busy goes with the machine's group.
func removeSessionCgroup(sid uint64) {
	if sessionCgroups < 0 {
		return
	}
	_ = unix.Unlinkat(sessionCgroups, sessionCgroupName(sid), unix.AT_REMOVEDIR)
}

// PolicyAllowsClone3 reports whether the sessions' syscall policy lets the
// forking threads call clone3, which CLONE_INTO_CGROUP needs.
func PolicyAllowsClone3() bool { return !slices.Contains(enosys, "clone3") }
