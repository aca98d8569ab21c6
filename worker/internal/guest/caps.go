package guest

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

// Privilege of sessions. Guest root holds at most rootCaps, Docker's
// default capabilities without CAP_SETFCAP (a file capability written
// through the idmapped workspace would hold for the workspace's host
// owner); every other user holds none. Capabilities, the bounding set
// among them, are per thread, and Go's ForkExec cannot drop the bounding
// set in the child, so the init forks sessions from two locked threads
// (see forkThread): the loop's own, for sessions of the default user's
// class (root or not), and another, for the other class. Each thread's
// bounding set is its class's (PR_CAPBSET_DROP), its ambient and
// inheritable sets are empty, and it has no_new_privs and the syscall
// policy (seccomp.go), all inherited by what it forks. Its effective and
// permitted sets stay whole, for what the init does there itself (setns
// into holders' namespaces, setgroups and setuid in the child before
// exec). A child that becomes a non-root user loses every capability at
// setuid; one that stays root gets its thread's bounding set at exec.
// Holders are spawned by the pool's thread, which has none of these
// restrictions (see spawnNow).
//
// The Go runtime never clones a new thread from a locked one: from a
// locked thread it asks its template thread, started by the first
// LockOSThread, before any of this (runtime.newm). So no other thread
// inherits these restrictions.

// rootCaps are guest root's capabilities.
var rootCaps = []int{
	unix.CAP_CHOWN, unix.CAP_DAC_OVERRIDE, unix.CAP_FSETID, unix.CAP_FOWNER, unix.CAP_MKNOD,
	unix.CAP_NET_RAW, unix.CAP_SETGID, unix.CAP_SETUID, unix.CAP_SETPCAP,
	unix.CAP_NET_BIND_SERVICE, unix.CAP_SYS_CHROOT, unix.CAP_KILL, unix.CAP_AUDIT_WRITE,
}

var capNamesByNumber = map[int]string{
	unix.CAP_CHOWN: "CAP_CHOWN", unix.CAP_DAC_OVERRIDE: "CAP_DAC_OVERRIDE", unix.CAP_FSETID: "CAP_FSETID",
	unix.CAP_FOWNER: "CAP_FOWNER", unix.CAP_MKNOD: "CAP_MKNOD", unix.CAP_NET_RAW: "CAP_NET_RAW",
	unix.CAP_SETGID: "CAP_SETGID", unix.CAP_SETUID: "CAP_SETUID", unix.CAP_SETPCAP: "CAP_SETPCAP",
	unix.CAP_NET_BIND_SERVICE: "CAP_NET_BIND_SERVICE", unix.CAP_SYS_CHROOT: "CAP_SYS_CHROOT",
	unix.CAP_KILL: "CAP_KILL", unix.CAP_AUDIT_WRITE: "CAP_AUDIT_WRITE",
}

// capNames returns the names of caps, as Docker's profile spells them.
func capNames(caps []int) []string {
	out := make([]string, len(caps))
	for i, c := range caps {
		out[i] = capNamesByNumber[c]
	}
	return out
}

// RootCapMask is the CapEff of a guest root session, as /proc shows it.
func RootCapMask() uint64 {
	var m uint64
	for _, c := range rootCaps {
		m |= 1 << c
	}
	return m
}

// restrictThread makes the calling (locked) thread a forking thread for
// sessions that may hold keep: its bounding set reduced to keep, no
// ambient or inheritable capabilities, no_new_privs and the syscall
// policy. It cannot be undone.
func restrictThread(keep []int) error {
	kept := map[int]bool{}
	for _, c := range keep {
		kept[c] = true
	}
	for c := 0; ; c++ {
		if _, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0); err != nil {
			if errors.Is(err, unix.EINVAL) {
				break // past the last capability the kernel knows
			}
			return fmt.Errorf("read bounding set: %w", err)
		}
		if !kept[c] {
			if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
				return fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
			}
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clear ambient capabilities: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	data[0].Inheritable, data[1].Inheritable = 0, 0
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("clear inheritable capabilities: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	return installFilter()
}

// forkThread runs functions on a locked thread of its own, restricted for
// one class of sessions (restrictThread). A nil *forkThread runs them on
// the calling thread.
type forkThread struct {
	fns  chan func()
	done chan struct{}
	tid  int
}

// newForkThread starts a thread restricted to keep and waits until it is.
func newForkThread(keep []int) (*forkThread, error) {
	t := &forkThread{fns: make(chan func()), done: make(chan struct{})}
	ready := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the init
		t.tid = unix.Gettid()
		if err := unshareFS(); err != nil { // it enters holders' mount namespaces
			ready <- err
			return
		}
		if err := restrictThread(keep); err != nil {
			ready <- err
			return
		}
		ready <- nil
		for fn := range t.fns {
			fn()
			t.done <- struct{}{}
		}
	}()
	if err := <-ready; err != nil {
		return nil, err
	}
	return t, nil
}

// do runs fn on t's thread and waits for it to return.
func (t *forkThread) do(fn func()) {
	if t == nil {
		fn()
		return
	}
	t.fns <- fn
	<-t.done
}

// User namespace limits. Counts of namespaces and inotify and fanotify
// objects are charged to every user namespace up to the host's, for the
// owner of each: without limits of its own, a machine's guests share with
// every other machine and the host the quotas of the user who created the
// machine's user namespace. These are per user of the machine.
//
// No session can create a user namespace (the syscall policy also
// refuses it), nor a network, ipc, uts, cgroup or time namespace (they
// need CAP_SYS_ADMIN, which no session holds) and neither can the init
// after boot: 0. Pid and mount namespaces are the holders' (the init's,
// as guest root): enough for every holder a machine may have, living or
// being torn down.
func userNSLimits(maxSessions int) map[string]int {
	holders := 4 * (retainFor(maxSessions) + poolSize)
	return map[string]int{
		"max_user_namespaces":   0,
		"max_net_namespaces":    0,
		"max_ipc_namespaces":    0,
		"max_uts_namespaces":    0,
		"max_cgroup_namespaces": 0,
		"max_time_namespaces":   0,
		"max_pid_namespaces":    holders,
		"max_mnt_namespaces":    holders,
		"max_inotify_instances": MaxInotifyInstances,
		"max_inotify_watches":   MaxInotifyWatches,
		"max_fanotify_groups":   16,
		"max_fanotify_marks":    MaxInotifyWatches,
	}
}

// Per-user inotify limits inside a machine (the host's defaults are 128
// instances and a few hundred thousand watches per user, shared by every
// machine of a worker as long as the machines' user namespaces belong to
// one host user).
const (
	MaxInotifyInstances = 32
	MaxInotifyWatches   = 32768
)

// setUserNSLimits writes the machine's user namespace limits. It runs
// before the machine's filesystem is built, through the /proc it was born
// with: the sysctls under /proc/sys/user are those of the writer's user
// namespace, whichever procfs shows them. A sysctl the kernel lacks is
// skipped.
func setUserNSLimits(maxSessions int) error {
	for name, v := range userNSLimits(maxSessions) {
		err := os.WriteFile("/proc/sys/user/"+name, []byte(strconv.Itoa(v)), 0)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("user namespace limit %s: %w", name, err)
		}
	}
	return nil
}
