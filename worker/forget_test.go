package worker

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/wire"
)

// TestDeletedProjectsFreeTheirIDRanges replays issue 24's attack 2: create,
// run, delete, many more times than the worker has id ranges, never more
// than one project alive. A deleted project's machine-reset with "forget"
// frees its range, its home and its upper layer.
func TestDeletedProjectsFreeTheirIDRanges(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxProjects = 2 })
	c := h.dial(t)
	for id := int64(1); id <= 6; id++ {
		p := h.project(t, id)
		if r := h.runAs(t, c, p, "root", "sh", "-c", "echo x >/home/corral/f && echo y >/etc/f"); r.code() != 0 {
			t.Fatalf("project %d: %v", id, r)
		}
		home := filepath.Join(h.w.cfg.HomesRoot, strconv.FormatInt(id, 10))
		if _, err := os.Stat(home); err != nil {
			t.Fatalf("project %d has no home on the host: %v", id, err)
		}
		rid := "forget" + strconv.FormatInt(id, 10)
		if err := c.Send(&wire.MachineReset{ID: rid, Project: p, Forget: true}); err != nil {
			t.Fatal(err)
		}
		if m, ok := recv(t, c).(*wire.MachineResetDone); !ok || m.ID != rid {
			t.Fatalf("forget project %d: %#v", id, m)
		}
		for _, dir := range []string{home, h.w.projectDir(id)} {
			if _, err := os.Lstat(dir); !os.IsNotExist(err) {
				t.Errorf("project %d forgotten, but %s remains (%v)", id, dir, err)
			}
		}
	}
}

// TestSlotsReconciledAtStart: a worker that starts frees the id ranges
// (and homes) of projects whose workspace is gone, and keeps the others.
func TestSlotsReconciledAtStart(t *testing.T) {
	requireRoot(t)
	root := t.TempDir()
	cfg := Config{ProjectsRoot: root, StateDir: t.TempDir(), MaxProjects: 2, IDRegistry: testIDRegistry, CgroupParent: "corral-test-reconcile-" + strconv.Itoa(os.Getpid())}
	gone, kept := filepath.Join(root, "gone"), filepath.Join(root, "kept")
	for _, d := range []string{gone, kept} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	start := func() *Worker {
		w, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			for _, d := range w.cgroups.Parents() {
				_ = os.Remove(d)
			}
		})
		return w
	}
	shutdown := func(w *Worker) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := w.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
	}
	w := start()
	w.mu.Lock()
	_, err1 := w.slot(1, gone)
	_, err2 := w.slot(2, kept)
	w.mu.Unlock()
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	home1 := filepath.Join(w.cfg.HomesRoot, "1")
	if err := os.Mkdir(home1, 0o700); err != nil {
		t.Fatal(err)
	}
	shutdown(w)
	if err := os.Remove(gone); err != nil {
		t.Fatal(err)
	}
	w = start()
	defer shutdown(w)
	w.mu.Lock()
	_, has1 := w.slots[1]
	_, has2 := w.slots[2]
	w.mu.Unlock()
	if has1 || !has2 {
		t.Errorf("after restart: slot of the project without workspace kept %v, of the one with %v", has1, has2)
	}
	if _, err := os.Lstat(home1); !os.IsNotExist(err) {
		t.Errorf("home of the project without workspace remains: %v", err)
	}
	w.mu.Lock()
	_, err := w.slot(3, kept)
	w.mu.Unlock()
	if err != nil {
		t.Errorf("a new project after the restart: %v", err)
	}
}
