package sandbox

import (
	"bytes"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"strings"
	"testing"
	"testing/iotest"
	"time"
	"unicode/utf8"
	"unsafe"

	"golang.org/x/sys/unix"
)

// randomReads returns src in reads of random sizes (1 byte to 96 KiB).
type randomReads struct {
	src []byte
	rnd *rand.Rand
}

func (r *randomReads) Read(p []byte) (int, error) {
	if len(r.src) == 0 {
		return 0, io.EOF
	}
	n := min(len(p), len(r.src), 1+r.rnd.IntN(96<<10))
	if r.rnd.IntN(4) == 0 {
		n = min(n, 1+r.rnd.IntN(4)) // often split a sequence or a path
	}
	copy(p, r.src[:n])
	r.src = r.src[n:]
	return n, nil
}

const testRoot = "/srv/corral/projects/p1"

func testSanitize(s string) string { return replacePathForBench(s, testRoot, "/workspace") }
func testHold(s string) int        { return sanitizeHoldForBench(s, testRoot) }

// TestCaptureResultMatchesWholeRender: whatever the reads' sizes, the
// result of the fused checks is what decoding and sanitizing the whole
// output gives: host roots split across reads (past the scratch buffer,
// where the checks run) are still replaced, UTF-8 sequences split across
// reads are kept, invalid bytes still become U+FFFD; raw output is only
// sanitized.
func TestCaptureResultMatchesWholeRender(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	pieces := []string{"héllo €𝄞 ", testRoot + "/a ", testRoot + "x ", "/srv/corral/pro", "\xff", "\xe2\x82", "\x00\n", strings.Repeat("z", 5000)}
	for i := range 40 {
		var b strings.Builder
		size := []int{100, 40 << 10, 1<<20 + 3, 9 << 20}[i%4]
		for b.Len() < size {
			p := pieces[rnd.IntN(len(pieces))]
			if i%3 != 2 && (p == "\xff" || p == "\xe2\x82") {
				p = "ok " // mostly valid outputs, so the fused path is taken
			}
			b.WriteString(p)
		}
		src := b.String()
		for _, raw := range []bool{false, true} {
			c := newCapture(OutputLimit{Stdout: 16 << 20, Stderr: 1}, nil)
			c.sanitize, c.hold = testSanitize, testHold
			c.start(&randomReads{[]byte(src), rnd}, nil)
			<-c.done
			want := render(src, testSanitize)
			if raw {
				want = testSanitize(src)
			}
			if got := c.stdout.result(raw, testSanitize); got != want {
				t.Fatalf("case %d (%d bytes, raw %v): result differs from the whole output's render", i, len(src), raw)
			}
			if strings.Contains(c.stdout.result(raw, testSanitize), testRoot+"/") {
				t.Fatalf("case %d: a host root survived", i)
			}
		}
	}
}

// TestCaptureResultChecks: valid output read in one-byte pieces is known
// valid and clean; a root in it, or an invalid byte, makes it neither known
// clean nor known valid, and the result is right anyway. A SanitizeHold that
// holds everything back makes the result sanitized whole.
func TestCaptureResultChecks(t *testing.T) {
	valid := strings.Repeat("€𝄞 ascii ", 40<<10/12)
	for _, tc := range []struct {
		name         string
		src          string
		hold         func(string) int
		plain, clean bool
	}{
		{"valid", valid, testHold, true, true},
		{"root", valid + testRoot + "/x" + valid, testHold, true, false},
		{"root at the end", valid + testRoot, testHold, true, false},
		{"invalid", valid + "\xff" + valid, testHold, false, true},
		{"truncated at the end", valid + "\xe2\x82", testHold, false, true},
		{"holds everything", valid + testRoot + "/x", func(s string) int { return len(s) }, true, false},
		{"no hold", valid + testRoot + "/x", nil, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCapture(OutputLimit{Stdout: 1 << 20, Stderr: 1}, nil)
			c.sanitize, c.hold = testSanitize, tc.hold
			c.start(iotest.OneByteReader(strings.NewReader(tc.src)), nil)
			<-c.done
			if c.stdout.plain != tc.plain || c.stdout.clean != tc.clean {
				t.Fatalf("plain %v clean %v, want %v %v", c.stdout.plain, c.stdout.clean, tc.plain, tc.clean)
			}
			if got, want := c.stdout.result(false, testSanitize), render(tc.src, testSanitize); got != want {
				t.Fatal("result differs from the whole output's render")
			}
		})
	}
}

// TestCaptureValidResultNotCopied: a large valid result with nothing to
// sanitize is the buffer it was read into (no decode or sanitize copy).
func TestCaptureValidResultNotCopied(t *testing.T) {
	src := bytes.Repeat([]byte("valid ✓\n"), 2<<20/9)
	c := newCapture(OutputLimit{Stdout: int64(len(src)), Stderr: 1}, nil)
	c.sanitize, c.hold = testSanitize, testHold
	c.start(bytes.NewReader(src), nil)
	<-c.done
	if got := c.stdout.result(false, testSanitize); unsafe.StringData(got) != unsafe.StringData(c.stdout.text()) || got != string(src) {
		t.Fatal("the result was copied, or differs")
	}
}

// TestNoZero: the buffer has the capacity asked for, and what is written to
// it is what its string shows.
func TestNoZero(t *testing.T) {
	for _, n := range []int{0, 1, 2, 100, 1 << 20} {
		b := noZero(n)
		if len(b) != 0 || cap(b) != n {
			t.Fatalf("noZero(%d): len %d cap %d", n, len(b), cap(b))
		}
		b = append(b, pattern(n)...)
		if s := ownedString(b); s != string(pattern(n)) {
			t.Fatalf("noZero(%d): contents differ", n)
		}
	}
}

// TestCaptureWidensPipe: a pipe whose output outgrows the scratch buffer
// is widened; one with little output is left alone.
func TestCaptureWidensPipe(t *testing.T) {
	want := pipeSize
	if m := pipeMax(); m > 0 {
		want = min(want, m)
	}
	for _, tc := range []struct {
		size  int
		widen bool
	}{{100, false}, {scratchData + probeSize + 100, true}} {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		before, _ := unix.FcntlInt(r.Fd(), unix.F_GETPIPE_SZ, 0)
		go func() {
			_, _ = w.Write(pattern(tc.size))
			w.Close()
		}()
		c := collect(t, OutputLimit{Stdout: 1 << 20, Stderr: 1}, r, nil)
		got, err := unix.FcntlInt(r.Fd(), unix.F_GETPIPE_SZ, 0)
		r.Close()
		if err != nil {
			t.Fatal(err)
		}
		if c.stdout.text() != string(pattern(tc.size)) {
			t.Fatal("output differs")
		}
		if widened := got >= want && got > before; widened != tc.widen {
			t.Fatalf("%d bytes: pipe size %d (was %d), want widened %v", tc.size, got, before, tc.widen)
		}
	}
}

// resident counts the resident pages of b (mincore).
func resident(t *testing.T, b []byte) int {
	t.Helper()
	page := os.Getpagesize()
	vec := make([]byte, (len(b)+page-1)/page)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)), uintptr(unsafe.Pointer(unsafe.SliceData(vec)))); errno != 0 {
		t.Fatal(errno)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}

// TestPopulatorStaysAhead: a populator faults in at most populateLead bytes
// past the reader, follows it as it moves, and has returned once end does:
// output that ends early leaves the rest of a large reservation untouched.
func TestPopulatorStaysAhead(t *testing.T) {
	const size = 256 << 20
	b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(b)
	page := os.Getpagesize()
	p := startPopulator(b[:0])
	if p == nil {
		t.Fatal("no populator for a large buffer")
	}
	await := func(done int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for p.done.Load() < int64(done) {
			if time.Now().After(deadline) {
				t.Fatalf("populated %d bytes, want %d", p.done.Load(), done)
			}
			runtime.Gosched()
		}
	}
	await(populateLead)
	// It waits for the reader: nothing past the lead is populated.
	p.moved(0)
	if n := resident(t, b); n > populateLead/page {
		t.Fatalf("%d pages resident before any read, want at most %d", n, populateLead/page)
	}
	p.moved(3 * populateLead)
	await(4 * populateLead)
	p.end()
	if n := populators.Load(); n != 0 {
		t.Fatalf("%d populators running after end", n)
	}
	if n := resident(t, b); n > 4*populateLead/page || n < populateLead/page {
		t.Fatalf("%d pages resident, want %d at most", n, 4*populateLead/page)
	}
	if n := resident(t, b[4*populateLead+populateStep:]); n != 0 {
		t.Fatalf("%d pages resident past the lead", n)
	}
}

// TestCaptureLargeThroughPopulator: output far past populateMin, read in
// uneven pieces while a populator runs ahead, comes back exact; a flood of
// a large limit keeps exactly the limit, allocating no more than it; no
// populator runs once the capture ended.
func TestCaptureLargeThroughPopulator(t *testing.T) {
	src := pattern(3*populateMin + 12345)
	c := collect(t, OutputLimit{Stdout: 4 * populateMin, Stderr: 1 << 20}, iotest.HalfReader(bytes.NewReader(src)), nil)
	if c.stdout.text() != string(src) || c.overflowed() {
		t.Fatalf("got %d bytes (overflow %v), want %d", len(c.stdout.text()), c.overflowed(), len(src))
	}
	if n := populators.Load(); n != 0 {
		t.Fatalf("%d populators running after the capture", n)
	}

	const limit = 2 * populateMin
	flood := &endless{}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	c = collect(t, OutputLimit{Stdout: limit, Stderr: limit}, flood, nil)
	out := c.stdout.text()
	runtime.ReadMemStats(&after)
	if !c.overflowed() || len(out) != limit {
		t.Fatalf("overflowed %v, kept %d bytes; want an overflow with %d", c.overflowed(), len(out), limit)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > limit+firstBuffer+allocSlack {
		t.Fatalf("capturing %d bytes allocated %d", limit, alloc)
	}
	if n := populators.Load(); n != 0 {
		t.Fatalf("%d populators running after the flood", n)
	}
}

// TestASCIIPrefix: the prefix asciiPrefix reports is all ASCII, a multiple
// of 64, and ends within 64 bytes of the first non-ASCII byte (or of p's
// end).
func TestASCIIPrefix(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		p := make([]byte, r.IntN(600))
		for i := range p {
			p[i] = byte(r.IntN(0x80))
		}
		first := len(p)
		if len(p) > 0 && r.IntN(3) > 0 {
			first = r.IntN(len(p))
			p[first] = byte(0x80 + r.IntN(0x80))
		}
		n := asciiPrefix(p)
		if n%64 != 0 || n > first || first-n >= 64 && len(p)-n >= 64 {
			t.Fatalf("len %d, first non-ASCII at %d: prefix %d", len(p), first, n)
		}
	}
}

func BenchmarkCheckASCII(b *testing.B) {
	p := make([]byte, 64<<10)
	b.SetBytes(int64(len(p)))
	for b.Loop() {
		if n := asciiPrefix(p); !utf8.Valid(p[n:]) {
			b.Fatal("invalid")
		}
	}
}
