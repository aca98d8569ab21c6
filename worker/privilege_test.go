package worker

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/internal/testenv"
	"github.com/corral-sandbox/corral/wire"
	"github.com/corral-sandbox/corral/worker/internal/ctl"
	"github.com/corral-sandbox/corral/worker/internal/guest"
)

// statusFields parses the "Name:\tvalue" lines of a /proc/PID/status.
func statusFields(s string) map[string]string {
	out := map[string]string{}
	for _, l := range strings.Split(s, "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			out[k] = strings.TrimSpace(v)
		}
	}
	return out
}

// TestSessionPrivilege: the default user holds no capability at all (not
// even in its bounding set), guest root exactly Docker's default set
// without CAP_SETFCAP; both have no_new_privs and the syscall policy.
func TestSessionPrivilege(t *testing.T) {
	h := newHarness(t, nil)
	c := h.dial(t)
	p := h.project(t, 1)
	root := fmt.Sprintf("%016x", guest.RootCapMask())
	for _, tt := range []struct {
		user, uid, home string
		eff, inh        string
	}{
		{"", strconv.Itoa(GuestUID), GuestHome, "0000000000000000", "0000000000000000"},
		{"root", "0", "/root", root, "0000000000000000"},
	} {
		r := h.runAs(t, c, p, tt.user, "sh", "-c", `id -u; echo "$HOME"; cat /proc/self/status`)
		if r.code() != 0 {
			t.Fatalf("user %q: %v", tt.user, r)
		}
		lines := strings.SplitN(r.stdout, "\n", 3)
		if len(lines) < 3 || lines[0] != tt.uid || lines[1] != tt.home {
			t.Errorf("user %q: uid and HOME %q, want %s and %s", tt.user, lines[:2], tt.uid, tt.home)
			continue
		}
		f := statusFields(lines[2])
		want := map[string]string{
			"CapEff": tt.eff, "CapPrm": tt.eff, "CapBnd": tt.eff, "CapInh": tt.inh, "CapAmb": "0000000000000000",
			"NoNewPrivs": "1", "Seccomp": "2",
		}
		for k, v := range want {
			if f[k] != v {
				t.Errorf("user %q: %s is %q, want %q", tt.user, k, f[k], v)
			}
		}
	}
	if guest.RootCapMask()&(1<<unix.CAP_SETFCAP|1<<unix.CAP_SYS_ADMIN) != 0 || strings.Count(strconv.FormatUint(guest.RootCapMask(), 2), "1") != 13 {
		t.Errorf("root's capabilities %#x", guest.RootCapMask())
	}
}

// TestSessionUsers: a request names its user by name or number; an
// unknown name, or an id the machine does not map, is refused with
// "bad-user" before anything is accepted.
func TestSessionUsers(t *testing.T) {
	h := newHarness(t, nil)
	c := h.dial(t)
	p := h.project(t, 1)
	for _, tt := range []struct{ user, want string }{
		{"root", "0 0"},
		{"0", "0 0"},
		{"nobody", "65534 65534"},
		{"4242", "4242 4242"},
		{"4242:100", "4242 100"},
		{"", fmt.Sprintf("%d %d", GuestUID, GuestGID)},
	} {
		r := h.runAs(t, c, p, tt.user, "sh", "-c", `echo $(id -u) $(id -g)`)
		if r.code() != 0 || strings.TrimSpace(r.stdout) != tt.want {
			t.Errorf("user %q: %v, want %q", tt.user, r, tt.want)
		}
	}
	for _, user := range []string{"nosuchuser", "root:nosuchgroup", "70000", "a\nb"} {
		id := newID()
		if err := c.Send(&wire.ExecStart{ID: id, Project: p, Argv: []string{"true"}, Cwd: "/workspace", User: user}); err != nil {
			t.Fatal(err)
		}
		m, ok := recv(t, c).(*wire.ExecRejected)
		if !ok || m.Code != wire.CodeBadUser || m.ID != id {
			t.Errorf("user %q: %#v, want exec-rejected bad-user", user, m)
		}
	}
	// The connection and the machine serve on.
	if r := h.runAs(t, c, p, "root", "true"); r.code() != 0 {
		t.Fatalf("%v", r)
	}
}

// TestHelloAnnouncesUser: clients learn that exec-start may name a user.
func TestHelloAnnouncesUser(t *testing.T) {
	h := newHarness(t, nil)
	c, err := wire.Dial(t.Context(), h.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	hello, err := wire.ClientHello(c)
	if err != nil {
		t.Fatal(err)
	}
	if !hello.Has(wire.FeatureUser) {
		t.Fatalf("hello %+v does not announce %q", hello, wire.FeatureUser)
	}
}

// pythonSyscalls is a python3 program that makes each system call
// "name=nr:arg,arg,..." of its arguments and prints "name errno" (0: it
// succeeded).
const pythonSyscalls = `
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
for spec in sys.argv[1:]:
    name, rest = spec.split("=")
    nr, _, args = rest.partition(":")
    args = [ctypes.c_long(int(a)) for a in args.split(",") if a]
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(int(nr)), *args)
    print(name, 0 if r >= 0 else ctypes.get_errno())
`

// TestRefusedSyscalls: what Docker's default profile refuses is refused in
// every session, root's included, with Docker's errno.
func TestRefusedSyscalls(t *testing.T) {
	h := newHarness(t, nil)
	c := h.dial(t)
	p := h.project(t, 1)
	calls := []struct {
		name string
		nr   uintptr
		args []int64
		want unix.Errno
	}{
		{"unshare-user", unix.SYS_UNSHARE, []int64{unix.CLONE_NEWUSER}, unix.EPERM},
		{"unshare-net", unix.SYS_UNSHARE, []int64{unix.CLONE_NEWNET}, unix.EPERM},
		{"clone3", unix.SYS_CLONE3, []int64{0, 0}, unix.ENOSYS},
		{"keyctl", unix.SYS_KEYCTL, []int64{0, -3, 0}, unix.EPERM}, // KEYCTL_GET_KEYRING_ID of the session keyring
		{"add_key", unix.SYS_ADD_KEY, []int64{0, 0, 0, 0, -3}, unix.EPERM},
		{"request_key", unix.SYS_REQUEST_KEY, []int64{0, 0, 0, 0}, unix.EPERM},
		{"bpf", unix.SYS_BPF, []int64{0, 0, 0}, unix.EPERM},
		{"perf_event_open", unix.SYS_PERF_EVENT_OPEN, []int64{0, 0, -1, -1, 0}, unix.EPERM},
		{"userfaultfd", unix.SYS_USERFAULTFD, []int64{1}, unix.EPERM}, // UFFD_USER_MODE_ONLY: allowed to anyone without a filter
		{"mount", unix.SYS_MOUNT, []int64{0, 0, 0, 0, 0}, unix.EPERM},
		{"umount2", unix.SYS_UMOUNT2, []int64{0, 0}, unix.EPERM},
		{"pivot_root", unix.SYS_PIVOT_ROOT, []int64{0, 0}, unix.EPERM},
		{"fsopen", unix.SYS_FSOPEN, []int64{0, 0}, unix.EPERM},
		{"open_tree", unix.SYS_OPEN_TREE, []int64{-100, 0, 0}, unix.EPERM},
		{"init_module", unix.SYS_INIT_MODULE, []int64{0, 0, 0}, unix.EPERM},
		{"clock_settime", unix.SYS_CLOCK_SETTIME, []int64{0, 0}, unix.EPERM},
		{"personality", unix.SYS_PERSONALITY, []int64{0x0400000}, unix.EPERM}, // READ_IMPLIES_EXEC
		{"io_uring_setup", unix.SYS_IO_URING_SETUP, []int64{1, 0}, unix.ENOSYS},
		{"openat2", unix.SYS_OPENAT2, []int64{-100, 0, 0, 0}, unix.ENOSYS},
		{"setns-user", unix.SYS_SETNS, []int64{0, unix.CLONE_NEWUSER}, unix.EPERM},
		// The holder (PID 1 of the session's namespace) holds all of the
		// machine's capabilities, more than guest root: not attachable.
		{"ptrace-holder", unix.SYS_PTRACE, []int64{unix.PTRACE_ATTACH, 1, 0, 0}, unix.EPERM},
	}
	argv := []string{"python3", "-c", pythonSyscalls}
	var want strings.Builder
	for _, sc := range calls {
		var args []string
		for _, a := range sc.args {
			args = append(args, strconv.FormatInt(a, 10))
		}
		argv = append(argv, fmt.Sprintf("%s=%d:%s", sc.name, sc.nr, strings.Join(args, ",")))
		fmt.Fprintf(&want, "%s %d\n", sc.name, int(sc.want))
	}
	for _, user := range []string{"", "root"} {
		r := h.runAs(t, c, p, user, argv...)
		if r.code() != 0 || r.stdout != want.String() {
			t.Errorf("user %q: %v\nwant\n%s", user, r, want.String())
		}
	}
	// Shell-level: the commands a tenant would try.
	r := h.runAs(t, c, p, "", "sh", "-c", `
		unshare -r true 2>/dev/null && echo unshare-r-ran
		python3 -c 'import os; os.unshare(os.CLONE_NEWUSER)' 2>/dev/null && echo python-unshare-ran
		cat /proc/sys/user/max_user_namespaces
		echo done`)
	if r.stdout != "0\ndone\n" {
		t.Errorf("default user: %v", r)
	}
	r = h.runAs(t, c, p, "root", "sh", "-c", `
		unshare -r true 2>/dev/null && echo unshare-r-ran
		unshare -m true 2>/dev/null && echo unshare-m-ran
		unshare -p -f true 2>/dev/null && echo unshare-p-ran
		mount -t tmpfs none /tmp 2>/dev/null && echo mount-ran
		echo x > /workspace/f; chmod u+s /workspace/f 2>/dev/null && echo suid-ran
		echo done`)
	if r.stdout != "done\n" {
		t.Errorf("root: %v", r)
	}
}

// TestFileCapabilityAttack: the attack of issue 15 — a copy of python3 in
// the workspace (whose host owner is root) given cap_setuid from a nested
// user namespace, or by guest root — fails, and the host file carries no
// security.capability.
func TestFileCapabilityAttack(t *testing.T) {
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Skip("needs /usr/bin/python3")
	}
	h := newHarness(t, nil)
	c := h.dial(t)
	p := h.project(t, 1)
	// Owned by an ordinary host user, idmapped to the guest user (a
	// root-owned workspace is not writable by the guest at all).
	if err := os.Chown(p.Workspace, 4242, 4242); err != nil {
		t.Fatal(err)
	}
	const setxattr = `
import os, struct, sys
try:
    os.setxattr(sys.argv[1], "security.capability", struct.pack("<IIIII", 0x02000001, 1 << 7, 0, 0, 0))
    print("setxattr-ran")
except OSError as e:
    print("setxattr", e.errno)
`
	// Guest root cannot create files in the workspace (its id is not in
	// the idmapped mount's mapping): it tries on its /tmp.
	for _, tt := range []struct{ user, dir string }{{"", "/workspace"}, {"root", "/tmp"}} {
		user := tt.user
		script := `f=` + tt.dir + `/py; cp "$(readlink -f /usr/bin/python3)" $f || exit 9
			if command -v setcap >/dev/null; then
				unshare -r setcap cap_setuid+ep $f 2>/dev/null && echo unshare-setcap-ran
				setcap cap_setuid+ep $f 2>/dev/null && echo setcap-ran
			fi
			/usr/bin/python3 -c '` + setxattr + `' $f
			unshare -r /usr/bin/python3 -c '` + setxattr + `' $f 2>/dev/null || echo unshare-refused
			getfattr -n security.capability $f 2>/dev/null && echo has-capability
			true`
		r := h.runAs(t, c, p, user, "sh", "-c", script)
		if want := fmt.Sprintf("setxattr %d\nunshare-refused\n", int(unix.EPERM)); r.stdout != want {
			t.Errorf("user %q: %v, want %q", user, r, want)
		}
		if tt.dir != "/workspace" {
			continue
		}
		hostPath := filepath.Join(p.Workspace, "py")
		if _, err := unix.Getxattr(hostPath, "security.capability", make([]byte, 64)); !errors.Is(err, unix.ENODATA) {
			t.Errorf("user %q: host file's security.capability: %v", user, err)
		}
		var st unix.Stat_t
		if err := unix.Stat(hostPath, &st); err != nil || st.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 {
			t.Errorf("user %q: host file: %v mode %o", user, err, st.Mode)
		}
		_ = os.Remove(hostPath)
	}
}

// TestInotifyNotChargedToHost: a machine that takes all the inotify
// instances it can leaves inotify_init working in another machine and on
// the host: each machine's users have their own limits.
func TestInotifyNotChargedToHost(t *testing.T) {
	h := newHarness(t, nil)
	c := h.dial(t)
	hp := h.project(t, 1)
	if err := os.Chown(hp.Workspace, 4242, 4242); err != nil { // writable by the guest user
		t.Fatal(err)
	}
	hog := h.startAs(t, c, hp, "", "python3", "-c", `
import ctypes, sys
libc = ctypes.CDLL(None)
n = sum(1 for _ in range(200) if libc.inotify_init1(0) >= 0)
print(n, flush=True)
open("/workspace/holding", "w").close()
sys.stdin.read()
`)
	if !hog.started {
		t.Fatalf("%#v", hog.first)
	}
	// The hog's count arrives on its stdout only at its end: its file
	// says when it holds them.
	other := h.project(t, 2)
	testenv.WaitFor(t, 10*time.Second, "the hog's instances", func() bool {
		_, err := os.Stat(filepath.Join(hp.Workspace, "holding"))
		return err == nil
	})
	r := h.run(t, c, other, "python3", "-c", `import ctypes; print(ctypes.CDLL(None).inotify_init1(0) >= 0)`)
	if strings.TrimSpace(r.stdout) != "True" {
		t.Errorf("another machine: %v", r)
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		t.Errorf("host: inotify_init1: %v", err)
	} else {
		unix.Close(fd)
	}
	res := hog.wait(t)
	if got := strings.TrimSpace(res.stdout); got != strconv.Itoa(guest.MaxInotifyInstances) {
		t.Errorf("the hog got %s instances, want the machine's limit %d", got, guest.MaxInotifyInstances)
	}
	// And the limits are the machine's own.
	r = h.run(t, c, other, "cat", "/proc/sys/user/max_inotify_instances", "/proc/sys/user/max_user_namespaces")
	if r.stdout != fmt.Sprintf("%d\n0\n", guest.MaxInotifyInstances) {
		t.Errorf("limits: %v", r)
	}
}

// TestDefaultUserRoot: a machine whose default user is root (as an image
// without a user says) runs its default sessions as root with Docker's
// capabilities, and named non-root users with none: the two forking
// threads swap classes.
func TestDefaultUserRoot(t *testing.T) {
	h := newHarness(t, nil)
	h.w.configHook = func(c *ctl.Config) { c.DefaultUser = "root" }
	c := h.dial(t)
	p := h.project(t, 1)
	root := fmt.Sprintf("%016x", guest.RootCapMask())
	for _, tt := range []struct{ user, want string }{
		{"", "0 /root " + root},
		{"root", "0 /root " + root},
		{"nobody", "65534 /nonexistent 0000000000000000"},
		{strconv.Itoa(GuestUID), fmt.Sprintf("%d * 0000000000000000", GuestUID)}, // HOME: its passwd entry's
	} {
		r := h.runAs(t, c, p, tt.user, "sh", "-c", `echo $(id -u) $HOME $(grep CapBnd /proc/self/status | cut -f2)`)
		got := strings.Fields(r.stdout)
		if len(got) == 3 && strings.Fields(tt.want)[1] == "*" {
			got[1] = "*"
		}
		if r.code() != 0 || strings.Join(got, " ") != tt.want {
			t.Errorf("user %q: %v, want %q", tt.user, r, tt.want)
		}
	}
}

// TestRootCloneParentKilledAtEnd: a process a root session makes with
// clone(CLONE_PARENT) is a child of the init's other forking thread; it
// dies with the session all the same.
func TestRootCloneParentKilledAtEnd(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("the script calls clone by its amd64 number")
	}
	h := newHarness(t, nil)
	c := h.dial(t)
	p := h.project(t, 1)
	const script = `
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
pid = libc.syscall(56, 0x8000 | 17, 0, 0, 0, 0)  # clone(CLONE_PARENT|SIGCHLD)
if pid == 0:
    os.execv("/bin/sleep", ["sleep", "4242"])
print(pid)
`
	r := h.runAs(t, c, p, "root", "python3", "-c", script)
	if r.code() != 0 || r.stdout == "" || r.stdout == "-1\n" {
		t.Fatalf("%v", r)
	}
	m := h.machineOf(t, 1)
	for _, pid := range machinePids(t, m) {
		if b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline"); strings.HasPrefix(string(b), "sleep\x004242") && alive(pid) {
			t.Errorf("left behind: %s", describe([]int{pid}))
		}
	}
}
