package worker

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/wire"
)

// TestGrantOnlyOnRootsPath: with GrantWorkspaces, a root-owned workspace
// is granted to the machine (ACL entries, written as root, that stay),
// but only one whose path nobody but root controls: in a directory of
// host user 4242, who could swap it for a symlink to root's files between
// the request and the grant, it is bound as is and nothing is granted.
func TestGrantOnlyOnRootsPath(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.GrantWorkspaces = true })
	c := h.dial(t)
	trusted := h.project(t, 1)
	eve := filepath.Join(h.root, "eve")
	if err := os.MkdirAll(filepath.Join(eve, "ws"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(eve, 4242, 4242); err != nil {
		t.Fatal(err)
	}
	redirectable := wire.Project{ID: 2, Workspace: filepath.Join(eve, "ws")}
	for _, tc := range []struct {
		p       wire.Project
		granted bool
	}{{trusted, true}, {redirectable, false}} {
		r := h.run(t, c, tc.p, "sh", "-c", "echo x > /workspace/f")
		if (r.code() == 0) != tc.granted {
			t.Errorf("%s: the guest's write: %v, want granted %v", tc.p.Workspace, r, tc.granted)
		}
		_, err := unix.Lgetxattr(tc.p.Workspace, "system.posix_acl_access", make([]byte, 256))
		if (err == nil) != tc.granted {
			t.Errorf("%s: ACL present %v, want %v", tc.p.Workspace, err == nil, tc.granted)
		}
	}
}
