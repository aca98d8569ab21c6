package safepath

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestCheck(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("making files of other owners needs root")
	}
	tmp := t.TempDir()
	mk := func(p string, mode os.FileMode, uid int) string {
		t.Helper()
		p = filepath.Join(tmp, p)
		if err := os.Mkdir(p, mode); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Chmod(p, uint32(mode)); err != nil { // 0o1777 is sticky
			t.Fatal(err)
		}
		if err := os.Chown(p, uid, uid); err != nil {
			t.Fatal(err)
		}
		return p
	}
	link := func(p, target string, uid int) string {
		t.Helper()
		p = filepath.Join(tmp, p)
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(p, uid, uid); err != nil {
			t.Fatal(err)
		}
		return p
	}
	root := mk("root", 0o755, 0)
	mk("root/ws", 0o755, 0)
	eve := mk("eve", 0o755, 4242)
	mk("eve/ws", 0o755, 0)
	mk("eve/own", 0o755, 4242)
	open := mk("open", 0o777, 0)
	mk("open/ws", 0o755, 0)
	sticky := mk("sticky", 0o1777, 0)
	mk("sticky/ws", 0o755, 0)
	link("root/rootlink", filepath.Join(root, "ws"), 0)
	link("root/relink", "ws", 0)
	link("sticky/evelink", filepath.Join(root, "ws"), 4242)
	link("eve/link", filepath.Join(root, "ws"), 4242)
	link("root/toeve", filepath.Join(eve, "own"), 0)
	cases := []struct {
		path string
		want string // "" is accepted
	}{
		{filepath.Join(root, "ws"), ""},
		{filepath.Join(eve, "own"), "owned by uid 4242"},
		{filepath.Join(eve, "ws"), "owned by uid 4242"},
		{filepath.Join(open, "ws"), "writable by others"},
		{filepath.Join(sticky, "ws"), ""},
		{filepath.Join(root, "rootlink"), ""},
		{filepath.Join(root, "relink"), ""},
		{filepath.Join(sticky, "evelink"), "belongs to uid 4242"},
		{filepath.Join(eve, "link"), "owned by uid 4242"},
		{filepath.Join(root, "toeve"), "owned by uid 4242"},
	}
	for _, c := range cases {
		err := Check(c.path, 0)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", c.path, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: %v, want an error with %q", c.path, err, c.want)
		}
	}
	// The trusted user's own directories are as good as root's.
	if err := Check(filepath.Join(eve, "own"), 4242); err != nil {
		t.Errorf("eve's own path for eve: %v", err)
	}
}
