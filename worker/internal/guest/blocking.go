//go:build !(mips || mipsle || mips64 || mips64le || ppc64 || ppc64le)

package guest

import "golang.org/x/sys/unix"

// fionbio is FIONBIO, which golang.org/x/sys/unix does not name: the same
// number on every architecture this file builds for.
const fionbio = 0x5421

// setBlocking clears O_NONBLOCK on fd's open file description. FIONBIO
// does it, and only it, on any kind of file in one system call (fcntl
// would take two: F_GETFL, then F_SETFL).
func setBlocking(fd int) error {
	return unix.IoctlSetPointerInt(fd, fionbio, 0)
}
