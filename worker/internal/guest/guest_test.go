package guest

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

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

// TestPoolSteadyAtLimit: a steady load of as many concurrent sessions as
// the machine admits reuses the same holders, round after round: the pool
// neither spawns nor discards any once warm.
func TestPoolSteadyAtLimit(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("holders are made in new pid namespaces, which needs root")
	}
	null, err := openNull()
	if err != nil {
		t.Fatal(err)
	}
	// Never unlocked: spawning on the spot enters holders' namespaces.
	runtime.LockOSThread()
	if err := unshareFS(); err != nil {
		t.Fatal(err)
	}
	home, err := openNSHome()
	if err != nil {
		t.Fatal(err)
	}
	const limit = 3
	p, err := newHolderPool(null, home, func(err error) { t.Error(err) }, false, retainFor(limit))
	if err != nil {
		t.Fatal(err)
	}
	var all []*holder
	t.Cleanup(func() {
		for _, h := range all {
			h.discard()
		}
		p.mu.Lock()
		for _, h := range p.ready {
			if !h.killed { // most were in all, already discarded
				h.discard()
			}
		}
		p.mu.Unlock()
		for {
			if pid, err := unix.Wait4(-1, nil, unix.WNOHANG, nil); err != nil || pid <= 0 {
				break
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
