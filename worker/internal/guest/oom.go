package guest

import (
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// OOM protection of the init and the holders, and none for sessions.
//
// The worker (host root, CAP_SYS_RESOURCE) writes -1000 to the init's
// oom_score_adj before the init forks anything: the kernel's OOM killer
// then never picks it, and, because a privileged write also sets the
// process's oom_score_adj_min to the value, the init (which holds no
// CAP_SYS_RESOURCE in the initial user namespace) may later move its own
// value anywhere between -1000 and 1000. Both values are inherited at
// fork; so are they by holders, which keeps them protected.
//
// Sessions must not inherit the protection: an OOM in the machine must
// kill the session that caused it (Go's fork offers no hook between fork
// and exec, and a write to the child's file after the fork would race
// with the child's own forks). So the init raises its own value for the
// duration of each session's fork (guardedFork) and lowers it back after:
// the session starts unprotected before running any of its code. A holder
// spawned by the pool's goroutine during that window is given the init's
// value right after its spawn (protectHolder).
//
// The session's value is 0 under a protected init. A worker without
// CAP_SYS_RESOURCE (some containers) cannot lower the init's value; the
// init then stays at its own (0) and sessions start 500 above it, so that
// the OOM killer, which picks the highest score (the resident size plus
// the value in thousandths of the memory limit), takes a session first.
//
// Limitations: a session inherits oom_score_adj_min too (only a privileged
// write changes it), so a hostile session may lower its own value to the
// init's (-1000: unkillable by the OOM killer; 0 in the fallback). Its
// memory stays bounded by the machine's memory limit, which the cgroup
// charges regardless, so the effect stays within its own machine: the OOM
// killer then picks its other sessions, or its allocations fail (and, in
// the fallback, a machine whose sessions are all smaller than the init
// may lose its init).

// oomGuard is the init's /proc/self/oom_score_adj, open for the fork
// window, or -1 when its value cannot be read (nothing is done then).
var oomGuard = -1

// oomOwn and oomSession are the init's (and holders') value and the one
// sessions start with.
var oomOwn, oomSession []byte

// initOOMGuard reads the init's value and opens the guard.
func initOOMGuard() {
	b, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		return
	}
	own, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return
	}
	session := 0
	if own > -1000 {
		session = min(own+500, 1000)
	}
	fd, err := unix.Open("/proc/self/oom_score_adj", unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	oomGuard, oomOwn, oomSession = fd, []byte(strconv.Itoa(own)), []byte(strconv.Itoa(session))
}

// guardedFork runs fork with the init's oom_score_adj raised to the
// sessions' value, so that the child starts with it.
func guardedFork(fork func() (int, error)) (int, error) {
	if oomGuard < 0 {
		return fork()
	}
	_, _ = unix.Pwrite(oomGuard, oomSession, 0)
	pid, err := fork()
	_, _ = unix.Pwrite(oomGuard, oomOwn, 0)
	return pid, err
}

// protectHolder gives a just-spawned holder (an unreaped child: its pid
// names it) the init's value, in case it was forked in a session's fork
// window.
func protectHolder(pid int) {
	if oomGuard < 0 {
		return
	}
	_ = os.WriteFile("/proc/"+strconv.Itoa(pid)+"/oom_score_adj", oomOwn, 0)
}
