package sandbox

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestNullInputReplaced is an attack on the process, not the command: code
// that closes a descriptor it does not own frees the shared /dev/null's
// number, and an open of a private file takes it. A host command must then
// not get that file as its input.
func TestNullInputReplaced(t *testing.T) {
	null := nullInput()
	if null == nil {
		t.Fatal("no shared /dev/null")
	}
	fd := int(null.Fd())
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	other, err := unix.Open(secret, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		// Put the null device back under the number, for later tests.
		if n, err := unix.Open(os.DevNull, unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
			_ = unix.Dup3(n, fd, unix.O_CLOEXEC)
			unix.Close(n)
		}
	}()
	if err := unix.Dup3(other, fd, unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	unix.Close(other)
	if f := nullInput(); f != nil {
		t.Fatalf("nullInput returned descriptor %d, which now names %s", f.Fd(), secret)
	}
}
