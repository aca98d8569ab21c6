package daemon

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/corral-sandbox/corral/projects"
)

// TestStateDirPrivate: the state directory is 0700 whether it is new
// (under umask 022) or existed more open.
func TestStateDirPrivate(t *testing.T) {
	old := syscall.Umask(0o022)
	defer syscall.Umask(old)
	existing := t.TempDir()
	if err := os.Chmod(existing, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{filepath.Join(t.TempDir(), "new", "state"), existing} {
		if err := projects.PrepareStateDir(dir); err != nil {
			t.Fatal(err)
		}
		st, err := os.Stat(dir)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o700 {
			t.Errorf("%s: mode %v, want 0700", dir, st.Mode().Perm())
		}
	}
}
