package worker

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/internal/idrange"
	"github.com/corral-sandbox/corral/internal/testenv"
	"github.com/corral-sandbox/corral/wire"
	"github.com/corral-sandbox/corral/worker/internal/cgroup"
	"github.com/corral-sandbox/corral/worker/internal/guest"
)

// Two workers with different state directories and default cgroup
// parents: starting, serving and shutting down one never disturbs the
// other's running machine. With a shared parent, B's New removed A's
// machine group and killed its processes.
func TestTwoWorkersSideBySide(t *testing.T) {
	a := newHarness(t, func(c *Config) { c.CgroupParent = "" })
	ca := a.dial(t)
	pa := a.project(t, 1)
	// A command that runs until told to finish, so that B's whole life
	// happens while it runs.
	run := a.start(t, ca, pa, "sh", "-c", "read x; echo done $x")
	if !run.started {
		t.Fatalf("%#v", run.first)
	}
	ma := a.machineOf(t, 1)

	// A second worker on A's state directory is refused: it would sweep
	// A's cgroups and share its id slots.
	if _, err := New(Config{ProjectsRoot: a.root, StateDir: a.w.cfg.StateDir, IDRegistry: testIDRegistry}); !errors.Is(err, ErrStateDirInUse) {
		t.Fatalf("second worker on one state directory: %v", err)
	}
	b := newHarness(t, func(c *Config) { c.CgroupParent = "" })
	if a.w.cfg.CgroupParent == b.w.cfg.CgroupParent || !strings.HasPrefix(a.w.cfg.CgroupParent, "corral-") {
		t.Fatalf("cgroup parents %q and %q", a.w.cfg.CgroupParent, b.w.cfg.CgroupParent)
	}
	cb := b.dial(t)
	if r := b.run(t, cb, b.project(t, 1), "echo", "b"); r.stdout != "b\n" {
		t.Fatalf("worker B: %v", r)
	}
	if err := b.w.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !alive(ma.InitPID) {
		t.Fatal("worker B killed worker A's machine")
	}
	if _, err := run.stdinW.WriteString("ok\n"); err != nil {
		t.Fatal(err)
	}
	if r := run.wait(t); r.code() != 0 || r.stdout != "done ok\n" {
		t.Fatalf("worker A's command after B's life: %v", r)
	}
	for _, d := range ma.Cgroups {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("A's machine group: %v", err)
		}
	}
}

// A parent removed from outside (another process, an operator) is made
// again at the next machine start instead of failing it forever.
func TestCgroupParentRecreated(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.IdleGrace = 50 * time.Millisecond })
	c := h.dial(t)
	p := h.project(t, 1)
	h.run(t, c, p, "true")
	testenv.WaitFor(t, 10*time.Second, "idle stop", func() bool { return len(h.w.Machines()) == 0 })
	for _, d := range h.w.cgroups.Parents() {
		testenv.WaitFor(t, 10*time.Second, "remove "+d, func() bool { return os.Remove(d) == nil })
	}
	if r := h.run(t, c, p, "echo", "back"); r.stdout != "back\n" {
		t.Fatalf("after the parent was removed: %v", r)
	}
	for _, d := range h.machineOf(t, 1).Cgroups {
		if filepath.Dir(d) == "" {
			t.Fatal(d)
		}
		if _, err := os.Stat(d); err != nil {
			t.Errorf("machine group: %v", err)
		}
	}
}

// Two workers on different state directories map disjoint host ids; a
// worker restarted on the same state directory gives a project the same
// range (files in its home and upper layer keep their owners).
func TestIDRanges(t *testing.T) {
	state := t.TempDir()
	a := newHarness(t, func(c *Config) { c.MaxProjects = 8; c.StateDir = state })
	b := newHarness(t, func(c *Config) { c.MaxProjects = 8 })
	if a.w.ids.Start < idrange.Floor || b.w.ids.Start < idrange.Floor ||
		a.w.ids.Start < b.w.ids.Start+b.w.ids.Size && b.w.ids.Start < a.w.ids.Start+a.w.ids.Size {
		t.Fatalf("blocks %+v and %+v", a.w.ids, b.w.ids)
	}
	ca, cb := a.dial(t), b.dial(t)
	a.run(t, ca, a.project(t, 5), "true")
	a.run(t, ca, a.project(t, 7), "true")
	b.run(t, cb, b.project(t, 5), "true")
	ma5, ma7, mb5 := a.machineOf(t, 5), a.machineOf(t, 7), b.machineOf(t, 5)
	if ma5.HostUID == ma7.HostUID || ma5.HostUID == mb5.HostUID || ma7.HostUID == mb5.HostUID {
		t.Fatalf("host uids: A/5 %d, A/7 %d, B/5 %d", ma5.HostUID, ma7.HostUID, mb5.HostUID)
	}
	if err := a.w.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	// The restarted worker: project 7 first this time.
	a2 := newHarness(t, func(c *Config) { c.MaxProjects = 8; c.StateDir = state })
	c2 := a2.dial(t)
	a2.run(t, c2, a2.project(t, 7), "true")
	a2.run(t, c2, a2.project(t, 5), "true")
	if got5, got7 := a2.machineOf(t, 5).HostUID, a2.machineOf(t, 7).HostUID; got5 != ma5.HostUID || got7 != ma7.HostUID {
		t.Fatalf("after a restart: project 5 %d (was %d), project 7 %d (was %d)", got5, ma5.HostUID, got7, ma7.HostUID)
	}
}

// inotifyHog creates up to 200 inotify instances, prints how many it got,
// and holds them until stdin closes.
const inotifyHog = `
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
n = 0
for _ in range(200):
    if libc.inotify_init() < 0:
        break
    n += 1
print(n, flush=True)
open("/workspace/held", "w").write(str(n))
sys.stdin.read()
`

const inotifyOnce = `
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init()
print("ok" if fd >= 0 else "failed: " + os.strerror(ctypes.get_errno()))
`

// A machine's user namespace is owned by its guest root's host id, so that
// what its processes create is charged to that id's per-user quotas, not
// host root's: 200 inotify instances in one machine leave inotify_init
// working in another machine and on the host.
func TestMachineQuotasNotChargedToHostRoot(t *testing.T) {
	h := newHarness(t, nil)
	c := h.dial(t)
	p1 := h.project(t, 1)
	if err := os.Chown(p1.Workspace, 4242, 4242); err != nil { // writable by the guest user (idmapped)
		t.Fatal(err)
	}
	hog := h.start(t, c, p1, "python3", "-c", inotifyHog)
	if !hog.started {
		t.Fatalf("%#v", hog.first)
	}
	m := h.machineOf(t, 1)
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", m.InitPID))
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	var owner uint32
	const nsGetOwnerUID = 0xb704 // _IO(0xb7, 0x4)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, ns.Fd(), nsGetOwnerUID, uintptr(unsafe.Pointer(&owner))); e != 0 {
		t.Fatal(e)
	}
	if owner != m.HostUID {
		t.Fatalf("machine user namespace owned by host uid %d, want its guest root %d", owner, m.HostUID)
	}
	// Wait until the hog holds its instances.
	held := filepath.Join(h.root, "p1", "held")
	testenv.WaitFor(t, 10*time.Second, "instances held", func() bool { b, _ := os.ReadFile(held); return len(b) > 0 })
	b, _ := os.ReadFile(held)
	t.Logf("inotify instances held in machine 1: %s", b)

	if r := h.run(t, c, h.project(t, 2), "python3", "-c", inotifyOnce); r.stdout != "ok\n" {
		t.Errorf("inotify_init in another machine: %v", r)
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		t.Errorf("inotify_init on the host: %v", err)
	} else {
		unix.Close(fd)
	}
	hog.wait(t)
}

// machineGroup returns the cgroup of project id's running machine.
func (h *harness) machineGroup(t testing.TB, id int64) *machine {
	t.Helper()
	h.w.mu.Lock()
	defer h.w.mu.Unlock()
	m := h.w.machines[id]
	if m == nil {
		t.Fatalf("no machine for project %d", id)
	}
	return m
}

// Four busy loops in a machine limited to a fifth of a CPU use about that
// (without the limit they take what the host has: both cores of this one
// when idle, about 0.3 CPU when other tests load it; a small limit keeps
// the assertion meaningful under load).
func TestCPULimit(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Limits.CPUMillis = 200 })
	c := h.dial(t)
	run := h.start(t, c, h.project(t, 1), "sh", "-c", "for i in 1 2 3 4; do (while :; do :; done) & done; wait")
	if !run.started {
		t.Fatalf("%#v", run.first)
	}
	cg := h.machineGroup(t, 1).cg
	if _, err := cg.CPUUsage(); err != nil {
		t.Skip(err)
	}
	time.Sleep(200 * time.Millisecond) // the loops start
	u0, _ := cg.CPUUsage()
	t0 := time.Now()
	time.Sleep(time.Second)
	u1, _ := cg.CPUUsage()
	cpus := float64(u1-u0) / float64(time.Since(t0))
	t.Logf("4 busy loops used %.2f CPUs", cpus)
	if cpus > 0.26 {
		t.Errorf("a machine limited to 0.2 CPU used %.2f CPUs", cpus)
	}
	if err := c.Send(&wire.ExecCancel{ID: run.id}); err != nil {
		t.Fatal(err)
	}
	run.wait(t)
}

// /tmp and /dev/shm are sized: filling them gets ENOSPC, and the machine
// (its init) lives on.
func TestTmpSized(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Limits.Tmp = 16 << 20 })
	c := h.dial(t)
	p := h.project(t, 1)
	for _, dir := range []string{"/tmp", "/dev/shm"} {
		r := h.run(t, c, p, "dd", "if=/dev/zero", "of="+dir+"/fill", "bs=1M", "count=64")
		if r.code() == 0 || !strings.Contains(r.stderr, "No space left on device") {
			t.Errorf("filling %s: %v", dir, r)
		}
	}
	init := h.machineOf(t, 1).InitPID
	if r := h.run(t, c, p, "df", "-B1", "--output=size", "/tmp"); !strings.Contains(r.stdout, "16777216") {
		t.Errorf("df /tmp: %v", r)
	}
	if h.machineOf(t, 1).InitPID != init {
		t.Fatal("the machine restarted")
	}
}

// The init and the holders are spared by the OOM killer (-1000); a
// session starts unprotected (0). Without CAP_SYS_RESOURCE (this CI's
// container) the init keeps 0 and sessions start at 500.
func TestOOMScoreAdj(t *testing.T) {
	h := newHarness(t, nil)
	c := h.dial(t)
	p := h.project(t, 1)
	r := h.run(t, c, p, "sh", "-c", "cat /proc/self/oom_score_adj; sleep 0 & wait")
	m := h.machineOf(t, 1)
	read := func(pid int) string {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid))
		return strings.TrimSpace(string(b))
	}
	own, session := "-1000", "0"
	if !hasCap(unix.CAP_SYS_RESOURCE) {
		own, session = "0", "500"
	}
	if r.stdout != session+"\n" {
		t.Errorf("session oom_score_adj %q, want %s", r.stdout, session)
	}
	if v := read(m.InitPID); v != own {
		t.Errorf("init oom_score_adj %q, want %s", v, own)
	}
	hs := holderPids(t, m)
	if len(hs) == 0 {
		t.Fatal("no holders")
	}
	for _, pid := range hs {
		if v := read(pid); v != own {
			t.Errorf("holder %d oom_score_adj %q, want %s", pid, v, own)
		}
	}
}

func hasCap(c int) bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var d [2]unix.CapUserData
	if err := unix.Capget(&hdr, &d[0]); err != nil {
		return false
	}
	return d[c/32].Effective&(1<<(c%32)) != 0
}

// A request with other limits changes a running machine's cgroup at once.
func TestLimitsChangedLive(t *testing.T) {
	h := newHarness(t, nil)
	c := h.dial(t)
	p := h.project(t, 1)
	h.run(t, c, p, "true")
	init := h.machineOf(t, 1).InitPID
	p.Limits = &wire.Limits{Memory: 200 << 20, CPU: 500, Pids: 100}
	h.run(t, c, p, "true")
	if h.machineOf(t, 1).InitPID != init {
		t.Fatal("the machine restarted")
	}
	want := map[string]string{
		"memory.limit_in_bytes": "209715200", "memory.max": "209715200",
		"pids.max": "100", "cpu.cfs_quota_us": "50000", "cpu.max": "50000 100000",
	}
	found := 0
	for _, d := range h.machineOf(t, 1).Cgroups {
		for f, v := range want {
			b, err := os.ReadFile(filepath.Join(d, f))
			if err != nil {
				continue
			}
			found++
			if got := strings.TrimSpace(string(b)); got != v {
				t.Errorf("%s/%s = %q, want %q", d, f, got, v)
			}
		}
	}
	if found < 3 {
		t.Errorf("only %d limit files found", found)
	}
}

// On cgroup v2 every session runs in a group of its own below its
// machine's, entered with CLONE_INTO_CGROUP, so that even a process that
// left the session's tree (reparented) is in it and goes with it. This
// host's machines use v1, whose v2 hierarchy (hybrid, without
// controllers) still takes sessions' groups: the worker is told to use it.
func TestSessionCgroupsV2(t *testing.T) {
	const unified = "/sys/fs/cgroup/unified"
	var st unix.Statfs_t
	if err := unix.Statfs(unified, &st); err != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
		t.Skip("no hybrid v2 hierarchy at " + unified)
	}
	h := newHarness(t, nil)
	l, err := cgroup.DetectAt(unified, h.w.cfg.CgroupParent)
	if err != nil {
		t.Fatal(err)
	}
	h.w.sessionLayout.Store(l)
	c := h.dial(t)
	run := h.start(t, c, h.project(t, 1), "sh", "-c", "(sleep 100 &); exec sleep 100")
	if !run.started {
		t.Fatalf("%#v", run.first)
	}
	m := h.machineOf(t, 1)
	group := filepath.Join(l.Parents()[0], "machine-1.1", "s-1")
	if !guest.PolicyAllowsClone3() {
		// The syscall policy answers ENOSYS to clone3: no session group,
		// and sessions run and die with their holder as on v1.
		if _, err := os.Stat(group); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("session group made although clone3 is refused: %v", err)
		}
		if err := c.Send(&wire.ExecCancel{ID: run.id}); err != nil {
			t.Fatal(err)
		}
		if r := run.wait(t); r.exit.Signal != "SIGKILL" {
			t.Fatalf("cancelled: %v", r)
		}
		t.Skip("the sessions' syscall policy refuses clone3 (Docker's): CLONE_INTO_CGROUP cannot be used")
	}
	var procs []string
	testenv.WaitFor(t, 10*time.Second, "the session and its reparented sleep in the session's group", func() bool {
		b, _ := os.ReadFile(filepath.Join(group, "cgroup.procs"))
		procs = strings.Fields(string(b))
		return len(procs) == 2
	})
	for _, p := range procs {
		if n, _ := strconv.Atoi(p); n == m.InitPID || isHolder(n) {
			t.Errorf("init or holder %d in the session's group", n)
		}
	}
	if err := c.Send(&wire.ExecCancel{ID: run.id}); err != nil {
		t.Fatal(err)
	}
	if r := run.wait(t); r.exit.Signal != "SIGKILL" {
		t.Fatalf("cancelled: %v", r)
	}
	testenv.WaitFor(t, 10*time.Second, "the session's group removed", func() bool { _, err := os.Stat(group); return errors.Is(err, os.ErrNotExist) })
	if r := h.run(t, c, h.project(t, 1), "echo", "next"); r.stdout != "next\n" {
		t.Fatalf("next session: %v", r)
	}
	if err := h.w.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	l.RemoveParents()
	if _, err := os.Stat(l.Parents()[0]); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("v2 parent left: %v", err)
	}
}
