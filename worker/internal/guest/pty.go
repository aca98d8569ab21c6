package guest

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/worker/internal/ctl"
)

// ptmxPath is the machine's devpts multiplexer. The init opens it rather
// than /dev/ptmx, a symlink on the machine's /dev (a tmpfs that guest
// root may change); /dev/pts is a mount point no session can replace.
const ptmxPath = "/dev/pts/ptmx"

// openPTY allocates a pseudo-terminal of the machine's own devpts (the
// init's mount namespace is the machine's, of which the holders' are
// copies: the same devpts instance) sized ws, whose slave belongs to uid
// (as login programs do). The master is non-blocking (the worker's client
// puts it in its poller); the slave, blocking, is what the session's
// programs get. Both are close-on-exec.
func openPTY(ws *ctl.Winsize, uid uint32) (master, slave int, err error) {
	master, err = unix.Open(ptmxPath, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC|unix.O_NONBLOCK|unix.O_NOFOLLOW, 0)
	if err != nil {
		return -1, -1, fmt.Errorf("open %s: %w", ptmxPath, err)
	}
	fail := func(what string, err error) (int, int, error) {
		unix.Close(master)
		return -1, -1, fmt.Errorf("pty: %s: %w", what, err)
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(master, &fs); err != nil {
		return fail("statfs", err)
	}
	if fs.Type != unix.DEVPTS_SUPER_MAGIC {
		return fail("check", fmt.Errorf("%s is not on a devpts", ptmxPath))
	}
	if err := unix.IoctlSetPointerInt(master, unix.TIOCSPTLCK, 0); err != nil {
		return fail("unlock", err)
	}
	if err := unix.IoctlSetWinsize(master, unix.TIOCSWINSZ, &unix.Winsize{Row: ws.Rows, Col: ws.Cols}); err != nil {
		return fail("set size", err)
	}
	// TIOCGPTPEER opens the slave of this master, whatever the paths.
	r, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(master), unix.TIOCGPTPEER, uintptr(unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC))
	if errno != 0 {
		return fail("open slave", errno)
	}
	slave = int(r)
	// Best effort: the terminal is the session user's (mesg, write), as
	// login programs make it; a session works without.
	_ = unix.Fchown(slave, int(uid), -1)
	return master, slave, nil
}
