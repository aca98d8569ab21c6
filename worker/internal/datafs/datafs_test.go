package datafs

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/internal/mountpin"
)

// openTemp opens a data filesystem of size bytes in a temporary
// directory, closed (and its loop device awaited gone) at cleanup.
func openTemp(t *testing.T, size int64) *FS {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (loop devices, mount)")
	}
	dir := t.TempDir()
	fs, err := Open(filepath.Join(dir, "data.img"), filepath.Join(dir, "data"), size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := fs.Close(); err != nil {
			t.Error(err)
		}
		AwaitDetached(t, fs.Image)
	})
	return fs
}

// AwaitDetached fails t unless no loop device is backed by image within
// a few seconds (autoclear detaches it once the filesystem is gone).
func AwaitDetached(t testing.TB, image string) {
	t.Helper()
	mountpin.Await(t, image)
}

// allocated is what the file at path takes on the host filesystem (its
// blocks): what the test's writes cost the host, whatever other processes
// on the same filesystem do meanwhile.
func allocated(t *testing.T, path string) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// fill writes 1 MiB chunks to path until an error or max bytes.
func fill(path string, max int64) (int64, error) {
	f, err := os.Create(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	var n int64
	for n < max {
		k, err := f.Write(buf)
		n += int64(k)
		if err != nil {
			return n, err
		}
	}
	return n, f.Sync()
}

func TestLimitAndReopen(t *testing.T) {
	fs := openTemp(t, 64<<20)
	if !fs.Created || fs.Size != 64<<20 {
		t.Fatalf("new image: %+v", fs)
	}
	d := filepath.Join(fs.Dir, "p")
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	// Past the image's size: ENOSPC, the host filesystem untouched.
	n, err := fill(filepath.Join(d, "big"), 1<<30)
	if !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("filling a 64 MiB image: %d bytes, err %v; want ENOSPC", n, err)
	}
	if n > 64<<20 {
		t.Errorf("wrote %d bytes into a 64 MiB image", n)
	}
	if used := allocated(t, fs.Image); used > 64<<20 {
		t.Errorf("the image takes %d MiB of the host filesystem", used>>20)
	}
	if err := os.Remove(filepath.Join(d, "big")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, "keep"), []byte("kept"), 0o644); err != nil {
		t.Fatalf("a small write after deleting: %v", err)
	}
	// Opening again while mounted takes the mount over.
	again, err := Open(fs.Image, fs.Dir, 64<<20)
	if err != nil || !again.Reused {
		t.Fatalf("reopening a mounted image: %+v, %v", again, err)
	}
	// Unmounted and reopened (e2fsck, a new loop device): data kept.
	if err := fs.Close(); err != nil {
		t.Fatal(err)
	}
	AwaitDetached(t, fs.Image)
	again, err = Open(fs.Image, fs.Dir, 64<<20)
	if err != nil || again.Created || again.Reused || again.Resized {
		t.Fatalf("reopening: %+v, %v", again, err)
	}
	if b, err := os.ReadFile(filepath.Join(d, "keep")); string(b) != "kept" {
		t.Fatalf("after reopening: %q, %v", b, err)
	}
}

func TestResize(t *testing.T) {
	fs := openTemp(t, 32<<20)
	if _, err := fill(filepath.Join(fs.Dir, "f"), 20<<20); err != nil {
		t.Fatal(err)
	}
	if err := fs.Close(); err != nil {
		t.Fatal(err)
	}
	AwaitDetached(t, fs.Image)
	// Grown: room for more.
	big, err := Open(fs.Image, fs.Dir, 96<<20)
	if err != nil || !big.Resized || big.Size != 96<<20 {
		t.Fatalf("growing: %+v, %v", big, err)
	}
	if n, err := fill(filepath.Join(fs.Dir, "g"), 40<<20); err != nil {
		t.Fatalf("writing 40 MiB more into the grown image: %d, %v", n, err)
	}
	if err := big.Close(); err != nil {
		t.Fatal(err)
	}
	AwaitDetached(t, fs.Image)
	// Shrunk below the data: kept as it is.
	small, err := Open(fs.Image, fs.Dir, 32<<20)
	if err != nil || small.Resized || small.Size != 96<<20 {
		t.Fatalf("shrinking below the data: %+v, %v", small, err)
	}
	if err := os.Remove(filepath.Join(fs.Dir, "g")); err != nil {
		t.Fatal(err)
	}
	if err := small.Close(); err != nil {
		t.Fatal(err)
	}
	AwaitDetached(t, fs.Image)
	// Shrunk where the data fits (resize2fs's estimate of the minimum
	// is conservative: 20 MiB of data in 96 MiB need about 48).
	small, err = Open(fs.Image, fs.Dir, 64<<20)
	if err != nil || !small.Resized || small.Size != 64<<20 {
		t.Fatalf("shrinking: %+v, %v", small, err)
	}
	if st, err := os.Stat(fs.Image); err != nil || st.Size() != 64<<20 {
		t.Fatalf("image after shrinking: %v, %v", st.Size(), err)
	}
	if st, err := os.Stat(filepath.Join(fs.Dir, "f")); err != nil || st.Size() != 20<<20 {
		t.Fatalf("data after shrinking: %v", err)
	}
}

// An image whose superblock records errors is checked before it is
// mounted; a clean one is not.
func TestErrorsChecked(t *testing.T) {
	fs := openTemp(t, 16<<20)
	if err := fs.Close(); err != nil {
		t.Fatal(err)
	}
	AwaitDetached(t, fs.Image)
	if hasErrors(fs.Image) {
		t.Fatal("a clean image has errors")
	}
	// What the kernel does on finding an inconsistency (s_state's
	// EXT4_ERROR_FS, the superblock's checksum updated).
	if out, err := exec.Command("tune2fs", "-E", "force_fsck", fs.Image).CombinedOutput(); err != nil {
		t.Fatalf("tune2fs: %v: %s", err, out)
	}
	if !hasErrors(fs.Image) {
		t.Fatal("an image marked with errors is not seen so")
	}
	again, err := Open(fs.Image, fs.Dir, 16<<20)
	if err != nil {
		t.Fatal(err)
	}
	if err := again.Close(); err != nil {
		t.Fatal(err)
	}
	AwaitDetached(t, fs.Image)
	if hasErrors(fs.Image) {
		t.Error("e2fsck did not run: the error mark is still there")
	}
}
