package sandbox

import (
	"os"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestPopulatorWithinRoom: a populator given how much room the limits
// leave populates no further past the reads than that, however large its
// buffer: under a combined limit each stream's buffer may hold the whole
// limit, and two populators filling theirs made core hold twice the memory
// the command was admitted for (2.2 MiB of output under a 16 MiB combined
// limit grew core's RSS by 34 MiB; by ≈ 16 MiB with the bound).
func TestPopulatorWithinRoom(t *testing.T) {
	const size = 64 << 20
	b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(b)
	page := os.Getpagesize()
	const room = 3<<20 + 12345
	p := startPopulatorWithin(b[:0], func() int { return room })
	if p == nil {
		t.Fatal("no populator for a large buffer")
	}
	deadline := time.Now().Add(10 * time.Second)
	for p.done.Load() < room {
		if time.Now().After(deadline) {
			t.Fatalf("populated %d bytes, want %d", p.done.Load(), room)
		}
		runtime.Gosched()
	}
	// Having reached the room it waits for the reader (from >= to), so
	// what is resident now is all it will populate.
	if d := p.done.Load(); d != room {
		t.Fatalf("populated to %d, want exactly the room %d", d, room)
	}
	p.end()
	if n := resident(t, b); n > room/page+2 {
		t.Fatalf("%d pages resident, want at most %d (the room)", n, room/page+2)
	}
}

// TestCombinedLimitPopulatesHalfRoom: under a combined limit, a stream's
// populator is bounded by half of what the limit still allows (the other
// half is the other stream's); under per-stream limits, by its buffer
// (which its own limit bounds) alone.
func TestCombinedLimitPopulatesHalfRoom(t *testing.T) {
	for _, tc := range []struct {
		limit   OutputLimit
		bounded bool
	}{
		{OutputLimit{Combined: 16 << 20}, true},
		{OutputLimit{Stdout: 16 << 20, Stderr: 16 << 20}, false},
	} {
		c := newCapture(tc.limit, nil)
		r := &reader{c: c, name: Stdout, s: &c.stdout, keep: 16 << 20, valid: true, clean: true, sc: getScratch()}
		c.combined.Store(2 << 20)
		r.add(nil, make([]byte, firstBuffer+1))
		r.add(nil, make([]byte, 1)) // the second buffer: the reservation, populated
		if r.pop == nil {
			t.Fatalf("%+v: no populator", tc.limit)
		}
		got := r.pop.room != nil
		if got != tc.bounded {
			t.Fatalf("%+v: bounded by room %v, want %v", tc.limit, got, tc.bounded)
		}
		if tc.bounded {
			if n, want := r.pop.room(), (16<<20-2<<20)/2; n != want {
				t.Fatalf("%+v: room %d, want %d", tc.limit, n, want)
			}
		}
		r.finish()
	}
}
