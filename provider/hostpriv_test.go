package provider

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/posixacl"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/sandbox/sandboxtest"
	"golang.org/x/sys/unix"
)

func requireRoot(t *testing.T) {
	t.Helper()
	requireLandlock(t)
	if os.Geteuid() != 0 {
		t.Skip("host commands switch to the project's user only when corral is root")
	}
}

// sh runs a shell script as the fixture's actor and returns the result.
func (f *fixture) sh(t *testing.T, script string) *sandbox.CommandResult {
	t.Helper()
	res, err := f.run(t, "", "sh", "-c", script)
	if err != nil {
		t.Fatalf("%q: %v", script, err)
	}
	return res
}

func (f *fixture) projectUID(t *testing.T) uint32 {
	t.Helper()
	u, err := f.p.users.user(f.project.ProjectID)
	if err != nil {
		t.Fatal(err)
	}
	return u.UID
}

// TestConfinedRunsAsProjectUser: an untrusted member's host command, on a
// root corral, is an unprivileged user with nothing of root's.
func TestConfinedRunsAsProjectUser(t *testing.T) {
	requireRoot(t)
	f := newFixture(t, fixtureOpts{})
	uid := f.projectUID(t)
	// A file root made before the project's first command: the grant
	// covers what the root holds then.
	must(t, os.WriteFile(filepath.Join(f.root, "existing"), nil, 0o644))

	res := f.sh(t, "id -u; id -g; id -G; grep -E '^Cap(Eff|Prm|Bnd|Inh|Amb)' /proc/self/status")
	want := fmt.Sprintf("%d\n%d\n%d\n", uid, uid, uid)
	if !strings.HasPrefix(res.Stdout, want) {
		t.Fatalf("ids = %q, want %q (the project's uid and gid, no other group)", res.Stdout, want)
	}
	for _, c := range []string{"CapEff", "CapPrm", "CapBnd", "CapInh", "CapAmb"} {
		if !strings.Contains(res.Stdout, c+":\t0000000000000000") {
			t.Errorf("%s not empty:\n%s", c, res.Stdout)
		}
	}

	// Secrets: the host's, and the daemon's state beside the project.
	for _, p := range []string{"/etc/shadow", filepath.Join(filepath.Dir(f.root), "corral.db")} {
		if res := f.sh(t, "cat "+p+" >/dev/null"); res.Code == nil || *res.Code == 0 {
			t.Errorf("read %s: %+v", p, res)
		}
	}
	if res := f.sh(t, "ls "+filepath.Dir(f.root)); res.Code == nil || *res.Code == 0 {
		t.Errorf("listed the state directory: %+v", res)
	}

	// The root is writable, and what it creates is the project user's.
	if res := f.sh(t, "mkdir -p sub && echo x > sub/made && echo o > /dev/stdout"); *res.Code != 0 || res.Stdout != "o\n" {
		t.Fatalf("write in the root: %+v", res)
	}
	var st unix.Stat_t
	must(t, unix.Stat(filepath.Join(f.root, "sub", "made"), &st))
	if st.Uid != uid || st.Gid != uid {
		t.Errorf("created file owned by %d:%d, want %d:%d", st.Uid, st.Gid, uid, uid)
	}
	if res := f.sh(t, "echo y >> existing"); *res.Code != 0 {
		t.Errorf("append to a file that existed before the first command: %+v", res)
	}
}

func TestConfinedCannotSignalHost(t *testing.T) {
	requireRoot(t)
	f := newFixture(t, fixtureOpts{})
	sleep := exec.Command("sleep", "60")
	must(t, sleep.Start())
	defer func() { sleep.Process.Kill(); sleep.Wait() }()
	for _, pid := range []int{sleep.Process.Pid, os.Getpid()} {
		// /bin/kill would look the pid up in the command's own pid
		// namespace; perl's kill calls kill(2) with the number itself, but
		// may be missing: the shell's kill builtin does the same.
		if res := f.sh(t, "kill -0 "+strconv.Itoa(pid)); res.Code == nil || *res.Code == 0 {
			t.Errorf("kill -0 %d of a root process: %+v", pid, res)
		}
	}
}

func TestConfinedNetwork(t *testing.T) {
	requireRoot(t)
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("needs bash for /dev/tcp")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("hello\n"))
			c.Close()
		}
	}()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	script := "exec 3<>/dev/tcp/127.0.0.1/" + port + " && head -1 <&3"

	f := newFixture(t, fixtureOpts{})
	res, err := f.run(t, "", "bash", "-c", script)
	if err != nil {
		t.Fatal(err)
	}
	if res.Code == nil || *res.Code == 0 || strings.Contains(res.Stdout, "hello") {
		t.Errorf("TCP connect to the host's loopback without network: %+v", res)
	}

	must(t, f.st.SetProjectNetwork(context.Background(), f.project.ProjectID, true))
	res, err = f.run(t, "", "bash", "-c", script)
	if err != nil {
		t.Fatal(err)
	}
	if res.Code == nil || *res.Code != 0 || res.Stdout != "hello\n" {
		t.Errorf("TCP connect with the project's network allowed: %+v", res)
	}
}

func TestConfinedAbstractSocket(t *testing.T) {
	requireRoot(t)
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Skip("needs python3 to connect to an abstract socket")
	}
	name := fmt.Sprintf("corral-provider-test-%d", os.Getpid())
	l, err := net.Listen("unix", "@"+name)
	must(t, err)
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("hello"))
			c.Close()
		}
	}()
	script := fmt.Sprintf("import socket; s = socket.socket(socket.AF_UNIX); s.connect('\\0%s'); print(s.recv(5).decode())", name)
	f := newFixture(t, fixtureOpts{})
	// With the network too: the Landlock scope, not the network
	// namespace, keeps it out.
	must(t, f.st.SetProjectNetwork(context.Background(), f.project.ProjectID, true))
	res, err := f.run(t, "", "/usr/bin/python3", "-c", script)
	if err != nil {
		t.Fatal(err)
	}
	if res.Code == nil || *res.Code == 0 || strings.Contains(res.Stdout, "hello") || !strings.Contains(res.Stderr, "PermissionError") {
		t.Errorf("connect to an abstract socket outside: %+v, want a PermissionError", res)
	}
}

// TestConfinedTreeDies: `setsid sleep &` does not survive the command.
func TestConfinedTreeDies(t *testing.T) {
	requireRoot(t)
	f := newFixture(t, fixtureOpts{})
	token := sandboxtest.SleepToken()
	res := f.sh(t, "setsid sleep "+token+" >/dev/null 2>&1 & echo started")
	if res.Stdout != "started\n" || res.OutputErr != nil {
		t.Fatalf("result %+v", res)
	}
	// RunCommand returned after the namespace was gone.
	if left := processesWith(token); len(left) > 0 {
		t.Fatalf("left running after RunCommand returned: %v", left)
	}

	// And at cancel (a timeout).
	_, err := f.ctrl.RunCommand(context.Background(), f.input("", "sh", "-c", "setsid sleep "+token+" & sleep "+token), &f.actor,
		&sandbox.RunOptions{Timeout: 300 * time.Millisecond})
	if sandbox.KindOf(err) != sandbox.KindTimeout {
		t.Fatalf("err = %v, want a timeout", err)
	}
	if left := processesWith(token); len(left) > 0 {
		t.Fatalf("left running after RunCommand was cancelled: %v", left)
	}
}

// processesWith lists live processes whose command line contains token.
func processesWith(token string) []string {
	var found []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), token) {
			found = append(found, e.Name()+": "+strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return found
}

// TestTrustedRunsDirectly: a trusted member's command is corral's own
// user, root, unconfined.
func TestTrustedRunsDirectly(t *testing.T) {
	requireRoot(t)
	f := newFixture(t, fixtureOpts{trusted: true})
	if res := f.sh(t, "id -u; head -c 4 /etc/shadow >/dev/null && echo read"); res.Stdout != "0\nread\n" {
		t.Errorf("trusted command: %+v, want uid 0 that reads /etc/shadow", res)
	}
}

func TestHostIDBlock(t *testing.T) {
	requireRoot(t)
	f := newFixture(t, fixtureOpts{})
	u, err := f.p.users.user(f.project.ProjectID)
	if err != nil {
		t.Fatal(err)
	}
	if u.UID < 1<<24 || u.GID != u.UID {
		t.Errorf("project user %+v: want uid = gid, from an idrange block", u)
	}
	if _, err := f.p.users.user(HostIDBlock); err == nil || !strings.Contains(err.Error(), "beyond") {
		t.Errorf("project id %d: %v, want a refusal", HostIDBlock, err)
	}
}

// TestRootBeneathClosedDirectory: a root beneath a directory only its
// owner may search (a 0700 home) is made reachable for the project's user
// alone, with search only.
func TestRootBeneathClosedDirectory(t *testing.T) {
	requireRoot(t)
	f := newFixture(t, fixtureOpts{})
	parent := filepath.Dir(f.root)
	must(t, os.Chmod(parent, 0o700))
	if res := f.sh(t, "echo ok > ok && cat ok"); res.Stdout != "ok\n" {
		t.Fatalf("command beneath a 0700 directory: %+v", res)
	}
	uid := f.projectUID(t)
	var st unix.Stat_t
	must(t, unix.Stat(parent, &st))
	x, err := posixacl.Grants(parent, uid, 1)
	must(t, err)
	r, _ := posixacl.Grants(parent, uid, 4)
	w, _ := posixacl.Grants(parent, uid, 2)
	if !x || r || w {
		t.Errorf("parent ACL: search %v, read %v, write %v: want search only for %d", x, r, w, uid)
	}
	if st.Mode&0o007 != 0 {
		t.Errorf("parent mode %o: others gained access", st.Mode&0o777)
	}
	// Landlock still keeps it out of the rest of the directory.
	if res := f.sh(t, "cat "+filepath.Join(parent, "corral.db")+" >/dev/null"); res.Code == nil || *res.Code == 0 {
		t.Errorf("read the state database beside the root: %+v", res)
	}
}
