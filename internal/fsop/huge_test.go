package fsop

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestHugeDirectoryBoundedMemory: listing a directory of many entries
// (whoever controls the tree makes them) holds no more names than the
// listing's limit and a read's chunk: a listing of 1
// entry of a directory of 12,000 entries with 200-byte names holds far
// less than the names' 2.4 MB.
func TestHugeDirectoryBoundedMemory(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "huge")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	dfd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	pad := strings.Repeat("x", 190)
	const entries = 12000
	for i := range entries {
		if err := unix.Mknodat(dfd, fmt.Sprintf("%s%08d", pad, i), unix.S_IFREG|0o644, 0); err != nil {
			t.Fatal(err)
		}
	}
	unix.Close(dfd)
	r, err := OpenRoot(base)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// What the listing holds while it calls fn: the live heap then,
	// against the live heap before.
	const bound = 1 << 20 // 12000 × 200 bytes would be 2.4 MB
	live := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	var got []string
	var held uint64
	before := live()
	trunc, err := r.List("huge", 1, 1, func(s Stat) error {
		held = live()
		got = append(got, s.Name)
		return nil
	})
	if err != nil || !trunc {
		t.Errorf("List: truncated %v, %v", trunc, err)
	}
	if held > before && held-before > bound {
		t.Errorf("a listing of 1 entry of a directory of %d entries held %d bytes, want at most %d", entries, held-before, bound)
	}
	if want := pad + "00000000"; len(got) != 1 || got[0] != want {
		t.Errorf("List's first entry = %v, want the smallest name", got)
	}
	ifd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ifd)
	// Watches and removals read the names a chunk at a time (they
	// allocate each name once, so only their result is checked here).
	if _, err := r.Watch(ifd, "huge", true, 10, func(int, string) error { return nil }); err != nil {
		t.Errorf("Watch: %v", err)
	}
	if err := r.Remove("huge", true); err != nil {
		t.Errorf("Remove: %v", err)
	}
	if _, err := os.Lstat(dir); !os.IsNotExist(err) {
		t.Errorf("the directory survived its removal: %v", err)
	}
}

// TestListBytesBounded: a listing ends, truncated, once its entries'
// strings pass MaxListBytes, however few entries that is (symlinks of
// 4 KiB targets).
func TestListBytesBounded(t *testing.T) {
	base := t.TempDir()
	target := strings.Repeat("t/", 2000)
	const links = 2500 // 2500 × 4000 bytes: 10 MB of targets
	for i := range links {
		if err := os.Symlink(target, filepath.Join(base, fmt.Sprintf("l%05d", i))); err != nil {
			t.Fatal(err)
		}
	}
	r, err := OpenRoot(base)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	size, n := 0, 0
	trunc, err := r.List("", 1, 10000, func(s Stat) error {
		size += len(s.Name) + len(s.Rel) + len(s.Target)
		n++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !trunc || size > MaxListBytes || n == 0 {
		t.Errorf("listed %d entries, %d bytes, truncated %v; want truncated at most %d bytes", n, size, trunc, MaxListBytes)
	}
}
