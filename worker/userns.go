package worker

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// startOwnedBy runs start — which must create the machine's user
// namespace, exec.Cmd.Start with CLONE_NEWUSER and id mappings — on a
// thread of its own whose effective uid and gid are uid and gid (the
// machine's guest root on the host), so that the namespace is owned by
// that unprivileged id rather than by host root.
//
// Why: the kernel charges what a process in a user namespace creates
// (inotify instances and watches, user namespaces, mount namespaces, …:
// the ucounts behind /proc/sys/user/max_*) to its id in its own namespace
// and to the owner of each ancestor namespace, up to the initial one,
// against each level's limits. With root as the owner, one machine could
// exhaust host root's quotas (fs.inotify.max_user_instances is per user)
// for every other machine and the host.
//
// Only this thread changes: setresuid(2) through the raw system call
// (syscall.Setuid would change every thread of the worker), the real and
// saved ids stay 0, so the permitted capabilities survive the change of
// the effective uid and the effective ones, which the kernel clears, are
// raised again: the thread keeps CAP_SETUID, CAP_SETGID and CAP_SETFCAP
// in the initial namespace, which Go's fork needs to write the child's
// uid_map and gid_map (it writes them from the calling thread, after
// clone). The thread is never unlocked: it ends with its goroutine, and
// its credentials with it.
//
// A side effect: changing a thread's credentials makes the worker process
// non-dumpable (no core dumps; its /proc files stay root's).
func startOwnedBy(uid, gid uint32, start func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		errc <- func() error {
			hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
			var caps [2]unix.CapUserData
			if err := unix.Capget(&hdr, &caps[0]); err != nil {
				return fmt.Errorf("capget: %w", err)
			}
			const keep = ^uintptr(0) // -1: leave that id unchanged
			if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, keep, uintptr(gid), keep); e != 0 {
				return fmt.Errorf("setresgid: %w", e)
			}
			if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, keep, uintptr(uid), keep); e != 0 {
				return fmt.Errorf("setresuid: %w", e)
			}
			if err := unix.Capset(&hdr, &caps[0]); err != nil {
				return fmt.Errorf("capset: %w", err)
			}
			return start()
		}()
		// No UnlockOSThread: the runtime terminates the thread.
	}()
	return <-errc
}
