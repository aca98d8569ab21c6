package sandbox

import (
	"io"
	"os"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// feedSocket returns the near end of a nonblocking socketpair (read through
// the runtime poller, as a managed session's streams are) whose far end a
// goroutine fills with size zero bytes in 64 KiB writes, then closes. wait
// returns once the writer is done.
func feedSocket(tb testing.TB, size int64) (near *os.File, wait func()) {
	tb.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		tb.Fatal(err)
	}
	near, far := os.NewFile(uintptr(fds[0]), "near"), os.NewFile(uintptr(fds[1]), "far")
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer far.Close()
		block := make([]byte, 64<<10)
		for left := size; left > 0; {
			n, err := far.Write(block[:min(left, int64(len(block)))])
			left -= int64(n)
			if err != nil {
				return // the reader closed its end (overflow)
			}
		}
	}()
	return near, func() { <-done }
}

// captureOnce captures size bytes from a fed socket through the whole
// collection path (capture, join, decode) and returns the stdout text.
func captureOnce(tb testing.TB, size, limit int64) string {
	near, wait := feedSocket(tb, size)
	c := newCapture(OutputLimit{Stdout: limit, Stderr: limit}, nil)
	c.start(near, nil)
	select {
	case <-c.done:
	case <-c.overflow:
	}
	near.Close()
	<-c.done
	wait()
	return render(c.stdout.text(), nil)
}

// BenchmarkCapture measures capturing a socketpair's output into a string;
// "overflow" sizes write four times the limit, like a flood.
func BenchmarkCapture(b *testing.B) {
	for _, tc := range []struct {
		name        string
		size, limit int64
	}{
		{"empty", 0, 1 << 20},
		{"16KiB", 16 << 10, 1 << 20},
		{"256KiB", 256 << 10, 1 << 20},
		{"1MiB-overflow", 4 << 20, 1 << 20},
		{"64MiB", 64 << 20, 65 << 20},
		{"256MiB", 256 << 20, 257 << 20},
	} {
		b.Run(tc.name, func(b *testing.B) {
			want := min(tc.size, tc.limit)
			if want > 0 {
				b.SetBytes(want)
			}
			b.ReportAllocs()
			for b.Loop() {
				if s := captureOnce(b, tc.size, tc.limit); int64(len(s)) != want {
					b.Fatalf("captured %d bytes, want %d", len(s), want)
				}
			}
		})
	}
}

// BenchmarkCaptureBare is the floor: the same socket copied into io.Discard.
func BenchmarkCaptureBare(b *testing.B) {
	for _, size := range []int64{64 << 20, 256 << 20} {
		b.Run(strconv.FormatInt(size>>20, 10)+"MiB", func(b *testing.B) {
			b.SetBytes(size)
			buf := make([]byte, 64<<10)
			for b.Loop() {
				near, wait := feedSocket(b, size)
				n, err := io.CopyBuffer(io.Discard, near, buf)
				near.Close()
				wait()
				if err != nil || n != size {
					b.Fatalf("copied %d of %d: %v", n, size, err)
				}
			}
		})
	}
}
