package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestRootCheckoutGitSwapAttack: in a root-owned checkout that the shared
// worker granted to the machine (its root directory writable through an
// ACL), guest root cannot write .git/config, but it can rename .git away
// and make a .git of its own whose config names a core.fsmonitor and a
// hook. Host root's next `git status` in the checkout must run none of
// it: git refuses a repository owned by another user (safe.directory), and
// nothing corral runs on the host may widen that.
func TestRootCheckoutGitSwapAttack(t *testing.T) {
	state, ws, mark := rootGitCheckout(t)
	// The guest's git config goes by hand: the image need not have git.
	script := `set -e; mv .git .git.host; mkdir -p .git/objects .git/refs/heads .git/hooks; ` +
		`echo 'ref: refs/heads/main' > .git/HEAD; ` +
		`printf '[core]\n\trepositoryformatversion = 0\n\tbare = false\n\tfsmonitor = "touch ` + mark + `"\n' > .git/config; ` +
		`printf '#!/bin/sh\ntouch ` + mark + `\n' > .git/hooks/post-index-change; chmod +x .git/hooks/post-index-change; echo swapped`
	out, errs, status := corral(t, state, "--project", ws, "--user", "root", "--", "sh", "-c", script)
	if status != 0 || !strings.Contains(out, "swapped") {
		// Refused outright holds too; say so.
		t.Logf("the guest could not swap .git: %d %q %q", status, out, errs)
	}
	for _, args := range [][]string{{"status", "--porcelain"}, {"diff"}, {"add", "-A"}} {
		cmd := exec.Command("git", append([]string{"-C", ws}, args...)...)
		cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1")
		got, _ := cmd.CombinedOutput() // refusing (dubious ownership) is the expected answer
		if _, err := os.Stat(mark); err == nil {
			t.Fatalf("host root's git %v ran the guest's code (%s)", args, got)
		}
	}
}

// rootGitCheckout skips unless the test runs as root with git, and returns
// a state directory, a root-owned git checkout and the path a guest's code
// would create if host root's git ran it.
func rootGitCheckout(t *testing.T) (state, ws, mark string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("managed projects need root (CI runs as root)")
	}
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	t.Setenv("CORRAL_TEST_AS_MAIN", "1")
	state = t.TempDir()
	ws = filepath.Join(t.TempDir(), "repo")
	if out, err := exec.Command("git", "init", "-q", ws).CombinedOutput(); err != nil {
		t.Fatalf("git init: %v %s", err, out)
	}
	return state, ws, filepath.Join(t.TempDir(), "pwned")
}
