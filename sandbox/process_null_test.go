package sandbox

import (
	"testing"

	"golang.org/x/sys/unix"
)

// TestNullInputOwnDescription: each host command's /dev/null input is an
// open file description of its own: status flags one command sets on its
// input (fcntl F_SETFL) are not another's. A shared one was a channel
// between confined commands of any projects, and let one make every other
// command's input nonblocking.
func TestNullInputOwnDescription(t *testing.T) {
	a, b := nullInput(), nullInput()
	if a == nil || b == nil {
		t.Fatal("no /dev/null")
	}
	defer a.Close()
	defer b.Close()
	var sa, sb unix.Stat_t
	if unix.Fstat(int(a.Fd()), &sa) != nil || unix.Fstat(int(b.Fd()), &sb) != nil || sa.Rdev != unix.Mkdev(1, 3) || sb.Rdev != sa.Rdev {
		t.Fatal("not the null device")
	}
	fl, err := unix.FcntlInt(a.Fd(), unix.F_GETFL, 0)
	if err != nil {
		t.Fatal(err)
	}
	if fl&unix.O_ACCMODE != unix.O_RDONLY {
		t.Fatalf("flags %o: not read-only", fl)
	}
	if _, err := unix.FcntlInt(a.Fd(), unix.F_SETFL, fl|unix.O_NONBLOCK|unix.O_APPEND); err != nil {
		t.Fatal(err)
	}
	got, err := unix.FcntlInt(b.Fd(), unix.F_GETFL, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got&(unix.O_NONBLOCK|unix.O_APPEND) != 0 {
		t.Fatalf("flags set on one command's input are another's: %o", got)
	}
}
