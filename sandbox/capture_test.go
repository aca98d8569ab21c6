package sandbox

import (
	"bytes"
	"errors"
	"io"
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

// pattern returns n bytes that differ from their neighbours, so that a
// misplaced or repeated piece shows.
func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i % 251)
	}
	return b
}

// collect runs a capture over the given readers to the end and returns it.
func collect(t *testing.T, limit OutputLimit, stdout, stderr io.Reader) *capture {
	t.Helper()
	c := newCapture(limit, nil)
	c.start(stdout, stderr)
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		t.Fatal("capture did not end")
	}
	return c
}

// endless serves zero bytes forever and counts them.
type endless struct{ served int64 }

func (e *endless) Read(p []byte) (int, error) {
	clear(p)
	e.served += int64(len(p))
	return len(p), nil
}

// TestCaptureSizes: every size around the buffers' boundaries comes back
// exact, in order and counted, whatever sizes the reads return; a limit is
// exact: output of exactly the limit is not an overflow, one byte more is.
func TestCaptureSizes(t *testing.T) {
	sizes := []int{0, 1, scratchData - 1, scratchData, scratchData + 1, scratchData + probeSize + 1,
		firstBuffer - 1, firstBuffer, firstBuffer + 1, 2*firstBuffer + 1, 3*firstBuffer + 12345}
	readers := map[string]func([]byte) io.Reader{
		"whole": func(b []byte) io.Reader { return bytes.NewReader(b) },
		"half":  func(b []byte) io.Reader { return iotest.HalfReader(bytes.NewReader(b)) },
		"eof":   func(b []byte) io.Reader { return iotest.DataErrReader(bytes.NewReader(b)) },
	}
	for _, size := range sizes {
		src := pattern(size)
		for rname, mk := range readers {
			for _, tc := range []struct {
				name  string
				limit int64
			}{
				{"roomy", 8 << 20},
				{"exact", int64(max(size, 1))},
				{"short", int64(max(size-1, 1))},
			} {
				c := collect(t, OutputLimit{Stdout: tc.limit, Stderr: tc.limit}, mk(src), nil)
				want := src[:min(int64(size), tc.limit)]
				if got := c.stdout.text(); got != string(want) {
					t.Fatalf("size %d, %s reads, %s limit: got %d bytes, want %d (or they differ)", size, rname, tc.name, len(got), len(want))
				}
				if n, _ := c.sizes(); n != int64(len(want)) {
					t.Fatalf("size %d, %s reads, %s limit: counted %d, want %d", size, rname, tc.name, n, len(want))
				}
				if over := int64(size) > tc.limit; c.overflowed() != over {
					t.Fatalf("size %d, %s reads, %s limit: overflowed %v, want %v", size, rname, tc.name, c.overflowed(), over)
				}
			}
		}
	}
}

// TestCaptureOneByteReads: a stream that arrives a byte at a time is
// collected whole.
func TestCaptureOneByteReads(t *testing.T) {
	src := pattern(scratchData + probeSize + 100)
	c := collect(t, OutputLimit{Stdout: 1 << 20, Stderr: 1 << 20}, iotest.OneByteReader(bytes.NewReader(src)), nil)
	if c.stdout.text() != string(src) {
		t.Fatalf("got %d bytes, want %d", len(c.stdout.text()), len(src))
	}
}

// TestCaptureCombinedLimit: under a combined limit the two streams keep
// exactly that many bytes together, each a prefix of its output.
func TestCaptureCombinedLimit(t *testing.T) {
	for _, tc := range []struct {
		name           string
		out, err, comb int
	}{
		{"under", 3000, 4000, 8000},
		{"exact", 3000, 5000, 8000},
		{"over-small", 30000, 40000, 50000},
		{"over-large", 3 << 20, 2 << 20, 4<<20 + 17},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errb := pattern(tc.out), bytes.Repeat([]byte{'e'}, tc.err)
			c := collect(t, OutputLimit{Combined: int64(tc.comb)}, bytes.NewReader(out), bytes.NewReader(errb))
			so, se := c.stdout.text(), c.stderr.text()
			total := len(so) + len(se)
			if over := tc.out+tc.err > tc.comb; c.overflowed() != over {
				t.Fatalf("overflowed %v, want %v", c.overflowed(), over)
			}
			if want := min(tc.out+tc.err, tc.comb); total != want {
				t.Fatalf("kept %d bytes together, want %d", total, want)
			}
			if !bytes.HasPrefix(out, []byte(so)) || !bytes.HasPrefix(errb, []byte(se)) {
				t.Fatal("a stream's text is not a prefix of its output")
			}
			if n, e := c.sizes(); n != int64(len(so)) || e != int64(len(se)) {
				t.Fatalf("counted %d+%d, kept %d+%d", n, e, len(so), len(se))
			}
		})
	}
}

// allocSlack is what the allocation checks allow beyond the buffers a
// capture needs: a scratch buffer and the runtime's own allocations while
// it runs (the race detector's bookkeeping alone adds ≈ 66 KiB). A buffer
// grown by doubling would exceed its limit by far more.
const allocSlack = 128 << 10

// TestCaptureStopsAtLimit: an endless stream is read at most one probe past
// its limit, and capturing it allocates its result and next to nothing
// else: no copy of the output, nothing read past the limit retained.
func TestCaptureStopsAtLimit(t *testing.T) {
	const limit = 1 << 20
	collect(t, OutputLimit{Stdout: limit, Stderr: limit}, &endless{}, nil) // warm the pool
	src := &endless{}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	c := collect(t, OutputLimit{Stdout: limit, Stderr: limit}, src, nil)
	out := c.stdout.text()
	runtime.ReadMemStats(&after)
	if !c.overflowed() || len(out) != limit {
		t.Fatalf("overflowed %v, kept %d bytes; want an overflow with %d", c.overflowed(), len(out), limit)
	}
	if src.served > limit+probeSize {
		t.Fatalf("read %d bytes for a limit of %d", src.served, limit)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > limit+allocSlack {
		t.Fatalf("capturing %d bytes allocated %d", limit, alloc)
	}
}

// TestCaptureKeepsOutputBeforeError: a read error ends the stream, keeping
// what came before it; it is not an overflow.
func TestCaptureKeepsOutputBeforeError(t *testing.T) {
	src := pattern(scratchData + 5000)
	r := io.MultiReader(bytes.NewReader(src), iotest.ErrReader(errors.New("connection reset")))
	c := collect(t, OutputLimit{Stdout: 1 << 20, Stderr: 1 << 20}, r, nil)
	if c.stdout.text() != string(src) || c.overflowed() {
		t.Fatalf("got %d bytes (overflowed %v), want %d", len(c.stdout.text()), c.overflowed(), len(src))
	}
}

// socketpair returns both ends of a nonblocking stream socketpair as files
// read through the runtime poller.
func socketpair(t *testing.T) (near, far *os.File) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	return os.NewFile(uintptr(fds[0]), "near"), os.NewFile(uintptr(fds[1]), "far")
}

// TestCaptureIdleStreamsHoldNoBuffer: readers waiting for output hold no
// scratch buffer; output written before the capture starts (its readiness
// already signalled) and output written while it waits both arrive.
func TestCaptureIdleStreamsHoldNoBuffer(t *testing.T) {
	base := scratchesOut.Load()
	outN, outF := socketpair(t)
	errN, errF := socketpair(t)
	defer outN.Close()
	defer errN.Close()
	if _, err := errF.Write([]byte("early")); err != nil {
		t.Fatal(err)
	}
	c := newCapture(OutputLimit{Stdout: 1 << 20, Stderr: 1 << 20}, nil)
	c.start(outN, errN)
	deadline := time.Now().Add(5 * time.Second)
	for c.stderr.n.Load() != 5 {
		if time.Now().After(deadline) {
			t.Fatal("output written before the capture started was not read")
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond) // let the stdout reader block
	// stderr holds its scratch buffer (its output fits it); idle stdout none.
	if n := scratchesOut.Load() - base; n != 1 {
		t.Fatalf("%d scratch buffers out, want 1 (the stderr reader's)", n)
	}
	if _, err := outF.Write([]byte("late")); err != nil {
		t.Fatal(err)
	}
	outF.Close()
	errF.Close()
	select {
	case <-c.done:
	case <-time.After(5 * time.Second):
		t.Fatal("capture did not end at EOF")
	}
	if c.stdout.text() != "late" || c.stderr.text() != "early" {
		t.Fatalf("got %q and %q", c.stdout.text(), c.stderr.text())
	}
	if n := scratchesOut.Load() - base; n != 0 {
		t.Fatalf("%d scratch buffers not given back", n)
	}
}

// TestCaptureClosedWhileIdle: closing a stream its reader waits on ends the
// reader.
func TestCaptureClosedWhileIdle(t *testing.T) {
	outN, outF := socketpair(t)
	defer outF.Close()
	c := newCapture(OutputLimit{Stdout: 1 << 20, Stderr: 1 << 20}, nil)
	c.start(outN, nil)
	time.Sleep(10 * time.Millisecond)
	outN.Close()
	select {
	case <-c.done:
	case <-time.After(5 * time.Second):
		t.Fatal("reader did not end when its stream was closed")
	}
	if c.stdout.text() != "" {
		t.Fatalf("got %q", c.stdout.text())
	}
}

// TestOwnedString: a buffer that is (nearly) full becomes the text without
// a copy; one mostly unused is copied, so that the text does not pin it.
func TestOwnedString(t *testing.T) {
	full := make([]byte, 1000)
	copy(full, "abc")
	if s := ownedString(full); unsafe.StringData(s) != &full[0] || len(s) != 1000 {
		t.Fatal("a full buffer was copied")
	}
	sparse := make([]byte, 100, 1000)
	copy(sparse, "abc")
	s := ownedString(sparse)
	if unsafe.StringData(s) == &sparse[0] || s != string(sparse) {
		t.Fatal("a sparse buffer was not copied exactly")
	}
	if ownedString(nil) != "" || ownedString(make([]byte, 0, 10)) != "" {
		t.Fatal("empty buffer")
	}
	big := pattern(3*copyPiece + 7)
	if s := ownedString(roomy(big)); s != string(big) {
		t.Fatal("copy in pieces differs")
	}
}

// roomy returns a copy of b in a buffer of twice its length.
func roomy(b []byte) []byte {
	nb := make([]byte, len(b), 2*len(b))
	copy(nb, b)
	return nb
}

func TestDecode(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"empty", "", ""},
		{"ascii", "hello\n", "hello\n"},
		{"nul and newlines kept", "a\x00b\n\x00", "a\x00b\n\x00"},
		{"multibyte", "héllo €𝄞", "héllo €𝄞"},
		{"literal replacement char kept", "a\uFFFDb", "a\uFFFDb"},
		{"invalid byte", "a\xffb", "a\uFFFDb"},
		{"each invalid byte", "\xff\xfe", "\uFFFD\uFFFD"},
		{"truncated sequence at the end", "ok\xe2\x82", "ok\uFFFD\uFFFD"},
		{"surrogate half", "\xed\xa0\x80x", "\uFFFD\uFFFD\uFFFDx"},
		{"overlong", "\xc0\xafz", "\uFFFD\uFFFDz"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := decode(tc.in); got != tc.want {
				t.Fatalf("decode(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
	valid := strings.Repeat("valid ✓\n", 1000)
	if unsafe.StringData(decode(valid)) != unsafe.StringData(valid) {
		t.Fatal("valid text was copied")
	}
}

// decodeReference is the definition decode implements: rune by rune, each
// byte of an invalid sequence becomes U+FFFD.
func decodeReference(s string) string {
	var b strings.Builder
	for len(s) > 0 {
		r, size := utf8.DecodeRuneInString(s)
		if r == utf8.RuneError && size <= 1 {
			b.WriteRune(utf8.RuneError)
			s = s[1:]
			continue
		}
		b.WriteString(s[:size])
		s = s[size:]
	}
	return b.String()
}

func FuzzDecode(f *testing.F) {
	for _, s := range []string{"", "abc", "a\xffb", "ok\xe2\x82", "€\xed\xa0\x80", "\x00\n\xc0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := decode(s)
		if want := decodeReference(s); got != want {
			t.Fatalf("decode(%q) = %q, want %q", s, got, want)
		}
		if !utf8.ValidString(got) {
			t.Fatalf("decode(%q) = %q is not valid UTF-8", s, got)
		}
	})
}

func TestRender(t *testing.T) {
	up := func(s string) string { return strings.ReplaceAll(s, "/secret", "/x") }
	if got := render("/secret/a\xff", up); got != "/x/a\uFFFD" {
		t.Fatalf("got %q", got)
	}
	if got := render("a", nil); got != "a" {
		t.Fatalf("got %q", got)
	}
}
