package confine

import (
	"fmt"

	llsys "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"
)

// privateProc gives the calling (locked, still privileged) thread a mount
// namespace of its own, a slave of the host's (host mounts and unmounts
// still reach it; nothing it mounts leaks back), with a procfs of its own
// on /proc mounted hidepid=invisible: a confined command, an unprivileged
// uid of its project's, sees in /proc only the processes it may ptrace —
// its own — and none of other tenants', guests' or the host's (command
// lines, environments, mount tables). Processes the thread forks inherit
// the namespace. The thread must be discarded afterwards (see
// prepareUser).
//
// The procfs belongs to the thread's pid namespace (the host's), not the
// command's tree: the command's own processes show with their host pids,
// which differ from what getpid returns inside the tree. A prepared thread
// serves many trees, each in a pid namespace of its own, and cannot mount
// once Landlock restricts it; a procfs per tree would cost the thread's
// reuse.
//
// ruleset, if not -1, gets a rule for the new /proc (Landlock rules bind
// to the inodes they were given: one built before the mount names the
// host's procfs, which the new mount covers).
func privateProc(ruleset int) error {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("confine: unshare(CLONE_NEWNS): %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("confine: make the mount namespace a slave: %w", err)
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "hidepid=invisible"); err != nil {
		return fmt.Errorf("confine: mount a private /proc: %w", err)
	}
	if ruleset < 0 {
		return nil
	}
	pfd, err := unix.Open("/proc", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("confine: open the private /proc: %w", err)
	}
	defer unix.Close(pfd)
	attr := llsys.PathBeneathAttr{AllowedAccess: uint64(readExec), ParentFd: pfd}
	if err := llsys.LandlockAddPathBeneathRule(ruleset, &attr, 0); err != nil {
		return fmt.Errorf("confine: landlock rule for the private /proc: %w", err)
	}
	return nil
}
