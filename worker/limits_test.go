package worker

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/wire"
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

var _ = wire.Protocol
