package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestRunProjectPrivateWorker runs `corral run --project DIR` as root: corral
// starts the shared worker, registers DIR as a managed project, runs the
// command in its machine at /workspace and stops the worker.
func TestRunProjectPrivateWorker(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("managed projects need root (CI runs as root)")
	}
	// The shared worker is this test binary run as corral.
	t.Setenv("CORRAL_TEST_AS_MAIN", "1")
	state := t.TempDir()
	ws := filepath.Join(t.TempDir(), "proj")
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, "hello.txt"), []byte("hi"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(ws, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	// A checkout of an ordinary user: the guest writes as that user.
	const owner = 4242
	if err := os.Chown(ws, owner, owner); err != nil {
		t.Fatal(err)
	}
	out, errs, status := corral(t, state, "--json", "--project", ws, "--",
		"sh", "-c", "pwd; cat hello.txt; echo; hostname; touch made; id -u; exit 5")
	if status != 5 {
		t.Fatalf("status = %d, stderr %q, stdout %q", status, errs, out)
	}
	var res struct {
		Stdout string
		Code   *int
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
	if len(lines) != 4 || lines[0] != "/workspace" || lines[1] != "hi" || !strings.HasPrefix(lines[2], "project-") || lines[3] == "0" {
		t.Fatalf("inside the machine: %q", res.Stdout)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(ws, "made"), &st); err != nil {
		t.Errorf("the workspace is not the project: %v", err)
	} else if st.Uid != owner {
		t.Errorf("a file the guest made is owned by %d on the host, want the workspace's owner %d", st.Uid, owner)
	}
	// The same project again: registered once, reused.
	out, _, status = corral(t, state, "--project", ws, "--", "git", "--version")
	if status != 0 || !strings.HasPrefix(out, "git version") {
		t.Fatalf("second run: %d %q", status, out)
	}
	// A program that is not there is a start error, exit status 127 as
	// Docker's, one line; a file that cannot be executed 126.
	_, errs, status = corral(t, state, "--project", ws, "--", "no-such-program-here")
	if status != 127 || errs != "corral: start: exec \"no-such-program-here\": executable file not found in $PATH\n" {
		t.Fatalf("missing program: %d %q", status, errs)
	}
	_, errs, status = corral(t, state, "--project", ws, "--", "./hello.txt")
	if status != 126 || errs != "corral: start: exec ./hello.txt: permission denied\n" {
		t.Fatalf("not executable: %d %q", status, errs)
	}
	// -w and -u, as exec and cp have them.
	out, errs, status = corral(t, state, "--project", ws, "-u", "root", "-w", "/workspace/sub", "--", "sh", "-c", "id -u; pwd")
	if status != 0 || out != "0\n/workspace/sub\n" {
		t.Fatalf("-u root -w /workspace/sub: %d %q %q", status, out, errs)
	}
	// --user: guest root, and a user the machine does not know (a start
	// error: nothing ran).
	out, errs, status = corral(t, state, "--project", ws, "--user", "root", "--", "sh", "-c", "id -u; echo $HOME")
	if status != 0 || out != "0\n/root\n" {
		t.Fatalf("--user root: %d %q %q", status, out, errs)
	}
	_, errs, status = corral(t, state, "--project", ws, "--user", "nosuchuser", "--", "true")
	if status != 125 || !strings.Contains(errs, "corral: start:") || !strings.Contains(errs, "nosuchuser") {
		t.Fatalf("--user nosuchuser: %d %q", status, errs)
	}
	_, errs, status = corral(t, state, "--host", ws, "--user", "root", "--", "true")
	if status != 125 || !strings.Contains(errs, "corral: prepare:") {
		t.Fatalf("--host with --user: %d %q", status, errs)
	}
}

// TestRunProjectGitStatus: the README's `corral run --project . -- git
// status` works on a fresh machine whether the checkout belongs to root
// (the guest then writes it through ACL entries for its own ids: nothing as
// root) or to an ordinary user; an unknown --image is refused naming it.
func TestRunProjectGitStatus(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("managed projects need root (CI runs as root)")
	}
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	t.Setenv("CORRAL_TEST_AS_MAIN", "1")
	for _, owner := range []int{0, 4242} {
		state := t.TempDir()
		ws := filepath.Join(t.TempDir(), "repo")
		if err := os.Mkdir(ws, 0o755); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("git", "init", "-q", ws).CombinedOutput(); err != nil {
			t.Fatalf("git init: %v %s", err, out)
		}
		if err := os.WriteFile(filepath.Join(ws, "new.txt"), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		if owner != 0 {
			if out, err := exec.Command("chown", "-R", "4242:4242", ws).CombinedOutput(); err != nil {
				t.Fatalf("chown: %v %s", err, out)
			}
		}
		out, errs, status := corral(t, state, "--project", ws, "--", "git", "status", "--porcelain")
		if status != 0 || out != "?? new.txt\n" {
			t.Fatalf("owner %d: git status: %d %q %q", owner, status, out, errs)
		}
		out, errs, status = corral(t, state, "--project", ws, "--", "sh", "-c", "touch /workspace/guest 2>/dev/null; echo done")
		if status != 0 || out != "done\n" {
			t.Fatalf("owner %d: %d %q %q", owner, status, out, errs)
		}
		var st syscall.Stat_t
		err := syscall.Lstat(filepath.Join(ws, "guest"), &st)
		switch {
		case owner == 0 && (err != nil || st.Uid == 0):
			t.Errorf("the guest's file in a root-owned checkout: %v, uid %d (want one of its machine's ids)", err, st.Uid)
		case owner != 0 && (err != nil || st.Uid != uint32(owner)):
			t.Errorf("owner %d: the guest's file: %v, uid %d", owner, err, st.Uid)
		}
		if owner == 0 {
			_, errs, status = corral(t, state, "--project", ws, "--image", "no-such-image", "--", "true")
			if status != 125 || !strings.Contains(errs, "no-such-image") {
				t.Fatalf("unknown image: %d %q", status, errs)
			}
		}
	}
}

// The attack: a guest writes core.fsmonitor into the checkout's
// .git/config so that host root's next `git status` runs its code. In a
// root-owned checkout the guest cannot write .git/config at all (it is not
// idmapped onto root), and the host's git runs nothing of the guest's.
func TestRunProjectFsmonitorAttack(t *testing.T) {
	state, ws, mark := rootGitCheckout(t)
	_, errs, status := corral(t, state, "--project", ws, "--", "git", "config", "core.fsmonitor", "touch "+mark)
	if status == 0 {
		t.Fatalf("the guest wrote the host checkout's .git/config (stderr %q)", errs)
	}
	if !strings.Contains(errs, "ermission denied") && !strings.Contains(errs, "could not lock") {
		t.Errorf("no clear error for the refused write: %q", errs)
	}
	cfg, err := os.ReadFile(filepath.Join(ws, ".git", "config"))
	if err != nil || strings.Contains(string(cfg), "fsmonitor") {
		t.Fatalf(".git/config: %v %q", err, cfg)
	}
	if out, err := exec.Command("git", "-C", ws, "status", "--porcelain").CombinedOutput(); err != nil {
		t.Fatalf("host git status: %v %s", err, out)
	}
	if _, err := os.Stat(mark); err == nil {
		t.Fatal("host root's git status ran the guest's fsmonitor")
	}
}

// TestWorkspaceWritable: the default user and guest root both write the
// workspace — `corral run --user root` and `corral cp -u root` (before:
// EOVERFLOW, "Value too large for defined data type", for root) — on a
// checkout of an ordinary user and on a root-owned one (before: EACCES for
// the default user), and nothing they write is owned on the host by root
// or set-id: on the user's checkout the default user's files are that
// user's, root's its machine's unprivileged id's; on root's, both are
// their machine ids', and the checkout's .git stays out of their reach.
func TestWorkspaceWritable(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("managed projects need root (CI runs as root)")
	}
	t.Setenv("CORRAL_TEST_AS_MAIN", "1")
	for _, owner := range []uint32{4242, 0} {
		state := t.TempDir()
		ws := filepath.Join(t.TempDir(), "proj")
		if err := os.MkdirAll(filepath.Join(ws, "sub"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(ws, "sub", "old"), []byte("old"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(ws, ".git"), 0o755); err != nil {
			t.Fatal(err)
		}
		if owner != 0 {
			if out, err := exec.Command("chown", "-R", "4242:4242", ws).CombinedOutput(); err != nil {
				t.Fatalf("chown: %v %s", err, out)
			}
		}
		script := `set -e; echo $(id -u) > mine-$(id -u); mkdir -p dir-$(id -u)/x; echo more >> sub/old; ` +
			`chmod u+s mine-$(id -u) 2>/dev/null && echo setuid-allowed; touch .git/hook-$(id -u) 2>/dev/null && echo git-writable; cat sub/old`
		for _, user := range []string{"", "root"} {
			args := []string{"--project", ws}
			if user != "" {
				args = append(args, "--user", user)
			}
			out, errs, status := corral(t, state, append(args, "--", "sh", "-c", script)...)
			if status != 0 || strings.Contains(out, "setuid-allowed") || !strings.Contains(out, "oldmore\n") {
				t.Fatalf("owner %d, user %q: %d %q %q", owner, user, status, out, errs)
			}
			if owner == 0 && strings.Contains(out, "git-writable") {
				t.Errorf("owner 0, user %q: the guest wrote the root-owned checkout's .git", user)
			}
		}
		src := filepath.Join(t.TempDir(), "src")
		if err := os.WriteFile(src, []byte("copied"), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, errs, status := cli("cp", "--state", state, "--project", ws, "-u", "root", src, ":copied-by-root"); status != 0 {
			t.Fatalf("owner %d: cp -u root into the workspace: %d %s", owner, status, errs)
		}
		var made int
		err := filepath.WalkDir(ws, func(p string, _ os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			var st syscall.Stat_t
			if err := syscall.Lstat(p, &st); err != nil {
				return err
			}
			if st.Mode&(syscall.S_ISUID|syscall.S_ISGID) != 0 {
				t.Errorf("%s: mode %o on the host", p, st.Mode)
			}
			rel, _ := filepath.Rel(ws, p)
			if !strings.HasPrefix(rel, "mine-") && !strings.HasPrefix(rel, "dir-") && rel != "copied-by-root" {
				return nil // the host's
			}
			made++
			if st.Uid == 0 || st.Gid == 0 {
				t.Errorf("owner %d: %s, which the guest made, is owned by %d:%d on the host", owner, rel, st.Uid, st.Gid)
			}
			if byUser := strings.HasSuffix(rel, "1000") || strings.Contains(rel, "1000/"); byUser != (st.Uid == owner) && owner != 0 {
				t.Errorf("owner %d: %s owned by %d", owner, rel, st.Uid)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if made != 7 {
			t.Errorf("owner %d: the guest's files: %d of 7", owner, made)
		}
	}
}

// TestProjectByPathAndImage: the project a `corral run --project DIR`
// registered is named by DIR in `corral project` commands, an unknown
// --image is refused before it is recorded (the next run without it
// works), and `project list` shows the image.
func TestProjectByPathAndImage(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("managed projects need root (CI runs as root)")
	}
	t.Setenv("CORRAL_TEST_AS_MAIN", "1")
	state := t.TempDir()
	ws := filepath.Join(t.TempDir(), "proj2")
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, errs, status := corral(t, state, "--project", ws, "--", "true"); status != 0 {
		t.Fatalf("run: %d %q", status, errs)
	}
	_, errs, status := corral(t, state, "--project", ws, "--image", "bsae", "--", "true")
	if status != 125 || !strings.Contains(errs, "--image bsae: no such image") {
		t.Fatalf("unknown image: %d %q", status, errs)
	}
	if _, errs, status := corral(t, state, "--project", ws, "--", "true"); status != 0 {
		t.Fatalf("the unknown image was recorded: %d %q", status, errs)
	}
	out, errs, status := cli("project", "--state", state, "list")
	if status != 0 || !strings.Contains(out, "IMAGE") || !strings.Contains(out, "managed:"+ws) || !strings.Contains(out, " base ") {
		t.Fatalf("list: %d %q %q", status, out, errs)
	}
	out, _, _ = cli("project", "--state", state, "list", "--json")
	if !strings.Contains(out, `"image": "base"`) {
		t.Errorf("list --json: %q", out)
	}
	// By path, relative too, while the shared worker still runs the machine.
	if _, errs, status := cli("project", "--state", state, "reset", ws); status != 0 {
		t.Fatalf("reset by path: %d %q", status, errs)
	}
	t.Chdir(filepath.Dir(ws))
	if _, errs, status := cli("project", "--state", state, "reset", "proj2"); status != 0 {
		t.Fatalf("reset by relative path: %d %q", status, errs)
	}
	if _, errs, status := cli("project", "--state", state, "reset", "/no/such/dir"); status == 0 || !strings.Contains(errs, "not found") {
		t.Fatalf("reset of nothing: %d %q", status, errs)
	}
}
