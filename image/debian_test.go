package image_test

import (
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/image/imagetest"
)

// TestDebian imports a real Debian root filesystem (mmdebstrap minbase)
// and checks what a root filesystem carries: set-id binaries (kept, owned
// by the store's ids), device nodes (skipped), absolute symlinks (kept),
// and that its programs run on it.
func TestDebian(t *testing.T) {
	s, _ := newStore(t)
	src := imagetest.Debian(t)
	start := time.Now()
	im, err := s.Import(context.Background(), src, "debian")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Debian imported in %v (%d layers, %d MiB)", time.Since(start).Round(time.Millisecond), len(im.Layers), im.Size>>20)
	root := im.Layers[0]
	setid, devices, below := 0, 0, 0
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		st := lstat(t, p)
		if st.Uid < s.IDs().Start || st.Gid < s.IDs().Start {
			below++
		}
		if st.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 && st.Mode&unix.S_IFMT == unix.S_IFREG {
			setid++
		}
		if t := st.Mode & unix.S_IFMT; t == unix.S_IFBLK || t == unix.S_IFIFO || t == unix.S_IFCHR && st.Rdev != 0 {
			devices++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if below != 0 || devices != 0 || setid == 0 {
		t.Errorf("%d files owned below the store's ids, %d devices, %d set-id files (want 0, 0, some)", below, devices, setid)
	}
	if st := lstat(t, filepath.Join(root, "usr/bin/su")); st.Mode&unix.S_ISUID == 0 || st.Uid != s.IDs().Start {
		t.Errorf("su mode %o owner %d", st.Mode, st.Uid)
	}
	for _, p := range []string{"etc/debian_version", "usr/bin/dpkg", "var/lib/dpkg/status"} {
		if _, err := os.Stat(filepath.Join(root, p)); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
	bwrap, err := exec.LookPath("bwrap")
	if err != nil {
		t.Skip("bwrap not installed: not running the image's programs")
	}
	out, err := exec.Command(bwrap, "--ro-bind", root, "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
		"--unshare-user", "--uid", "0", "--gid", "0", "--clearenv", "--setenv", "PATH", "/usr/bin:/bin",
		"/bin/sh", "-c", "cat /etc/debian_version; dpkg-query -W -f='${Package}\n' dpkg").CombinedOutput()
	if err != nil || !strings.HasSuffix(string(out), "\ndpkg\n") {
		t.Errorf("in the image: %v\n%s", err, out)
	}
}
