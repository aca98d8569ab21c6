package cgroup

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("cgroup tests need root")
	}
}

// exercise runs a group through its life: limits, a process added, a
// process it forks accounted too, Kill, Destroy.
func exercise(t *testing.T, l *Layout, lim Limits) {
	t.Helper()
	g, err := l.New("g", lim)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Destroy() })
	if lim.Pids > 0 {
		b, err := os.ReadFile(filepath.Join(g.path("pids"), "pids.max"))
		if err != nil || strings.TrimSpace(string(b)) != strconv.FormatInt(lim.Pids, 10) {
			t.Fatalf("pids.max = %q, %v", b, err)
		}
	}
	if lim.Memory > 0 && !l.v2 {
		b, err := os.ReadFile(filepath.Join(g.path("memory"), "memory.limit_in_bytes"))
		if err != nil || strings.TrimSpace(string(b)) != strconv.FormatInt(lim.Memory, 10) {
			t.Fatalf("memory.limit_in_bytes = %q, %v", b, err)
		}
	}
	// A shell that forks a sleep after it was added: both belong to g.
	cmd := exec.Command("sh", "-c", "read x; sleep 100 & wait")
	w, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	if err := g.Add(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(w, "go")
	deadline := time.Now().Add(5 * time.Second)
	for {
		pids, err := g.Procs()
		if err != nil {
			t.Fatal(err)
		}
		if len(pids) == 2 && slices.Contains(pids, cmd.Process.Pid) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("procs %v, want the shell and its sleep", pids)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := g.Kill(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err == nil {
		t.Fatal("shell survived Kill")
	}
	if pids, _ := g.Procs(); len(pids) != 0 {
		t.Fatalf("left after Kill: %v", pids)
	}
	if err := g.Destroy(); err != nil {
		t.Fatal(err)
	}
	for _, p := range g.Paths() {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left after Destroy: %v", p, err)
		}
	}
	if err := g.Destroy(); err != nil {
		t.Errorf("second Destroy: %v", err)
	}
}

func parentName(t *testing.T) string {
	return fmt.Sprintf("corral-cgtest-%d-%s", os.Getpid(), t.Name())
}

func removeParents(l *Layout) {
	for _, p := range l.parents {
		_ = unix.Rmdir(p)
	}
}

func TestV1(t *testing.T) {
	requireRoot(t)
	var st unix.Statfs_t
	if err := unix.Statfs(filepath.Join(Root, "pids"), &st); err != nil || st.Type != unix.CGROUP_SUPER_MAGIC {
		t.Skip("no cgroup v1 pids hierarchy on this host")
	}
	l, err := detect(Root, parentName(t))
	if err != nil {
		t.Fatal(err)
	}
	defer removeParents(l)
	if l.V2() {
		t.Fatal("detected v2 on a v1 host")
	}
	exercise(t, l, Limits{Memory: 64 << 20, Pids: 10})
}

func TestV2(t *testing.T) {
	requireRoot(t)
	root := Root
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
		// A hybrid host: the unified hierarchy (without controllers) still
		// exercises creation, placement, cgroup.kill and removal.
		root = filepath.Join(Root, "unified")
		if err := unix.Statfs(root, &st); err != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
			t.Skip("no cgroup v2 hierarchy on this host")
		}
	}
	l, err := detect(root, parentName(t))
	if err != nil {
		t.Fatal(err)
	}
	defer removeParents(l)
	if !l.V2() {
		t.Fatal("v2 not detected")
	}
	var lim Limits
	if b, _ := os.ReadFile(filepath.Join(l.parents[0], "cgroup.subtree_control")); strings.Contains(string(b), "pids") {
		lim.Pids = 10
	}
	exercise(t, l, lim)
}

func TestRemoveStale(t *testing.T) {
	requireRoot(t)
	l, err := detect(Root, parentName(t))
	if err != nil {
		t.Skip(err)
	}
	defer removeParents(l)
	g, err := l.New("stale", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sleep", "100")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := g.Add(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if err := l.RemoveStale(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err == nil {
		t.Fatal("process of a stale group survived")
	}
	if _, err := os.Stat(g.Paths()[0]); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stale group left: %v", err)
	}
}

// Sessions get cgroups of their own on v2 only, under the machine's group,
// which is delegated to the machine's guest root (and nothing on v1).
func TestSessionParentAndDelegate(t *testing.T) {
	requireRoot(t)
	for _, root := range []string{Root, filepath.Join(Root, "unified")} {
		var st unix.Statfs_t
		if err := unix.Statfs(root, &st); err != nil || st.Type != unix.CGROUP2_SUPER_MAGIC && root != Root {
			continue
		}
		l, err := detect(root, parentName(t))
		if err != nil {
			t.Fatal(err)
		}
		g, err := l.New("s", Limits{})
		if err != nil {
			removeParents(l)
			t.Fatal(err)
		}
		if err := g.Delegate(123456, 123457); err != nil {
			t.Error(err)
		}
		switch sp := g.SessionParent(); {
		case !l.V2() && sp != "":
			t.Errorf("v1 session parent %q", sp)
		case l.V2() && sp != g.Paths()[0]:
			t.Errorf("v2 session parent %q, want %q", sp, g.Paths()[0])
		case l.V2():
			for _, f := range []string{"", "cgroup.procs", "cgroup.subtree_control"} {
				var s unix.Stat_t
				if err := unix.Stat(filepath.Join(sp, f), &s); err != nil || s.Uid != 123456 || s.Gid != 123457 {
					t.Errorf("%s/%s: owner %d:%d, %v", sp, f, s.Uid, s.Gid, err)
				}
			}
		}
		_ = g.Destroy()
		removeParents(l)
	}
}

// BenchmarkOOMKills reads a group's OOM kill count as every session start
// does: "reopen" opens and reads the file each time (os.ReadFile, as
// before), "pread" re-reads the file OOMKills holds open.
func BenchmarkOOMKills(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("cgroup benchmarks need root")
	}
	l, err := Detect(fmt.Sprintf("corral-cgbench-%d", os.Getpid()))
	if err != nil {
		b.Skip(err)
	}
	defer removeParents(l)
	g, err := l.New("g", Limits{Memory: 64 << 20})
	if err != nil {
		b.Fatal(err)
	}
	defer g.Destroy()
	file := "memory.oom_control"
	if g.v2 {
		file = "memory.events"
	}
	for range 3 {
		b.Run("reopen", func(b *testing.B) {
			for b.Loop() {
				raw, err := os.ReadFile(filepath.Join(g.path("memory"), file))
				if err != nil {
					b.Fatal(err)
				}
				if _, err := parseOOMKills(raw); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("pread", func(b *testing.B) {
			for b.Loop() {
				if _, err := g.OOMKills(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
