package guest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// A session sees the /proc of its own pid namespace. Every holder is
// spawned in a mount namespace of its own as well as a pid namespace (a
// copy of the init's, taken at the spawn), and before it serves a session
// the thread that spawned it mounts over that copy's /proc a procfs of the
// holder's pid namespace, with Docker's masks (sessionProc). The init
// mounts it itself: procfs's "pidns" option (Linux 6.17) names the pid
// namespace to show, which otherwise is the mounter's own, so nothing has
// to run inside the new namespace first and a holder stays a one-thread
// sleep. Where procfs lacks that option, a holder is this binary, which
// mounts its own (ownProc) before it reports ready. The fork of a session enters both of its holder's namespaces
// (enterHolder), so the session's $$, ps, kill and /proc/PID agree, and
// /proc/self/fd is its own. The machine's /proc (its pid namespace's)
// remains in the init's mount namespace, which no session is in.
//
// Entering a mount namespace changes a thread's root and working
// directory, which a thread shares with every other thread of the
// process unless it has unshared them (unshareFS): every thread that
// enters holders' namespaces is locked to its goroutine forever, so that
// the runtime never runs anything else on it.

// Docker's masks (moby's oci.DefaultLinuxSpec, MaskedPaths and
// ReadonlyPaths): what a masked file or directory would show is of the
// host's kernel (key serials, timers, hardware, interrupts counts used as
// side channels), and a read-only one's writes reach the kernel. Absent
// paths are skipped. Also masked: /proc/cmdline, the host's kernel
// command line. /proc/meminfo, /proc/stat and /proc/cpuinfo stay the
// host's (virtualising them as lxcfs does is out of scope).
var (
	procMasked = []string{
		"asound", "acpi", "interrupts", "kcore", "keys", "latency_stats",
		"timer_list", "timer_stats", "sched_debug", "scsi", "cmdline",
	}
	procReadOnly = []string{"bus", "fs", "irq", "sys", "sysrq-trigger"}
	// sysMasked are masked once, in the machine's sysfs; every holder's
	// mount namespace is a copy of the init's.
	sysMasked = []string{"firmware", "devices/virtual/powercap"}
)

// unshareFS gives the calling thread a root and working directory of its
// own, which setns into a mount namespace requires. The thread must be
// locked (runtime.LockOSThread) and never unlocked: Go would otherwise
// run other goroutines on it with that root, or in the namespaces it last
// entered. Any such thread may then fork sessions (enterHolder, fork,
// nsHome.restore) and spawn holders (holderPool.spawn); the threads that
// fork sessions run under the sessions' syscall policy, which refuses the
// mounts a spawn makes, so only the pool's spawner spawns (spawnNow).
func unshareFS() error {
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return fmt.Errorf("unshare fs: %w", err)
	}
	return nil
}

// nsHome names the init's own pid and mount namespaces, to which a thread
// returns after it entered a holder's.
type nsHome struct{ pid, mnt int }

// openNSHome opens the calling thread's namespaces. Call it from a thread
// that is in the init's.
func openNSHome() (nsHome, error) {
	home := nsHome{pid: -1, mnt: -1}
	var err error
	if home.pid, err = unix.Open("/proc/thread-self/ns/pid", unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
		return home, fmt.Errorf("open own pid namespace: %w", err)
	}
	if home.mnt, err = unix.Open("/proc/thread-self/ns/mnt", unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
		unix.Close(home.pid)
		return nsHome{-1, -1}, fmt.Errorf("open own mount namespace: %w", err)
	}
	return home, nil
}

// enterHolder moves the calling thread into h's mount namespace and
// points its pid_ns_for_children at h's pid namespace (one setns through
// the pidfd, all or nothing), so that its next fork is a process of h's
// namespaces. The thread must have unshared its fs (unshareFS) and must
// go back (nsHome.restore) before it does anything else.
func enterHolder(h *holder) error {
	return unix.Setns(h.pidfd, unix.CLONE_NEWPID|unix.CLONE_NEWNS)
}

// restore returns the calling thread to the init's namespaces (its root
// and working directory become the init's root). A thread that cannot
// return must not go on: the caller exits.
func (home nsHome) restore() error {
	if err := unix.Setns(home.mnt, unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("return to the init's mount namespace: %w", err)
	}
	if err := unix.Setns(home.pid, unix.CLONE_NEWPID); err != nil {
		return fmt.Errorf("return to the init's pid namespace: %w", err)
	}
	return nil
}

// pidnsOption reports whether procfs takes the pidns option (Linux 6.17).
// Where it does not, a holder mounts its /proc itself (see
// holderPool.selfMount).
var pidnsOption = sync.OnceValue(func() bool {
	ns, err := unix.Open("/proc/thread-self/ns/pid", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(ns)
	fs, err := unix.Fsopen("proc", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return false
	}
	defer unix.Close(fs)
	return unix.FsconfigSetFd(fs, "pidns", ns) == nil
})

// newProc returns a detached procfs mount (nosuid, nodev, noexec) showing
// the pid namespace open as pidns, or, if pidns is negative, the caller's
// own. The kernel requires a fully visible procfs in the caller's mount
// namespace before it mounts one in a user namespace: the machine's /proc,
// still attached.
func newProc(pidns int) (int, error) {
	fs, err := unix.Fsopen("proc", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsopen proc: %w", err)
	}
	defer unix.Close(fs)
	if pidns >= 0 {
		if err := unix.FsconfigSetFd(fs, "pidns", pidns); err != nil {
			return -1, fmt.Errorf("procfs pidns: %w", err)
		}
	}
	if err := unix.FsconfigCreate(fs); err != nil {
		return -1, fmt.Errorf("create procfs: %w", err)
	}
	mnt, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsmount proc: %w", err)
	}
	return mnt, nil
}

// procFor returns a detached procfs mount of h's pid namespace, made from
// the init's mount namespace.
func procFor(h *holder) (int, error) {
	ns, err := unix.Open("/proc/"+strconv.Itoa(h.pid)+"/ns/pid", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open holder's pid namespace: %w", err)
	}
	defer unix.Close(ns)
	return newProc(ns)
}

// ownProc is what a holder that mounts its /proc itself (a Go holder where
// procfs lacks the pidns option) runs first, as PID 1 of its namespaces.
func ownProc() error {
	mnt, err := newProc(-1)
	if err != nil {
		return err
	}
	defer unix.Close(mnt)
	return replaceProc(mnt)
}

// sessionProc replaces the /proc of h's mount namespace by a procfs of
// h's pid namespace, with Docker's masks. It runs on a locked thread that
// has unshared its fs (unshareFS), in the init's namespaces, and returns
// there; if it cannot, the init exits (fail reports why first).
func sessionProc(h *holder, home nsHome, fail func(error)) error {
	mnt, err := procFor(h)
	if err != nil {
		return err
	}
	defer unix.Close(mnt)
	if err := unix.Setns(h.pidfd, unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("enter holder's mount namespace: %w", err)
	}
	err = replaceProc(mnt)
	if rerr := unix.Setns(home.mnt, unix.CLONE_NEWNS); rerr != nil {
		fail(fmt.Errorf("return to the init's mount namespace: %w", rerr))
		os.Exit(1)
	}
	return err
}

// replaceProc, in a holder's mount namespace, detaches the machine's
// /proc and attaches mnt there, masked. Detached rather than covered, so
// that the machine's procfs (every process of the machine) is in no
// session's mount table. The masks also keep the kernel from mounting an
// unmasked procfs for a process that gained a user namespace of its own:
// it requires a fully visible procfs in the mount namespace first.
func replaceProc(mnt int) error {
	// A machine's mounts are all private already; this keeps a holder's
	// changes its own wherever it was spawned from (a copy of a mount
	// namespace with shared mounts would propagate them).
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make holder's mounts private: %w", err)
	}
	if err := unix.Unmount("/proc", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach machine's /proc: %w", err)
	}
	if err := unix.MoveMount(mnt, "", unix.AT_FDCWD, "/proc", unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attach session /proc: %w", err)
	}
	if err := mask("/proc", procMasked, os.DevNull); err != nil {
		return err
	}
	return readOnly("/proc", procReadOnly)
}

// mask hides each of names under dir that exists: a file under null (the
// path of /dev/null), a directory under an empty read-only tmpfs.
func mask(dir string, names []string, null string) error {
	for _, name := range names {
		p := filepath.Join(dir, name)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			continue
		}
		var err error
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			err = unix.Mount("tmpfs", p, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=4k,mode=0555")
		} else {
			err = unix.Mount(null, p, "", unix.MS_BIND, "")
		}
		if err != nil {
			return fmt.Errorf("mask %s: %w", p, err)
		}
	}
	return nil
}

// readOnly binds each of names under dir that exists onto itself,
// read-only (and nosuid, nodev, noexec).
func readOnly(dir string, names []string) error {
	for _, name := range names {
		p := filepath.Join(dir, name)
		if err := unix.Mount(p, p, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			return fmt.Errorf("bind %s: %w", p, err)
		}
		if err := unix.MountSetattr(unix.AT_FDCWD, p, unix.AT_RECURSIVE, &unix.MountAttr{
			Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOEXEC,
		}); err != nil {
			return fmt.Errorf("make %s read-only: %w", p, err)
		}
	}
	return nil
}

// maskSys applies Docker's sysfs masks to the machine's sysfs at dir,
// with the per-CPU thermal_throttle directories moby masks too; null is
// the path of /dev/null.
func maskSys(dir, null string) error {
	names := sysMasked
	cpus, _ := filepath.Glob(filepath.Join(dir, "devices/system/cpu/cpu[0-9]*/thermal_throttle"))
	for _, c := range cpus {
		rel, err := filepath.Rel(dir, c)
		if err == nil {
			names = append(names[:len(names):len(names)], rel)
		}
	}
	return mask(dir, names, null)
}
