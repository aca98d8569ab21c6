package sandbox

import (
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// BenchmarkCaptureShort measures a short command's capture: both streams
// of nonblocking socketpairs (as a managed session's) waited on while
// empty, then stdout given a line and both closed, as a command that
// prints one line and exits. CPU per op (this process's) is reported beside
// the wall time.
func BenchmarkCaptureShort(b *testing.B) {
	var ru0, ru1 unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_SELF, &ru0)
	for b.Loop() {
		var near [2]*os.File
		var far [2]int
		for i := range near {
			fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				b.Fatal(err)
			}
			near[i], far[i] = os.NewFile(uintptr(fds[0]), "near"), fds[1]
		}
		c := newCapture(OutputLimit{Stdout: 1 << 20, Stderr: 1 << 20}, nil)
		c.start(near[0], near[1])
		time.Sleep(20 * time.Microsecond) // the readers park, as while a command runs
		_, _ = unix.Write(far[0], []byte("hello\n"))
		unix.Close(far[0])
		unix.Close(far[1])
		<-c.done
		near[0].Close()
		near[1].Close()
		if c.stdout.text() != "hello\n" {
			b.Fatalf("stdout %q", c.stdout.text())
		}
	}
	_ = unix.Getrusage(unix.RUSAGE_SELF, &ru1)
	cpu := time.Duration(ru1.Utime.Nano()+ru1.Stime.Nano()-ru0.Utime.Nano()-ru0.Stime.Nano()) * time.Nanosecond
	b.ReportMetric(float64(cpu.Nanoseconds())/1e3/float64(b.N), "cpu-µs/op")
}

// TestCaptureFirstRead: the read a stream's wait makes (firstRead, 512
// bytes) is output like any other: more than it holds continues in the
// next reads, it counts against the limits (an overflow within it is
// seen, and what fits is kept); the other stream, empty, reads EOF at once.
func TestCaptureFirstRead(t *testing.T) {
	pair := func() (*os.File, int) {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		return os.NewFile(uintptr(fds[0]), "near"), fds[1]
	}
	out := make([]byte, 3*firstReadSize+7)
	for i := range out {
		out[i] = 'a' + byte(i%26)
	}
	for _, tc := range []struct {
		name     string
		size     int // bytes of out written
		limit    int64
		want     string
		overflow bool
	}{
		{"longer", len(out), 1 << 20, string(out), false},
		{"within-limit", len(out), int64(len(out)), string(out), false},
		{"overflow-in-first", len(out), 10, string(out[:10]), true},
		{"all-in-first-overflow", 100, 10, string(out[:10]), true},
		{"all-in-first-exact", 100, 100, string(out[:100]), false},
		{"overflow-after-first", len(out), firstReadSize + 3, string(out[:firstReadSize+3]), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stdout, farOut := pair()
			stderr, farErr := pair()
			defer stdout.Close()
			defer stderr.Close()
			base := scratchesOut.Load()
			c := newCapture(OutputLimit{Stdout: tc.limit, Stderr: tc.limit}, nil)
			// Written before the readers start: the first read finds
			// more than it can hold.
			if n, err := unix.Write(farOut, out[:tc.size]); err != nil || n != tc.size {
				t.Fatal(n, err)
			}
			unix.Close(farOut)
			unix.Close(farErr)
			c.start(stdout, stderr)
			<-c.done
			if got := c.stdout.text(); got != tc.want {
				t.Errorf("stdout %d bytes %.20q..., want %d bytes", len(got), got, len(tc.want))
			}
			if c.stderr.text() != "" {
				t.Errorf("stderr %q", c.stderr.text())
			}
			if got := c.overflowed(); got != tc.overflow {
				t.Errorf("overflowed %v, want %v", got, tc.overflow)
			}
			if n := scratchesOut.Load() - base; n != 0 {
				t.Errorf("%d scratch buffers not given back", n)
			}
		})
	}
}
