package sandbox

import (
	"io"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// ddSocket starts dd writing size zero bytes in 64 KiB writes to the far
// end of a socketpair (as a command's stdout) and returns the near end, read
// through the runtime poller as RunCommand reads a session's streams.
func ddSocket(tb testing.TB, size int64) (near *os.File, wait func()) {
	tb.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		tb.Fatal(err)
	}
	if err := unix.SetNonblock(fds[0], true); err != nil {
		tb.Fatal(err)
	}
	near, far := os.NewFile(uintptr(fds[0]), "near"), os.NewFile(uintptr(fds[1]), "far")
	cmd := exec.Command("dd", "if=/dev/zero", "bs=65536", "count="+strconv.FormatInt(size/65536, 10), "status=none")
	cmd.Stdout = far
	err = cmd.Start()
	far.Close()
	if err != nil {
		near.Close()
		tb.Skipf("dd: %v", err)
	}
	return near, func() { _ = cmd.Wait() }
}

// floorSize is the output of the 1 GiB benchmarks (BENCH_CAPTURE_MIB
// overrides it, in MiB).
func floorSize() int64 {
	if v, err := strconv.ParseInt(os.Getenv("BENCH_CAPTURE_MIB"), 10, 64); err == nil && v > 0 {
		return v << 20
	}
	return 1 << 30
}

// freshHeap gives the previous iteration's output back to the system, so
// that each iteration reads into memory it must fault in, as a daemon's
// first large capture does (BENCH_CAPTURE_REUSE=1 keeps it, as a daemon
// whose heap has room does).
func freshHeap(b *testing.B) {
	b.StopTimer()
	runtime.GC()
	if os.Getenv("BENCH_CAPTURE_REUSE") == "" {
		debug.FreeOSMemory()
	}
	b.StartTimer()
}

// selfCPU returns the CPU time this process used so far (dd's is not
// counted): under load, a steadier measure of the reader's cost than the
// wall clock.
func selfCPU() cpuUse {
	var ru unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return cpuUse{time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), ru.Minflt}
}

// cpuUse is a process's CPU time and minor page faults so far.
type cpuUse struct {
	cpu    time.Duration
	faults int64
}

// reportCPU reports the reader's CPU and page faults per iteration since c0.
func reportCPU(b *testing.B, c0 cpuUse) {
	c := selfCPU()
	b.ReportMetric(float64(c.cpu-c0.cpu)/1e6/float64(b.N), "cpu-ms/op")
	b.ReportMetric(float64(c.faults-c0.faults)/float64(b.N), "faults/op")
}

// BenchmarkSocketpairFloor is the floor of BenchmarkCapture1GiB: dd's
// output read from the socketpair into a 64 KiB buffer and dropped.
func BenchmarkSocketpairFloor(b *testing.B) {
	size := floorSize()
	b.SetBytes(size)
	buf := make([]byte, 64<<10)
	c0 := selfCPU()
	defer reportCPU(b, c0)
	for b.Loop() {
		freshHeap(b)
		near, wait := ddSocket(b, size)
		n, err := io.CopyBuffer(io.Discard, near, buf)
		near.Close()
		wait()
		if err != nil || n != size {
			b.Fatalf("copied %d of %d: %v", n, size, err)
		}
	}
}

// BenchmarkCapture1GiB captures dd's output into the returned text through
// the whole collection path (capture, decode, a host project's sanitizer),
// with a limit above the size, as RunCommand does for a large result.
func BenchmarkCapture1GiB(b *testing.B) {
	size := floorSize()
	b.SetBytes(size)
	sanitize := func(s string) string { return replacePathForBench(s, "/srv/corral/projects/p1", "/workspace") }
	c0 := selfCPU()
	defer reportCPU(b, c0)
	for b.Loop() {
		freshHeap(b)
		near, wait := ddSocket(b, size)
		c := newCapture(OutputLimit{Stdout: size + 1<<20, Stderr: 1 << 20}, nil)
		c.sanitize, c.hold = sanitize, func(s string) int { return sanitizeHoldForBench(s, "/srv/corral/projects/p1") }
		c.start(near, nil)
		<-c.done
		near.Close()
		wait()
		if s := c.stdout.result(false, sanitize); int64(len(s)) != size {
			b.Fatalf("captured %d of %d", len(s), size)
		}
	}
}

// replacePathForBench stands in for a provider's sanitizer: it looks for
// root and replaces it, as the host and managed providers' do.
func replacePathForBench(s, root, repl string) string {
	if !strings.Contains(s, root) {
		return s
	}
	return strings.ReplaceAll(s, root, repl)
}

// sanitizeHoldForBench is replacePathForBench's SanitizeHold: the longest
// suffix of s that begins root.
func sanitizeHoldForBench(s, root string) int {
	for k := min(len(root), len(s)); k > 0; k-- {
		if strings.HasSuffix(s, root[:k]) {
			return k
		}
	}
	return 0
}

func init() {
	// BENCH_CAPTURE_POPULATE=0 turns populating ahead off, to compare.
	if os.Getenv("BENCH_CAPTURE_POPULATE") == "0" {
		populateAhead = false
	}
	// BENCH_CAPTURE_WIDEN=0 leaves pipes at their size, to compare.
	if os.Getenv("BENCH_CAPTURE_WIDEN") == "0" {
		widenPipes = false
	}
}

// ddPipe is ddSocket over a pipe, as a host command's stdout.
func ddPipe(tb testing.TB, size int64) (near *os.File, wait func()) {
	tb.Helper()
	near, far, err := os.Pipe()
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command("dd", "if=/dev/zero", "bs=65536", "count="+strconv.FormatInt(size/65536, 10), "status=none")
	cmd.Stdout = far
	err = cmd.Start()
	far.Close()
	if err != nil {
		near.Close()
		tb.Skipf("dd: %v", err)
	}
	return near, func() { _ = cmd.Wait() }
}

// BenchmarkCapturePipe1GiB is BenchmarkCapture1GiB over a pipe (a host
// project's streams); its floor is BenchmarkSocketpairFloor.
func BenchmarkCapturePipe1GiB(b *testing.B) {
	size := floorSize()
	b.SetBytes(size)
	sanitize := func(s string) string { return replacePathForBench(s, "/srv/corral/projects/p1", "/workspace") }
	c0 := selfCPU()
	defer reportCPU(b, c0)
	for b.Loop() {
		freshHeap(b)
		near, wait := ddPipe(b, size)
		c := newCapture(OutputLimit{Stdout: size + 1<<20, Stderr: 1 << 20}, nil)
		c.sanitize, c.hold = sanitize, func(s string) int { return sanitizeHoldForBench(s, "/srv/corral/projects/p1") }
		c.start(near, nil)
		<-c.done
		near.Close()
		wait()
		if s := c.stdout.result(false, sanitize); int64(len(s)) != size {
			b.Fatalf("captured %d of %d", len(s), size)
		}
	}
}

// BenchmarkSocketpairIntoBuffer is the floor of a returned result: dd's
// output read from the socketpair into a fresh buffer of the final size
// (memory the reads fault in), nothing checked.
func BenchmarkSocketpairIntoBuffer(b *testing.B) {
	size := floorSize()
	b.SetBytes(size)
	c0 := selfCPU()
	defer reportCPU(b, c0)
	for b.Loop() {
		freshHeap(b)
		buf := allocBuffer(int(size) + 1)[:size+1]
		near, wait := ddSocket(b, size)
		n, err := io.ReadFull(near, buf)
		near.Close()
		wait()
		if err != io.ErrUnexpectedEOF || int64(n) != size {
			b.Fatalf("read %d of %d: %v", n, size, err)
		}
	}
}
