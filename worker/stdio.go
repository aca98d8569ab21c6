package worker

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// checkStdio reports why descriptors received as a session's standard
// input, output and error (exec-attach, exec-run) cannot be given to a
// command inside a machine, or "" if they can: each must be a Unix socket
// (the gateway's are socketpairs), a pipe, or the null device, opened for
// I/O. Any other descriptor would reach outside the machine whatever its
// mount namespace: a directory (openat, fchdir, /proc/self/fd/0/..), a
// host file or device, an O_PATH descriptor (which /proc/self/fd reopens,
// a socket file's to connect to it), a memfd or pidfd, a socket of the
// host's network. A socket costs one system call (getsockopt fails on an
// O_PATH descriptor), anything else two.
func checkStdio(fds []int) string {
	for i, fd := range fds {
		domain, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
		if err == nil {
			if domain != unix.AF_UNIX {
				return fmt.Sprintf("stdio descriptor %d is a socket of family %d, not a Unix socket", i, domain)
			}
			continue
		}
		fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
		if err != nil {
			return fmt.Sprintf("stdio descriptor %d: %v", i, err)
		}
		if fl&unix.O_PATH != 0 {
			return fmt.Sprintf("stdio descriptor %d is an O_PATH descriptor", i)
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return fmt.Sprintf("stdio descriptor %d: %v", i, err)
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFIFO:
		case unix.S_IFCHR:
			if st.Rdev != unix.Mkdev(1, 3) {
				return fmt.Sprintf("stdio descriptor %d is a device other than the null device", i)
			}
		default:
			return fmt.Sprintf("stdio descriptor %d is not a socket, a pipe or the null device (file type %#o)", i, st.Mode&unix.S_IFMT)
		}
	}
	return ""
}

// refuseAttach ends s, if still pending, because its exec-attach's
// descriptors were refused (checkStdio): they are closed, and the session
// ends not started, as a cancelled pending one does. It reports false,
// having closed the descriptors too, if s was not pending.
func (m *machine) refuseAttach(s *session, stdio []int, why string) bool {
	closeFDs(stdio)
	return m.endNotStarted(s, statePending, why)
}
