package guest

import "golang.org/x/sys/unix"

func setIDFilterForArch() []unix.SockFilter {
	return setIDFilter(unix.AUDIT_ARCH_X86_64, true, []modeRule{
		{unix.SYS_CHMOD, 1}, {unix.SYS_FCHMOD, 1}, {unix.SYS_FCHMODAT, 2}, {unix.SYS_FCHMODAT2, 2},
		{unix.SYS_OPEN, 2}, {unix.SYS_OPENAT, 3}, {unix.SYS_CREAT, 1},
		{unix.SYS_MKNOD, 1}, {unix.SYS_MKNODAT, 2},
	}, []uint32{unix.SYS_OPENAT2, unix.SYS_IO_URING_SETUP})
}
