package confine_test

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/confine"
	"golang.org/x/sys/unix"
)

// testUser is an id far above any login user, unused on the test host.
var testUser = confine.User{UID: 1<<24 + 4242, GID: 1<<24 + 4242}

// userEnv is a world-traversable directory holding a copy of the test
// binary (the go build directory is root's alone) and a root the test
// user owns.
type userEnv struct {
	bin  string // the test binary's copy, runnable by the test user
	root string // writable root, owned by the test user
	self string // the test binary itself (the init)
}

func newUserEnv(t *testing.T) userEnv {
	t.Helper()
	requireLandlock(t)
	if os.Geteuid() != 0 {
		t.Skip("switching to an unprivileged user needs root")
	}
	dir := t.TempDir()
	must(t, os.Chmod(filepath.Dir(dir), 0o711))
	must(t, os.Chmod(dir, 0o755))
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "bin", "probe")
	must(t, os.Mkdir(filepath.Dir(bin), 0o755))
	src, err := os.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	must(t, dst.Close())
	root := filepath.Join(dir, "root")
	must(t, os.Mkdir(root, 0o755))
	must(t, os.Chown(root, int(testUser.UID), int(testUser.GID)))
	return userEnv{bin: bin, root: root, self: self}
}

func (e userEnv) policy() confine.Policy {
	u := testUser
	return confine.Policy{Writable: []string{e.root}, Readable: []string{filepath.Dir(e.bin)}, User: &u, Init: e.self}
}

// start starts argv through Start as the test user and returns its tree.
func (e userEnv) start(t *testing.T, p confine.Policy, stdout io.Writer, argv ...string) (*exec.Cmd, *confine.Tree) {
	t.Helper()
	cmd := &exec.Cmd{Path: argv[0], Args: argv, Dir: e.root, Stdout: stdout, Stderr: stdout,
		Env:         []string{"PATH=/usr/bin:/bin"},
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}}
	tree, err := confine.Start(cmd, p)
	if err != nil {
		t.Fatalf("Start %q: %v", argv, err)
	}
	if tree == nil {
		t.Fatal("Start as a user returned no tree")
	}
	return cmd, tree
}

// run runs argv to its end, kills its tree and returns its output.
func (e userEnv) run(t *testing.T, p confine.Policy, argv ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	cmd, tree := e.start(t, p, &out, argv...)
	err := cmd.Wait()
	must(t, tree.Kill())
	<-tree.Done()
	return out.String(), err
}

// probe runs the test binary's probe op:arg as the test user.
func (e userEnv) probe(t *testing.T, p confine.Policy, op, arg string) string {
	t.Helper()
	var out bytes.Buffer
	cmd := &exec.Cmd{Path: e.bin, Args: []string{e.bin}, Dir: e.root, Stdout: &out, Stderr: &out,
		Env: []string{probeEnv + "=" + op + ":" + arg}}
	tree, err := confine.Start(cmd, p)
	if err != nil {
		t.Fatalf("Start probe: %v", err)
	}
	werr := cmd.Wait()
	must(t, tree.Kill())
	<-tree.Done()
	if werr != nil {
		t.Fatalf("probe %s %s: %v: %s", op, arg, werr, out.String())
	}
	return strings.TrimSpace(out.String())
}

func TestUserIsUnprivileged(t *testing.T) {
	e := newUserEnv(t)
	p := e.policy()

	out, err := e.run(t, p, "/bin/sh", "-c", "id -u; id -g; id -G; grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb)' /proc/self/status; grep NoNewPrivs /proc/self/status")
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	want := fmt.Sprintf("%d\n%d\n%d\n", testUser.UID, testUser.GID, testUser.GID)
	if !strings.HasPrefix(out, want) {
		t.Errorf("ids = %q, want %q (uid, gid, no supplementary groups)", out, want)
	}
	for _, c := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
		if !strings.Contains(out, c+":\t0000000000000000") {
			t.Errorf("%s is not empty:\n%s", c, out)
		}
	}
	if !strings.Contains(out, "NoNewPrivs:\t1") {
		t.Errorf("no_new_privs is not set:\n%s", out)
	}

	// Secrets the system directories hold are closed by their permissions.
	if out, err := e.run(t, p, "/bin/cat", "/etc/shadow"); err == nil {
		t.Errorf("read /etc/shadow: %q", out)
	}
	// Root's own files outside the roots are closed by Landlock too.
	secret := filepath.Join(t.TempDir(), "state")
	must(t, os.WriteFile(secret, []byte("secret"), 0o644))
	if out, err := e.run(t, p, "/bin/cat", secret); err == nil {
		t.Errorf("read %s outside the roots: %q", secret, out)
	}

	// It writes its root, and what it creates is its own.
	if out, err := e.run(t, p, "/bin/sh", "-c", "echo hi > made"); err != nil {
		t.Fatalf("write in the root: %v: %s", err, out)
	}
	var st unix.Stat_t
	must(t, unix.Stat(filepath.Join(e.root, "made"), &st))
	if st.Uid != testUser.UID || st.Gid != testUser.GID {
		t.Errorf("created file owned by %d:%d, want %d:%d", st.Uid, st.Gid, testUser.UID, testUser.GID)
	}
}

func TestUserCannotSignalHostProcesses(t *testing.T) {
	e := newUserEnv(t)
	sleep := exec.Command("sleep", "60")
	must(t, sleep.Start())
	defer func() { sleep.Process.Kill(); sleep.Wait() }()
	pid := strconv.Itoa(sleep.Process.Pid)
	// By its host pid (the probe calls kill(2) directly; a pid namespace
	// alone would only make the number mean something else).
	if got := e.probe(t, e.policy(), "kill0", pid); got == "ok" {
		t.Fatalf("kill -0 %s of a root process succeeded", pid)
	}
	// Even a process of its own uid outside its namespace and domain.
	if got := e.probe(t, e.policy(), "kill0", strconv.Itoa(os.Getpid())); got == "ok" {
		t.Fatalf("kill -0 of the caller succeeded")
	}
}

func TestUserNetwork(t *testing.T) {
	e := newUserEnv(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	p := e.policy()
	if got := e.probe(t, p, "connect", l.Addr().String()); got == "ok" {
		t.Errorf("TCP connect to %s without network: ok", l.Addr())
	}
	// Landlock lets MPTCP through (only IPPROTO_TCP sockets are checked):
	// the offline network namespace stops it.
	if got := e.probe(t, p, "mptcp", l.Addr().String()); got == "ok" {
		t.Errorf("MPTCP connect to %s without network: ok", l.Addr())
	}
	p.Network = true
	if got := e.probe(t, p, "connect", l.Addr().String()); got != "ok" {
		t.Errorf("TCP connect to %s with network: %s", l.Addr(), got)
	}

	// An abstract Unix socket created outside the domain is out of reach,
	// network or not.
	name := fmt.Sprintf("@corral-confine-test-%d", os.Getpid())
	ul, err := net.Listen("unix", name)
	if err != nil {
		t.Fatal(err)
	}
	defer ul.Close()
	go func() {
		for {
			c, err := ul.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	if got := e.probe(t, p, "unix", name); got == "ok" {
		t.Errorf("connect to the abstract socket %s: ok", name)
	}
}

// TestUserTreeDies: whatever the command leaves running dies with its
// tree, even a descendant in a session of its own.
func TestUserTreeDies(t *testing.T) {
	e := newUserEnv(t)
	token := fmt.Sprintf("300.%d", time.Now().UnixNano()%1e9)
	out, err := e.run(t, e.policy(), "/bin/sh", "-c", "setsid sleep "+token+" >/dev/null 2>&1 & echo started")
	if err != nil || out != "started\n" {
		t.Fatalf("%v: %q", err, out)
	}
	// Done: the namespace's init was reaped, which the kernel allows only
	// once every other process of it is gone.
	if left := processesWith(token); len(left) > 0 {
		t.Fatalf("left running after the tree was killed: %v", left)
	}

	// A shell's kill $$ still ends the shell with that signal: it is not
	// the namespace's init, which would ignore it.
	_, err = e.run(t, e.policy(), "/bin/sh", "-c", "kill -TERM $$; sleep 5")
	ee, ok := err.(*exec.ExitError)
	if !ok {
		t.Fatalf("kill $$: %v, want a death by SIGTERM", err)
	}
	if ws := ee.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != syscall.SIGTERM {
		t.Fatalf("kill $$: %v, want a death by SIGTERM", err)
	}

	// Kill while running: the main process dies with the rest.
	var buf bytes.Buffer
	cmd, tree := e.start(t, e.policy(), &buf, "/bin/sh", "-c", "setsid sleep "+token+" & sleep "+token)
	must(t, tree.Kill())
	if err := cmd.Wait(); err == nil {
		t.Fatal("the main process survived its tree")
	}
	<-tree.Done()
	if left := processesWith(token); len(left) > 0 {
		t.Fatalf("left running after the tree was killed: %v", left)
	}
}

// TestUserHelper: the helper, as root, supervises the command as the
// user, exits as it did and leaves nothing behind.
func TestUserHelper(t *testing.T) {
	e := newUserEnv(t)
	token := fmt.Sprintf("300.%d", time.Now().UnixNano()%1e9)
	path, args := confine.Command(e.self, e.policy(), []string{"sh", "-c", "setsid sleep " + token + " >/dev/null 2>&1 & id -u; exit 3"})
	statusR, statusW, err := os.Pipe()
	must(t, err)
	defer statusR.Close()
	var out bytes.Buffer
	cmd := &exec.Cmd{Path: path, Args: args, Dir: e.root, Env: []string{"PATH=/usr/bin:/bin"}, Stdout: &out, Stderr: &out,
		ExtraFiles: []*os.File{statusW}, SysProcAttr: &syscall.SysProcAttr{Setpgid: true}}
	must(t, cmd.Start())
	statusW.Close()
	status, _ := io.ReadAll(statusR)
	if len(status) > 0 {
		t.Fatalf("helper: %s", status)
	}
	err = cmd.Wait()
	if cmd.ProcessState.ExitCode() != 3 || strings.TrimSpace(out.String()) != strconv.Itoa(int(testUser.UID)) {
		t.Fatalf("helper: %v, output %q; want exit 3 and the user's uid", err, out.String())
	}
	if left := processesWith(token); len(left) > 0 {
		t.Fatalf("left running after the helper exited: %v", left)
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

// TestUserMinimalInit: a tree whose policy names no init (RunCommand's)
// has the minimal init: uid 0 with no capability and no_new_privs, immune
// to the command, reaping its orphans, and the tree still dies whole.
func TestUserMinimalInit(t *testing.T) {
	e := newUserEnv(t)
	p := e.policy()
	p.Init = ""
	out, err := e.run(t, p, "/bin/sh", "-c", "kill -KILL 1 2>/dev/null && echo killed-init; echo done")
	if err != nil || out != "done\n" {
		t.Errorf("kill its init: %v: %q", err, out)
	}
	var buf bytes.Buffer
	cmd, tree := e.start(t, p, &buf, "/bin/sleep", "60")
	status := initStatus(t, cmd.Process.Pid)
	must(t, tree.Kill())
	_ = cmd.Wait()
	<-tree.Done()
	for _, want := range []string{"Uid:\t0\t0\t0\t0", "CapEff:\t0000000000000000", "CapPrm:\t0000000000000000", "CapBnd:\t0000000000000000", "NoNewPrivs:\t1"} {
		if !strings.Contains(status, want) {
			t.Errorf("the init's status lacks %q:\n%s", want, status)
		}
	}

	// An orphan (reparented to the init) is reaped while the command
	// runs: it goes away (kill -0 fails) instead of staying a zombie.
	if runtime.GOARCH == "amd64" {
		out, err = e.run(t, p, "/bin/sh", "-c", `(/bin/true & echo $! > orphan); o=$(cat orphan); i=0
while kill -0 $o 2>/dev/null && [ $i -lt 1000 ]; do i=$((i+1)); sleep 0.01; done
kill -0 $o 2>/dev/null && echo zombie || echo reaped`)
		if err != nil || out != "reaped\n" {
			t.Errorf("orphan: %v: %q, want reaped", err, out)
		}
	}

	token := fmt.Sprintf("300.%d", time.Now().UnixNano()%1e9)
	out, err = e.run(t, p, "/bin/sh", "-c", "sleep "+token+" >/dev/null 2>&1 & setsid sleep "+token+" >/dev/null 2>&1 & echo started")
	if err != nil || out != "started\n" {
		t.Fatalf("%v: %q", err, out)
	}
	if left := processesWith(token); len(left) > 0 {
		t.Fatalf("left running after the tree was killed: %v", left)
	}
}

// TestUserRootReplaced: a root replaced between two commands of the same
// policy (renamed away, a new directory made in its place) is the new
// directory for the second command: it writes the new one, and the old
// one, now elsewhere, is out of its reach, as if every command had its
// ruleset built afresh.
func TestUserRootReplaced(t *testing.T) {
	e := newUserEnv(t)
	p := e.policy()
	p.Init = ""
	if out, err := e.run(t, p, "/bin/sh", "-c", "echo one > "+e.root+"/one"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	moved := e.root + ".old"
	must(t, os.Rename(e.root, moved))
	must(t, os.Mkdir(e.root, 0o755))
	must(t, os.Chown(e.root, int(testUser.UID), int(testUser.GID)))
	if out, err := e.run(t, p, "/bin/sh", "-c", "echo two > "+e.root+"/two"); err != nil {
		t.Fatalf("write the new root: %v: %s", err, out)
	}
	if out, err := e.run(t, p, "/bin/sh", "-c", "echo three > "+moved+"/three"); err == nil {
		t.Fatalf("wrote the old root, renamed to %s: %s", moved, out)
	}
	if _, err := os.Stat(filepath.Join(moved, "three")); err == nil {
		t.Fatal("the old root was written")
	}
}

// initStatus returns /proc/PID/status of the init of pid's namespace.
func initStatus(t *testing.T, pid int) string {
	t.Helper()
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid))
	must(t, err)
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if l, _ := os.Readlink("/proc/" + e.Name() + "/ns/pid"); l != ns {
			continue
		}
		b, _ := os.ReadFile("/proc/" + e.Name() + "/status")
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) > 0 && f[0] == "NSpid:" && f[len(f)-1] == "1" {
				return string(b)
			}
		}
	}
	t.Fatal("no init in the namespace")
	return ""
}

// TestUserProcIsPrivate is an attack: a confined command (a host
// project's) lists /proc for other tenants' and the host's command lines.
// A host process (root's) and another tenant's confined command, both
// with a marker in their argv, must be invisible; the command's own
// processes, and /proc's system files, stay readable.
func TestUserProcIsPrivate(t *testing.T) {
	e := newUserEnv(t)
	token := fmt.Sprintf("301.%d", time.Now().UnixNano()%1e9)
	host := exec.Command("/bin/sleep", token)
	must(t, host.Start())
	defer func() { _ = host.Process.Kill(); _ = host.Wait() }()

	other := e.policy()
	u := *other.User
	u.UID, u.GID = u.UID+1, u.GID+1
	other.User = &u
	other.Writable = nil
	var buf bytes.Buffer
	cmd, tree := e.start(t, other, &buf, "/bin/sleep", token)
	defer func() { _ = tree.Kill(); _ = cmd.Wait() }()

	// Counts the processes whose command line begins with $1 (the
	// script's own begins with /bin/sh).
	count := `count() { n=0; for f in /proc/[0-9]*/cmdline; do tr '\0' ' ' < $f 2>/dev/null | grep -q "^$1" && n=$((n+1)); done; echo $n; }
`
	out, err := e.run(t, e.policy(), "/bin/sh", "-c", count+`echo "others=$(count '/bin/sleep `+token+`')"
sleep 30.5 & echo "own=$(count 'sleep 30.5')"; kill $!
grep -c MemTotal /proc/meminfo`)
	if err != nil {
		t.Fatalf("%v: %q", err, out)
	}
	if !strings.Contains(out, "others=0\n") {
		t.Fatalf("a confined command sees other users' processes in /proc: %q", out)
	}
	if strings.Contains(out, "own=0\n") || !strings.HasSuffix(out, "\n1\n") {
		t.Errorf("its own processes or /proc's system files are not readable: %q", out)
	}
	// The marked processes are there: seen from outside.
	if left := processesWith(token); len(left) != 2 {
		t.Errorf("the test's marked processes: %v, want 2", left)
	}
}
