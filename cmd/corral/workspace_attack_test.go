package main

import (
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/internal/posixacl"
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

// guestXattrs is what guest root tries on a file f it made: file
// capabilities (cap_setuid), a trusted.* attribute, and an access ACL
// whose named user and group are its uid 0 and gid 0.
const guestXattrs = `
my $path = $ARGV[0]; my $r;
my $cap = pack("VVVVV", 0x02000001, 1<<7, 0, 0, 0);
$r = syscall(188, $path, my $cn = "security.capability", $cap, length($cap), 0); print "cap=$r\n";
$r = syscall(188, $path, my $tn = "trusted.x", my $tv = "y", 1, 0); print "trusted=$r\n";
my $acl = pack("V", 2) . pack("vvV", 1, 7, 0xffffffff) . pack("vvV", 2, 7, 0) . pack("vvV", 4, 5, 0xffffffff)
  . pack("vvV", 8, 7, 0) . pack("vvV", 0x10, 7, 0xffffffff) . pack("vvV", 0x20, 5, 0xffffffff);
$r = syscall(188, $path, my $an = "system.posix_acl_access", $acl, length($acl), 0); print "acl=$r\n";
`

// TestGuestXattrsStayInItsRange: guest root owns what it creates in the
// workspace (an idmapped user's checkout, a granted root-owned one), and
// may set ACLs on it, but an ACL entry naming its uid or gid 0 names its
// machine's unprivileged host id on the host, never host root, and it sets
// no file capabilities and no trusted.* attribute there.
func TestGuestXattrsStayInItsRange(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("managed projects need root (CI runs as root)")
	}
	if _, err := exec.LookPath("perl"); err != nil {
		t.Skip("perl is not installed")
	}
	t.Setenv("CORRAL_TEST_AS_MAIN", "1")
	for _, owner := range []int{4242, 0} {
		state, ws := t.TempDir(), filepath.Join(t.TempDir(), "proj")
		mkdir(t, ws, 0o755)
		chown(t, ws, owner)
		out, errs, status := corral(t, state, "--project", ws, "--user", "root", "--",
			"sh", "-c", `cp /bin/true f && perl -e "$1" f`, "sh", guestXattrs)
		if status != 0 || !strings.Contains(out, "acl=") {
			t.Fatalf("owner %d: %d %q %q", owner, status, out, errs)
		}
		t.Logf("owner %d: %q", owner, out)
		f := filepath.Join(ws, "f")
		var st syscall.Stat_t
		if err := syscall.Lstat(f, &st); err != nil {
			t.Fatal(err)
		}
		if st.Uid == 0 || st.Gid == 0 {
			t.Fatalf("owner %d: the guest's file is owned by %d:%d", owner, st.Uid, st.Gid)
		}
		for _, name := range []string{"security.capability", "trusted.x"} {
			if n, err := unix.Lgetxattr(f, name, make([]byte, 64)); err == nil {
				t.Errorf("owner %d: the guest set %s (%d bytes) on the host", owner, name, n)
			}
		}
		// No named user or group entry (tags 2 and 8) names host id 0.
		b := make([]byte, 256)
		if n, err := unix.Lgetxattr(f, "system.posix_acl_access", b); err == nil {
			for e := b[4:n]; len(e) >= 8; e = e[8:] {
				if tag := binary.LittleEndian.Uint16(e); (tag == 2 || tag == 8) && binary.LittleEndian.Uint32(e[4:]) == 0 {
					t.Errorf("owner %d: the guest's ACL has an entry (tag %d) for host id 0", owner, tag)
				}
			}
		}
		if strings.Contains(out, "acl=0") {
			// Set: its named entries must be the guest root's own host ids.
			if ok, err := posixacl.Grants(f, st.Uid, 7); err != nil || !ok {
				t.Errorf("owner %d: the ACL the guest set does not name its own id %d: %v %v", owner, st.Uid, ok, err)
			}
		}
	}
}

// TestGrantNotRedirectedByAnotherUser: the shared worker grants a
// root-owned workspace to the machine with ACLs (persistently, on the
// host). A host user who controls the path root names — eve's
// /home/eve/proj, which she turns into a symlink to a root-owned
// directory, or a root-owned directory inside eve's, which she can swap
// for a symlink at any moment — must not get that grant pointed at root's
// files (before: the machine of `corral run --project /home/eve/proj` read
// and appended to root's 0600 file through eve's symlink, and the file kept
// an ACL granting the machine's ids read and write).
func TestGrantNotRedirectedByAnotherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("managed projects need root (CI runs as root)")
	}
	t.Setenv("CORRAL_TEST_AS_MAIN", "1")
	state, tmp := t.TempDir(), t.TempDir()
	eve := filepath.Join(tmp, "eve")
	mkdir(t, eve, 0o755)
	chown(t, eve, 4242)
	rootDir := filepath.Join(tmp, "rootdir")
	mkdir(t, rootDir, 0o755)
	secret := filepath.Join(rootDir, "secret")
	if err := os.WriteFile(secret, []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(eve, "proj")
	if err := os.Symlink(rootDir, link); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(link, 4242, 4242); err != nil {
		t.Fatal(err)
	}
	inside := filepath.Join(eve, "rootws")
	mkdir(t, inside, 0o755) // root's, in eve's directory
	insideFile := filepath.Join(inside, "f")
	if err := os.WriteFile(insideFile, []byte("root's\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	attack := `cat /workspace/secret /workspace/f 2>/dev/null; echo pwned >> /workspace/secret; echo pwned >> /workspace/f; true`
	for _, ws := range []string{link, inside} {
		out, errs, status := corral(t, state, "--project", ws, "--", "sh", "-c", attack)
		t.Logf("%s: %d %q %q", ws, status, out, errs)
		if strings.Contains(out, "secret") || strings.Contains(out, "root's") {
			t.Errorf("%s: the machine read root's 0600 file: %q", ws, out)
		}
	}
	for _, f := range []string{secret, insideFile, rootDir, inside} {
		if n, err := unix.Lgetxattr(f, "system.posix_acl_access", make([]byte, 256)); err == nil {
			t.Errorf("%s: an ACL (%d bytes) was granted on root's file", f, n)
		}
	}
	for f, want := range map[string]string{secret: "secret\n", insideFile: "root's\n"} {
		if b, err := os.ReadFile(f); err != nil || string(b) != want {
			t.Errorf("%s: %q %v", f, b, err)
		}
	}
}
