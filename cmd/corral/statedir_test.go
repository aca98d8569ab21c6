package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRunRefusesUnsafeStateDir: a --project run is root's, and it opens
// its state directory's lock files, log (truncating it), pid file and
// store and trusts the worker socket it finds there. In a state directory
// another user can write (owned by them, mode 0777, or under a parent
// they own), that user's symlink worker.log -> a victim file would have
// root truncate the victim. Every such directory is refused before
// anything in it is opened: the victim keeps its content and no worker
// starts.
func TestRunRefusesUnsafeStateDir(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("managed projects need root (CI runs as root)")
	}
	t.Setenv("CORRAL_TEST_AS_MAIN", "1")
	ws := t.TempDir()
	const nobody = 65534
	cases := []struct {
		name string
		make func(t *testing.T) string
		want string
	}{
		{"ownedByAnother", func(t *testing.T) string {
			state := filepath.Join(t.TempDir(), "state")
			mkdir(t, state, 0o700)
			chown(t, state, nobody)
			return state
		}, "owned by uid 65534"},
		{"worldWritable", func(t *testing.T) string {
			state := filepath.Join(t.TempDir(), "state")
			mkdir(t, state, 0o700)
			if err := os.Chmod(state, 0o777); err != nil {
				t.Fatal(err)
			}
			return state
		}, "writable by others"},
		{"parentOwnedByAnother", func(t *testing.T) string {
			parent := filepath.Join(t.TempDir(), "home")
			mkdir(t, parent, 0o755)
			chown(t, parent, nobody)
			state := filepath.Join(parent, "state")
			mkdir(t, state, 0o700)
			return state
		}, "owned by uid 65534, who could replace"},
		{"symlinkToAnothersDir", func(t *testing.T) string {
			real := filepath.Join(t.TempDir(), "real")
			mkdir(t, real, 0o700)
			chown(t, real, nobody)
			state := filepath.Join(t.TempDir(), "state")
			if err := os.Symlink(real, state); err != nil {
				t.Fatal(err)
			}
			return state
		}, "owned by uid 65534"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			state := c.make(t)
			victim := filepath.Join(t.TempDir(), "victim")
			if err := os.WriteFile(victim, []byte("keep"), 0o600); err != nil {
				t.Fatal(err)
			}
			// What the other user plants: the worker's log, pid file and
			// store as links to root's file.
			for _, name := range []string{sharedLog, sharedPid, "corral.db"} {
				if err := os.Symlink(victim, filepath.Join(state, name)); err != nil {
					t.Fatal(err)
				}
			}
			_, errs, status := corral(t, state, "--project", ws, "--", "true")
			if status == 0 || !strings.Contains(errs, c.want) {
				t.Errorf("run in an unsafe state directory: status %d, stderr %q; want a refusal naming %q", status, errs, c.want)
			}
			if b, err := os.ReadFile(victim); err != nil || string(b) != "keep" {
				t.Errorf("the victim file: %q %v", b, err)
			}
			if _, err := os.Lstat(filepath.Join(state, sharedSocket)); err == nil {
				t.Error("a worker started in the unsafe state directory")
			}
		})
	}
}

func mkdir(t *testing.T, p string, mode os.FileMode) {
	t.Helper()
	if err := os.Mkdir(p, mode); err != nil {
		t.Fatal(err)
	}
}

func chown(t *testing.T, p string, uid int) {
	t.Helper()
	if err := os.Chown(p, uid, uid); err != nil {
		t.Fatal(err)
	}
}
