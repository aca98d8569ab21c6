package worker

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/internal/mountpin"
	"github.com/corral-sandbox/corral/wire"
)

// allocated is what the project disks under state take on the host
// filesystem (their blocks): what the machines' writes cost the host,
// whatever other processes on the same filesystem do meanwhile.
func allocated(t testing.TB, state string) int64 {
	t.Helper()
	imgs, _ := filepath.Glob(filepath.Join(state, "disks", "*.img"))
	var n int64
	for _, img := range imgs {
		var st unix.Stat_t
		if err := unix.Stat(img, &st); err != nil {
			t.Fatal(err)
		}
		n += st.Blocks * 512
	}
	return n
}

// A machine's home is a disk of Limits.Disk bytes: a write past it fails
// with ENOSPC, the host filesystem loses at most the limit, the machine
// keeps working, another project's disk is its own, an existing host home
// moves onto the disk, and the data outlives a worker restart; Shutdown
// leaves no loop device attached.
func TestDiskLimit(t *testing.T) {
	const limit = 64 << 20
	state, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mountpin.Await(t, state+"/") }) // after the workers' Shutdown
	h := newHarness(t, func(c *Config) { c.StateDir = state; c.Limits.Disk = limit })
	// A home made before disks existed (an upgrade).
	old := filepath.Join(h.w.cfg.HomesRoot, "1")
	if err := os.MkdirAll(old, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(old, "note"), []byte("from the host home\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c := h.dial(t)
	p := h.project(t, 1)
	if r := h.run(t, c, p, "cat", "/home/corral/note"); r.code() != 0 || r.stdout != "from the host home\n" {
		t.Fatalf("the host home on the disk: %v", r)
	}
	if _, err := os.Stat(old); !os.IsNotExist(err) {
		t.Errorf("the host home is left after its move: %v", err)
	}
	if r := h.run(t, c, p, "fallocate", "-l", "3G", "/home/corral/big"); r.code() == 0 || !strings.Contains(r.stderr, "No space left") {
		t.Errorf("fallocate 3G under a 64 MiB disk: %v", r)
	}
	if r := h.run(t, c, p, "dd", "if=/dev/zero", "of=/home/corral/big", "bs=1M", "count=200", "conv=fsync"); r.code() == 0 || !strings.Contains(r.stderr, "No space left") {
		t.Errorf("dd 200 MiB under a 64 MiB disk: %v", r)
	}
	if used := allocated(t, state); used > limit {
		t.Errorf("the disk takes %d MiB of the host filesystem under a 64 MiB limit", used>>20)
	}
	// Another project's disk is its own: it has room while project 1's
	// is full, and a limit of its own (the request's).
	p2 := h.project(t, 2)
	p2.Limits = &wire.Limits{Disk: 32 << 20}
	if r := h.run(t, c, p2, "dd", "if=/dev/zero", "of=/home/corral/f", "bs=1M", "count=16", "conv=fsync"); r.code() != 0 {
		t.Errorf("project 2 writing 16 MiB beside a full project 1: %v", r)
	}
	if r := h.run(t, c, p2, "dd", "if=/dev/zero", "of=/home/corral/g", "bs=1M", "count=24", "conv=fsync"); r.code() == 0 || !strings.Contains(r.stderr, "No space left") {
		t.Errorf("project 2 writing past its 32 MiB: %v", r)
	}
	// Project 1 keeps working once it deletes.
	if r := h.run(t, c, p, "sh", "-c", "rm /home/corral/big && echo kept > /home/corral/small && cat /home/corral/small"); r.code() != 0 || r.stdout != "kept\n" {
		t.Fatalf("a small write after deleting: %v", r)
	}
	// The upper layer is on the disk too: root's writes to the image's
	// directories count, and a reset removes them (not the home).
	if r := h.runAs(t, c, p, "root", "dd", "if=/dev/zero", "of=/var/big", "bs=1M", "count=200", "conv=fsync"); r.code() == 0 || !strings.Contains(r.stderr, "No space left") {
		t.Errorf("root writing 200 MiB under /var with a 64 MiB disk: %v", r)
	}
	if r := h.runAs(t, c, p, "root", "sh", "-c", "rm /var/big && echo x > /var/mark"); r.code() != 0 {
		t.Fatalf("root's small write after deleting: %v", r)
	}
	if _, err := os.Stat(filepath.Join(state, "disks", "1", "layer", "upper", "var", "mark")); err != nil {
		t.Errorf("the upper layer is not on the disk: %v", err)
	}
	if err := h.w.Reset(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	if r := h.run(t, c, p, "sh", "-c", "test ! -e /var/mark && cat /home/corral/small"); r.code() != 0 || r.stdout != "kept\n" {
		t.Errorf("after a reset: %v", r)
	}
	if r := h.run(t, c, p, "df", "-B1", "--output=size", "/home/corral"); r.code() != 0 {
		t.Errorf("df: %v", r)
	} else {
		t.Logf("df /home/corral of a 64 MiB disk: %s", strings.Fields(r.stdout)[1])
	}
	c.Close()

	// A restart re-attaches the disk.
	if err := h.w.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	mountpin.Await(t, state+"/")
	h2 := newHarness(t, func(c *Config) { c.StateDir = state; c.ProjectsRoot = h.root; c.Limits.Disk = limit })
	c2 := h2.dial(t)
	if r := h2.run(t, c2, p, "cat", "/home/corral/small"); r.code() != 0 || r.stdout != "kept\n" {
		t.Fatalf("after a restart: %v", r)
	}
}

// A project's first start with a disk limit moves its host home and upper
// layer onto the new disk: nothing of the machine is lost, nothing is left
// on the host.
func TestDiskMigrates(t *testing.T) {
	state, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mountpin.Await(t, state+"/") })
	h := newHarness(t, func(c *Config) { c.StateDir = state })
	c := h.dial(t)
	p := h.project(t, 1)
	if r := h.runAs(t, c, p, "root", "sh", "-c", "echo layer > /var/mark && echo home > /home/corral/note"); r.code() != 0 {
		t.Fatal(r)
	}
	c.Close()
	if err := h.w.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	h2 := newHarness(t, func(c *Config) { c.StateDir = state; c.ProjectsRoot = h.root; c.Limits.Disk = 64 << 20 })
	c2 := h2.dial(t)
	if r := h2.run(t, c2, p, "cat", "/var/mark", "/home/corral/note"); r.code() != 0 || r.stdout != "layer\nhome\n" {
		t.Fatalf("after the move onto the disk: %v", r)
	}
	for _, d := range []string{h2.w.projectDir(1), filepath.Join(h2.w.cfg.HomesRoot, "1")} {
		if _, err := os.Lstat(d); !os.IsNotExist(err) {
			t.Errorf("%s is left on the host: %v", d, err)
		}
	}
	if _, err := os.Stat(filepath.Join(state, "disks", "1", "layer", "upper", "var", "mark")); err != nil {
		t.Errorf("the upper layer is not on the disk: %v", err)
	}
}
