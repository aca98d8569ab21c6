package sandbox

import (
	"bytes"
	"io"
	"os"
	"strings"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// allocBuffer returns an empty buffer of capacity n whose bytes are not
// zeroed: memory the heap has not used yet is faulted in (zero) only when
// written, so a buffer sized toward a large limit costs only what the
// output fills.
func allocBuffer(n int) []byte { return noZero(n) }

// noZero returns an empty buffer of capacity n that is not zeroed. A
// strings.Builder's Grow allocates its buffer so; its String aliases that
// buffer, which is checked (two Strings at different lengths share their
// first byte), falling back to make.
func noZero(n int) []byte {
	if n < 2 {
		return make([]byte, 0, n)
	}
	var sb strings.Builder
	sb.Grow(n)
	sb.WriteByte(0)
	s1 := sb.String()
	sb.WriteByte(0)
	s2 := sb.String()
	if sb.Cap() < n || unsafe.StringData(s1) != unsafe.StringData(s2) {
		return make([]byte, 0, n)
	}
	return unsafe.Slice(unsafe.StringData(s2), n)[:0]
}

// populateChunk is how much of a large buffer (see populateMin) is faulted
// in at once ahead of the reads (MADV_POPULATE_WRITE): one call instead of
// a page fault per 4 KiB page, each page zeroed just before the read that
// fills it, while it is still in the cache.
const populateChunk = 256 << 10

// populateMin is the smallest buffer populated ahead of its reads.
const populateMin = 8 << 20

// populateAhead reports whether large buffers are populated ahead;
// benchmarks may turn it off.
var populateAhead = true

// populate faults b[from:to] in for writing (rounded out to whole pages),
// reporting false if the kernel cannot (before Linux 5.14).
func populate(b []byte, from, to int) bool {
	b = b[:cap(b)]
	base := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	page := uintptr(os.Getpagesize())
	start := (base + uintptr(from)) &^ (page - 1)
	end := min((base+uintptr(to)+page-1)&^(page-1), base+uintptr(len(b))&^(page-1))
	if end <= start {
		return true
	}
	// Only the pages within b: the first and the last may be shared
	// with other objects, and populating never changes what a page
	// holds, so rounding out is harmless too, but stays inside b.
	if start < base {
		start += page
	}
	if end <= start {
		return true
	}
	_, _, errno := unix.Syscall(unix.SYS_MADVISE, start, end-start, unix.MADV_POPULATE_WRITE)
	return errno == 0
}

// reserveMax bounds the reservation of one stream (see grow): an eighth of
// the machine's memory, at least 64 MiB.
var reserveMax = sync.OnceValue(func() int64 {
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) != nil {
		return 64 << 20
	}
	return max(int64(si.Totalram)*int64(si.Unit)/8, 64<<20)
})

// widenPipe makes src's pipe hold pipeSize bytes (at most
// fs.pipe-max-size, which needs no privilege), if src is a pipe: a flood
// then moves in fewer, larger reads, with fewer wake-ups of both sides.
// Anything else (a socket) is left as it is.
func widenPipe(src io.Reader) {
	if !widenPipes {
		return
	}
	sc, ok := src.(syscall.Conn)
	if !ok {
		return
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		var st unix.Stat_t
		if unix.Fstat(int(fd), &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
			return
		}
		size := pipeSize
		if m := pipeMax(); m > 0 {
			size = min(size, m)
		}
		_, _ = unix.FcntlInt(fd, unix.F_SETPIPE_SZ, size)
	})
}

// widenPipes reports whether widenPipe widens; benchmarks may turn it off.
var widenPipes = true

// pipeMax is fs.pipe-max-size, or 0 if it cannot be read.
var pipeMax = sync.OnceValue(func() int {
	b, err := os.ReadFile("/proc/sys/fs/pipe-max-size")
	if err != nil {
		return 0
	}
	n := 0
	for _, c := range bytes.TrimSpace(b) {
		if c < '0' || c > '9' {
			return 0
		}
		n = n*10 + int(c-'0')
	}
	return n
})
