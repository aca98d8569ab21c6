package sandbox

import (
	"io"
	"strings"
	"testing"
	"unicode/utf8"
)

// fixedReads returns src n bytes per read.
type fixedReads struct {
	src []byte
	n   int
}

func (r *fixedReads) Read(p []byte) (int, error) {
	if len(r.src) == 0 {
		return 0, io.EOF
	}
	n := min(len(p), len(r.src), r.n)
	copy(p, r.src[:n])
	r.src = r.src[n:]
	return n, nil
}

// TestASCIIFastPathBoundaries: the all-ASCII fast path of the UTF-8 check
// lets no invalid byte through: a stray byte, a truncated sequence, an
// overlong encoding or a surrogate placed at each offset around the
// 64-byte blocks (and NULs, which are valid), read in pieces that split
// at, before and after the block boundaries, is decoded as a whole render
// decodes it (U+FFFD), and raw output keeps the bytes.
func TestASCIIFastPathBoundaries(t *testing.T) {
	bad := []string{"\xff", "\x80", "\xe2\x82", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80"}
	for _, size := range []int{200, 40 << 10} { // the scratch buffer, and a buffer of its own
		for _, b := range bad {
			for _, at := range []int{0, 1, 62, 63, 64, 65, 126, 127, 128, 129, 191, 192} {
				for _, piece := range []int{1, 63, 64, 65, 128, 4096} {
					buf := []byte(strings.Repeat("a\x00", size/2))
					src := string(buf[:at]) + b + string(buf[at:])
					c := newCapture(OutputLimit{Stdout: 1 << 20, Stderr: 1}, nil)
					c.start(&fixedReads{[]byte(src), piece}, nil)
					<-c.done
					got := c.stdout.result(false, nil)
					if want := render(src, nil); got != want || !utf8.ValidString(got) {
						t.Fatalf("size %d, %q at %d, reads of %d: decoded output differs from the whole render", size, b, at, piece)
					}
					if raw := c.stdout.result(true, nil); raw != src {
						t.Fatalf("size %d, %q at %d, reads of %d: raw output differs", size, b, at, piece)
					}
				}
			}
		}
	}
}
