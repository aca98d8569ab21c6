package worker

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/internal/idrange"
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
	eventually(t, "idle stop", func() bool { return len(h.w.Machines()) == 0 })
	for _, d := range h.w.cgroups.Parents() {
		eventually(t, "remove "+d, func() bool { return os.Remove(d) == nil })
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
	hog := h.start(t, c, h.project(t, 1), "python3", "-c", inotifyHog)
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
	eventually(t, "instances held", func() bool { b, _ := os.ReadFile(held); return len(b) > 0 })
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
