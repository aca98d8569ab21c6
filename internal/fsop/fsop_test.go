package fsop

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// tree makes a root with a file, a FIFO and symlinks that try to leave it,
// and a secret outside it.
func tree(t *testing.T) (*Root, string) {
	t.Helper()
	base := t.TempDir()
	root := filepath.Join(base, "root")
	secret := filepath.Join(base, "secret")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(root, "d"), 0o755))
	must(os.WriteFile(secret, []byte("SECRET"), 0o644))
	must(os.WriteFile(filepath.Join(root, "d", "f"), []byte("inside"), 0o644))
	must(os.Symlink(secret, filepath.Join(root, "abs")))
	must(os.Symlink("../../../../../../../"+secret, filepath.Join(root, "rel")))
	must(os.Symlink("/proc/self/root"+secret, filepath.Join(root, "proc")))
	must(os.Symlink("loop", filepath.Join(root, "loop")))
	must(unix.Mkfifo(filepath.Join(root, "fifo"), 0o644))
	r, err := OpenRoot(root)
	must(err)
	t.Cleanup(func() { r.Close() })
	return r, secret
}

func TestClean(t *testing.T) {
	for _, p := range []string{"", "a", "a/b", "a.b/..c"} {
		if err := Clean(p); err != nil {
			t.Errorf("Clean(%q): %v", p, err)
		}
	}
	for _, p := range []string{"/a", "a/", "a//b", "..", "a/../b", "./a", "a/.", "a\x00b"} {
		if err := Clean(p); !errors.Is(err, ErrBadPath) {
			t.Errorf("Clean(%q) = %v, want ErrBadPath", p, err)
		}
	}
}

// TestNoEscape: no symlink reads or writes outside the root.
func TestNoEscape(t *testing.T) {
	r, secret := tree(t)
	if f, _, err := r.Read("d/f"); err != nil {
		t.Fatal(err)
	} else {
		f.Close()
	}
	for _, p := range []string{"abs", "rel", "proc", "loop", "fifo"} {
		f, _, err := r.Read(p)
		if err == nil {
			b := make([]byte, 16)
			n, _ := f.Read(b)
			f.Close()
			t.Fatalf("Read(%q) opened %q", p, b[:n])
		}
		if c := Code(err); c != CodeNotFound && c != CodeBadPath {
			t.Errorf("Read(%q): %v (%s)", p, err, c)
		}
	}
	// A write over a symlink replaces the link, not its target.
	f, tmp, err := r.Create("abs")
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("new")
	f.Close()
	if err := r.Rename(tmp, "abs"); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(secret); string(b) != "SECRET" {
		t.Fatalf("the secret was written: %q", b)
	}
	if err := r.Mkdir("rel/x", 0, true); err == nil {
		if _, err := os.Stat(filepath.Join(filepath.Dir(secret), "x")); err == nil {
			t.Fatal("mkdir through a symlink made a directory outside")
		}
	}
	if err := r.Remove("", true); !errors.Is(err, ErrBadPath) {
		t.Errorf("Remove of the root: %v", err)
	}
	st, err := r.Stat("abs")
	if err != nil || st.Type != "file" {
		t.Errorf("Stat after the replace: %+v %v", st, err)
	}
	var names []string
	if _, err := r.List("", 2, 100, func(s Stat) error { names = append(names, s.Rel); return nil }); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(names, ","); got != "abs,d,d/f,fifo,loop,proc,rel" {
		t.Errorf("List: %s", got)
	}
}

// TestRunAsUser: Run checks every access with the user's ids, not the
// caller's (root's), and what it creates is the user's.
func TestRunAsUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: Run switches the thread's ids")
	}
	r, _ := tree(t)
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	if err := os.WriteFile(filepath.Join(dir, "private"), []byte("p"), 0o600); err != nil {
		t.Fatal(err)
	}
	pub, err := OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	nobody := &Cred{UID: 65534, GID: 65534}
	err = Run(nobody, func() error {
		f, _, err := pub.Read("private")
		if err == nil {
			f.Close()
		}
		return err
	})
	if Code(err) != CodePermission {
		t.Errorf("read of root's 0600 file as nobody: %v", err)
	}
	if err := Run(nobody, func() error { _, _, err := pub.Create("new"); return err }); Code(err) != CodePermission {
		t.Errorf("create in root's 0755 directory as nobody: %v", err)
	}
	os.Chmod(dir, 0o777)
	var tmp string
	if err := Run(nobody, func() error {
		f, p, err := pub.Create("new")
		if err == nil {
			f.Close()
			tmp = p
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(dir, tmp), &st); err != nil || st.Uid != 65534 || st.Gid != 65534 {
		t.Errorf("created file: %+v %v", st, err)
	}
	// The caller's own thread is untouched.
	if err := Run(nil, func() error {
		f, _, err := pub.Read("private")
		if err == nil {
			f.Close()
		}
		return err
	}); err != nil {
		t.Errorf("read as root afterwards: %v", err)
	}
	_ = r
}

// TestRunChargesTheUser: an inotify instance made in Run is charged to
// the user (the thread's real uid), not to the caller.
func TestRunChargesTheUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: Run switches the thread's ids")
	}
	var ruid, euid, suid int
	if err := Run(&Cred{UID: 65534, GID: 65534}, func() error {
		var r, e, s uintptr
		unix.RawSyscall(unix.SYS_GETRESUID, uintptr(unsafe.Pointer(&r)), uintptr(unsafe.Pointer(&e)), uintptr(unsafe.Pointer(&s)))
		ruid, euid, suid = int(uint32(r)), int(uint32(e)), int(uint32(s))
		f, err := NewInotify()
		if err == nil {
			f.Close()
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if ruid != 65534 || euid != 65534 || suid != 0 {
		t.Errorf("thread ids %d/%d/%d, want 65534/65534/0", ruid, euid, suid)
	}
}

// TestReadDuringReplacements: a reader racing writers that rename whole new
// versions over a file gets one whole version each time, never an error
// (the file changing between Read's look and its open is looked at again).
func TestReadDuringReplacements(t *testing.T) {
	dir := t.TempDir()
	r, err := OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	versions := [][]byte{[]byte(strings.Repeat("A", 4096)), []byte(strings.Repeat("B", 4096))}
	if err := os.WriteFile(filepath.Join(dir, "f"), versions[0], 0o644); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			tmp := filepath.Join(dir, "tmp")
			if err := os.WriteFile(tmp, versions[i%2], 0o644); err != nil {
				done <- err
				return
			}
			if err := os.Rename(tmp, filepath.Join(dir, "f")); err != nil {
				done <- err
				return
			}
		}
	}()
	defer func() {
		close(stop)
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	for i := 0; i < 20000; i++ {
		f, st, err := r.Read("f")
		if err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
		b := make([]byte, 8192)
		n, _ := f.Read(b)
		f.Close()
		if st.Size != 4096 || n != 4096 || (string(b[:n]) != string(versions[0]) && string(b[:n]) != string(versions[1])) {
			t.Fatalf("read %d: %d bytes (stat %d): not one whole version", i, n, st.Size)
		}
	}
}
