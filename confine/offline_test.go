package confine

import (
	"os"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// TestOfflineDescriptorReplaced is an attack on the process, not the
// command: code that closes a descriptor it does not own (a double close)
// frees the offline network namespace's number, and an open of the host's
// namespace takes it. A confined start must then still land in an offline
// namespace, never the host's.
func TestOfflineDescriptorReplaced(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces)")
	}
	fd, _, ino, err := offlineNetwork()
	if err != nil {
		t.Fatal(err)
	}
	if fd < offlineFDMin {
		t.Errorf("offline descriptor %d, want it moved to %d or above", fd, offlineFDMin)
	}
	host, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0) // this goroutine's thread never changed it
	if err != nil {
		t.Fatal(err)
	}
	var hostSt unix.Stat_t
	if err := unix.Fstat(host, &hostSt); err != nil {
		t.Fatal(err)
	}
	// The "other owner" closes fd and the host's namespace reuses its number.
	if err := unix.Dup3(host, fd, unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	unix.Close(host)

	type result struct {
		ino uint64
		err error
	}
	c := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread is discarded
		if err := enterOffline(); err != nil {
			c <- result{err: err}
			return
		}
		var st unix.Stat_t
		err := unix.Stat("/proc/thread-self/ns/net", &st)
		c <- result{st.Ino, err}
	}()
	r := <-c
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.ino == hostSt.Ino {
		t.Fatal("a confined thread entered the host's network namespace through a replaced descriptor")
	}
	if r.ino == ino {
		t.Fatal("the thread is in the first offline namespace, which the test's descriptor no longer names")
	}
	unix.Close(fd) // the host namespace's copy, which nothing owns now
	if _, _, now, _ := offlineNetwork(); now != r.ino {
		t.Errorf("offlineNetwork names namespace %d, the thread is in %d", now, r.ino)
	}
}

// TestStaticInitDescriptorReplaced: if the static init's memfd number is
// closed by a non-owner and reused for another file, staticInit makes a
// new memfd instead of naming that file.
func TestStaticInitDescriptorReplaced(t *testing.T) {
	first := staticInit()
	if first == "" {
		t.Skip("no static init on this machine")
	}
	fd := static.fd
	if fd < offlineFDMin {
		t.Errorf("static init descriptor %d, want it moved to %d or above", fd, offlineFDMin)
	}
	other, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Dup3(other, fd, unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	unix.Close(other)
	defer unix.Close(fd) // /dev/null's copy, which nothing owns now
	again := staticInit()
	if again == "" || again == first {
		t.Fatalf("staticInit after its descriptor was replaced = %q (was %q)", again, first)
	}
	var st unix.Stat_t
	if err := unix.Stat(again, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size == 0 {
		t.Fatalf("the new static init %s: %+v %v", again, st, err)
	}
}

// TestStaticInitThreadAllowsNothing: the thread that starts the static init
// (and so the init, which inherits its domain) may open no file, not even
// beneath the system directories, nor connect over TCP; it still executes
// the static init.
func TestStaticInitThreadAllowsNothing(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (the thread drops capabilities)")
	}
	if _, err := Available(); err != nil {
		t.Skip(err)
	}
	if staticInit() == "" {
		t.Skip("no static init on this machine")
	}
	var openErr, connErr error
	err := onPrepared("test\x00static-init", prepareStaticInit, func() bool {
		var fd int
		fd, openErr = unix.Open("/etc/passwd", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if openErr == nil {
			unix.Close(fd)
		}
		s, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			connErr = err
			return false
		}
		connErr = unix.Connect(s, &unix.SockaddrInet4{Port: 9, Addr: [4]byte{127, 0, 0, 1}})
		unix.Close(s)
		return false
	})
	if err != nil {
		t.Fatal(err)
	}
	if openErr != unix.EACCES {
		t.Errorf("open /etc/passwd on the static init's thread: %v, want EACCES", openErr)
	}
	if abi, _ := Available(); abi >= 4 && connErr != unix.EACCES {
		t.Errorf("TCP connect on the static init's thread: %v, want EACCES", connErr)
	}
	p, err := newInit("")
	if err != nil {
		t.Fatalf("start the static init: %v", err)
	}
	if p.exited() {
		t.Fatal("the static init exited at once")
	}
	p.discard()
}
