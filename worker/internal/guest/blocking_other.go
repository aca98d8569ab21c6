//go:build mips || mipsle || mips64 || mips64le || ppc64 || ppc64le

package guest

import "golang.org/x/sys/unix"

// setBlocking clears O_NONBLOCK on fd's open file description.
func setBlocking(fd int) error {
	return unix.SetNonblock(fd, false)
}
