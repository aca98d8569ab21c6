package guest

import (
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestMain runs this binary as a Go holder when a test's pool re-executes
// it as one.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == HolderArg {
		Holder()
	}
	os.Exit(m.Run())
}

func TestLookPath(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "prog")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "data"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		file, path, want, err string
	}{
		{"prog", "/nonexistent:" + dir, exe, ""},
		{"data", dir, "", "not found"},
		{"sub", dir, "", "not found"},
		{"nope", dir, "", "not found"},
		{"./rel/x", "", "./rel/x", ""},
		{"/abs/x", "", "/abs/x", ""},
	}
	for _, tt := range tests {
		got, err := lookPath(tt.file, tt.path)
		if got != tt.want || (err == nil) != (tt.err == "") || err != nil && !strings.Contains(err.Error(), tt.err) {
			t.Errorf("lookPath(%q, %q) = %q, %v", tt.file, tt.path, got, err)
		}
	}
}

func TestEnvPath(t *testing.T) {
	if got := envPath([]string{"PATH=/a", "HOME=/h", "PATH=/b"}); got != "/b" {
		t.Errorf("last PATH wins like getenv of a later assignment: %q", got)
	}
	if got := envPath([]string{"HOME=/h"}); got != "" {
		t.Errorf("no PATH: %q", got)
	}
}

// testPool starts a holder pool for a test running on a thread it locks
// (never unlocked: spawning on the spot enters holders' namespaces). Its
// cleanup waits for the spawner to be idle, then kills and reaps every
// ready holder, so that none outlives the test as an orphan on the host.
func testPool(tb testing.TB, retain int) (*holderPool, nsHome) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("holders are made in new pid namespaces, which needs root")
	}
	runtime.LockOSThread()
	if err := unshareFS(); err != nil {
		tb.Fatal(err)
	}
	home, err := openNSHome()
	if err != nil {
		tb.Fatal(err)
	}
	null, err := openNull()
	if err != nil {
		tb.Fatal(err)
	}
	p, err := newHolderPool(null, home, func(err error) { tb.Error(err) }, false, retain)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		for {
			p.mu.Lock()
			idle := p.pending == 0
			if idle {
				for _, h := range p.ready {
					if !h.killed {
						h.discard()
					}
				}
				p.ready = nil
			}
			p.mu.Unlock()
			if idle {
				break
			}
			time.Sleep(time.Millisecond)
		}
		for {
			if pid, err := unix.Wait4(-1, nil, unix.WNOHANG, nil); err != nil || pid <= 0 {
				break
			}
		}
	})
	return p, home
}

// TestPoolSteadyAtLimit: a steady load of as many concurrent sessions as
// the machine admits reuses the same holders, round after round: the pool
// neither spawns nor discards any once warm.
func TestPoolSteadyAtLimit(t *testing.T) {
	const limit = 3
	p, _ := testPool(t, retainFor(limit))
	var all []*holder
	t.Cleanup(func() {
		for _, h := range all {
			if !h.killed {
				h.discard()
			}
		}
	})
	seen := map[int]bool{}
	spawnedAfterWarmup := 0
	for round := range 12 {
		var busy []*holder
		for range limit {
			h, _, err := p.get()
			if err != nil {
				t.Fatal(err)
			}
			if !seen[h.pid] {
				seen[h.pid] = true
				all = append(all, h)
				if round >= 4 {
					spawnedAfterWarmup++
				}
			}
			busy = append(busy, h)
		}
		time.Sleep(20 * time.Millisecond) // ordered holders arrive meanwhile
		for _, h := range busy {
			if !h.alive() {
				t.Fatalf("round %d: holder %d died", round, h.pid)
			}
			p.put(h)
		}
	}
	if spawnedAfterWarmup != 0 {
		t.Errorf("%d holders spawned after warm-up (%d in all)", spawnedAfterWarmup, len(seen))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, h := range all {
		if h.killed {
			t.Errorf("holder %d discarded under a steady load", h.pid)
		}
	}
}

// BenchmarkEnterHolder measures what a session's fork adds for entering
// its holder's namespaces and returning: the pid namespace alone (before
// sessions had a /proc of their own) and the pid and mount namespaces.
func BenchmarkEnterHolder(b *testing.B) {
	p, home := testPool(b, 1)
	h, err := p.fresh()
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		h.discard()
		_, _ = unix.Wait4(h.pid, nil, 0, nil)
	}()
	// Each benchmark function runs in a goroutine of its own.
	lock := func(b *testing.B) {
		runtime.LockOSThread()
		if err := unshareFS(); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("pid", func(b *testing.B) {
		lock(b)
		for b.Loop() {
			if err := unix.Setns(h.pidfd, unix.CLONE_NEWPID); err != nil {
				b.Fatal(err)
			}
			if err := unix.Setns(home.pid, unix.CLONE_NEWPID); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("pid+mnt", func(b *testing.B) {
		lock(b)
		for b.Loop() {
			if err := enterHolder(h); err != nil {
				b.Fatal(err)
			}
			if err := home.restore(); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkHolderLifecycle measures a holder's spawn (with its /proc) and,
// separately, its end: SIGKILL until reaped, which tears down its pid
// namespace. Both are off the exec path; the end is on the path of a
// cancel and of a session that left processes behind. "held" is the
// init's way, the mount namespace held until close; "unheld" lets the
// holder's exit tear it down.
func BenchmarkHolderLifecycle(b *testing.B) {
	for _, held := range []bool{true, false} {
		b.Run(map[bool]string{true: "held", false: "unheld"}[held], func(b *testing.B) {
			p, _ := testPool(b, 1)
			var spawn, end time.Duration
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				h, err := p.fresh()
				if err != nil {
					b.Fatal(err)
				}
				if !held {
					unix.Close(h.mntns)
					h.mntns = -1
				}
				// As for a session's killed holder: reaped, then closed.
				t1 := time.Now()
				h.kill()
				if _, err := unix.Wait4(h.pid, nil, 0, nil); err != nil {
					b.Fatal(err)
				}
				spawn += t1.Sub(t0)
				end += time.Since(t1)
				h.close()
			}
			b.ReportMetric(float64(spawn.Microseconds())/float64(b.N), "spawn-µs")
			b.ReportMetric(float64(end.Microseconds())/float64(b.N), "end-µs")
		})
	}
}

// A holder that mounts its /proc itself (where procfs lacks the pidns
// option) gives its sessions the same view as one the init mounts for.
func TestSelfMountingHolder(t *testing.T) {
	for _, self := range []bool{false, true} {
		t.Run(map[bool]string{false: "byInit", true: "selfMount"}[self], func(t *testing.T) {
			p, home := testPool(t, 1)
			q := &holderPool{null: p.null, home: home, fail: p.fail, goHolder: true, selfMount: self}
			h, err := q.spawn()
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				h.discard()
				_, _ = unix.Wait4(h.pid, nil, 0, nil)
			}()
			r, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			attr := &syscall.ProcAttr{Files: []uintptr{uintptr(p.null), w.Fd(), w.Fd()}}
			const script = `echo $$ $(cat /proc/$$/comm) $(tr '\0' ' ' < /proc/1/cmdline)$(wc -c < /proc/cmdline)`
			if err := enterHolder(h); err != nil {
				t.Fatal(err)
			}
			pid, ferr := syscall.ForkExec("/bin/sh", []string{"sh", "-c", script}, attr)
			if err := home.restore(); err != nil {
				t.Fatal(err)
			}
			w.Close()
			if ferr != nil {
				t.Fatal(ferr)
			}
			out, _ := io.ReadAll(r)
			if _, err := unix.Wait4(pid, nil, 0, nil); err != nil {
				t.Fatal(err)
			}
			f := strings.Fields(string(out))
			want := []string{"sh", "corral-ns-holder", HolderArg}
			if self {
				want = append(want, holderMountArg)
			}
			want = append(want, "0") // /proc/cmdline masked
			if len(f) < 1 || f[0] == "1" || !slices.Equal(f[1:], want) {
				t.Fatalf("got %q, want a pid and %q", out, want)
			}
		})
	}
}

func TestTmpfsOptions(t *testing.T) {
	if got := tmpfsOptions("mode=1777", 0); got != "mode=1777" {
		t.Errorf("unsized: %q", got)
	}
	if got := tmpfsOptions("mode=1777", 64<<20); got != "mode=1777,size=67108864" {
		t.Errorf("sized: %q", got)
	}
}
