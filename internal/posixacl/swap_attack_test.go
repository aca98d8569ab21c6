package posixacl

import (
	"os"
	"path/filepath"
	"testing"
)

// TestGrantUserDoesNotFollowSwappedDirectory: GrantUser runs as root over a
// tree that someone else may write (a host project's owner; a checkout's
// other users). If, after the walk read a directory's entries, that
// directory is swapped for a symlink to somewhere else, the grant must
// still land inside root or nowhere: never on the file the symlink leads
// to (before: lsetxattr of root/a/f resolved the symlink a, and uid was
// granted read and write on outside/f). The walk's skip hook, called for
// each path just before its grant, makes the swap at the worst moment.
func TestGrantUserDoesNotFollowSwappedDirectory(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("setting another owner's ACLs needs root")
	}
	const uid = 4243
	tmp := t.TempDir()
	root, outside := filepath.Join(tmp, "root"), filepath.Join(tmp, "outside")
	for _, d := range []string{filepath.Join(root, "a"), outside} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{filepath.Join(root, "a", "f"), filepath.Join(outside, "f")} {
		if err := os.WriteFile(f, []byte("secret"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	swapped := false
	skip := func(p string) bool {
		if p == filepath.Join(root, "a", "f") && !swapped {
			swapped = true
			if err := os.Rename(filepath.Join(root, "a"), filepath.Join(root, "a.old")); err != nil {
				t.Error(err)
			}
			if err := os.Symlink(outside, filepath.Join(root, "a")); err != nil {
				t.Error(err)
			}
		}
		return false
	}
	// Whether the walk then fails or goes on does not matter; where it
	// granted does.
	_ = GrantUser(root, uid, skip)
	if !swapped {
		t.Fatal("the walk never reached root/a/f")
	}
	for _, p := range []string{outside, filepath.Join(outside, "f")} {
		if ok, err := Grants(p, uid, 4); err != nil || ok {
			t.Errorf("%s outside the tree: granted %v (%v)", p, ok, err)
		}
	}
	// Symlinks in the tree are never followed either.
	if err := os.Symlink(filepath.Join(outside, "f"), filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(root, "dirlink")); err != nil {
		t.Fatal(err)
	}
	if err := GrantUser(root, uid+1, nil); err != nil {
		t.Fatal(err)
	}
	if ok, err := Grants(filepath.Join(root, "a.old", "f"), uid+1, 6); err != nil || !ok {
		t.Errorf("a file of the tree not granted: %v %v", ok, err)
	}
	for _, p := range []string{outside, filepath.Join(outside, "f")} {
		if ok, err := Grants(p, uid+1, 4); err != nil || ok {
			t.Errorf("%s, reached by a symlink in the tree: granted %v (%v)", p, ok, err)
		}
	}
}
