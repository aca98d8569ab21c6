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
// first large capture does.
func freshHeap(b *testing.B) {
	b.StopTimer()
	runtime.GC()
	debug.FreeOSMemory()
	b.StartTimer()
}

// BenchmarkSocketpairFloor is the floor of BenchmarkCapture1GiB: dd's
// output read from the socketpair into a 64 KiB buffer and dropped.
func BenchmarkSocketpairFloor(b *testing.B) {
	size := floorSize()
	b.SetBytes(size)
	buf := make([]byte, 64<<10)
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
	for b.Loop() {
		freshHeap(b)
		near, wait := ddSocket(b, size)
		c := newCapture(OutputLimit{Stdout: size + 1<<20, Stderr: 1 << 20}, nil)
		c.start(near, nil)
		<-c.done
		near.Close()
		wait()
		if s := render(c.stdout.text(), sanitize); int64(len(s)) != size {
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
