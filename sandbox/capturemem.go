package sandbox

import (
	"bytes"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
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

// A large buffer (see populateMin) is faulted in for writing
// (MADV_POPULATE_WRITE) by a goroutine of its own, populateLead bytes at most
// ahead of the reads and populateStep bytes per call: the reader then copies
// into present pages, and the cost of faulting them (zeroing each page, and
// on a virtual machine often the hypervisor backing it) runs on another CPU
// while the reader reads. At most populateLead bytes past the output are
// populated for nothing.
const (
	populateStep = 1 << 20
	populateLead = 16 << 20
)

// populateChunk is how much of a pipe's large buffer its reader populates at
// once, just before the reads that fill it. A pipe's reader frees the pipe's
// pages as it reads them, and populating on the same CPU takes them back
// from that CPU's free lists; a populator on another CPU made pipes slower
// (0.75× the throughput at 1.4× the CPU, measured: the pages then cross
// CPUs through the zone's shared free lists).
const populateChunk = 256 << 10

// populateMin is the smallest buffer populated ahead of its reads.
const populateMin = 8 << 20

// populateAhead reports whether large buffers are populated ahead;
// benchmarks may turn it off.
var populateAhead = true

// populator populates a buffer ahead of its reader (see populateStep).
type populator struct {
	buf    []byte       // the whole buffer (its capacity)
	room   func() int   // if non-nil, how far past the reads it may populate
	pos    atomic.Int64 // how far the reader read
	done   atomic.Int64 // how far the buffer is populated (for tests)
	woken  int          // pos at the reader's last wake-up call
	wake   chan struct{}
	stop   chan struct{}
	exited chan struct{}
}

// startPopulator starts populating b[len(b):cap(b)] if b is large enough
// and populating is on; it returns nil if not.
func startPopulator(b []byte) *populator { return startPopulatorWithin(b, nil) }

// startPopulatorWithin is startPopulator populating at most room() bytes
// past the reads, if room is not nil: a stream under a combined limit,
// whose buffer, like the other stream's, can hold all of that limit, is
// populated no further than its share of what the limit still allows, so
// that the two streams' populated memory stays within the limit the
// command was admitted for (two populators each filling their reservation
// held twice the combined limit, output or not).
func startPopulatorWithin(b []byte, room func() int) *populator {
	if cap(b) < populateMin || !populateAhead {
		return nil
	}
	p := &populator{buf: b[:cap(b)], room: room, woken: len(b), wake: make(chan struct{}, 1), stop: make(chan struct{}), exited: make(chan struct{})}
	p.pos.Store(int64(len(b)))
	populators.Add(1)
	go p.run(len(b))
	return p
}

// populators counts the populators running (for tests).
var populators atomic.Int64

func (p *populator) run(done int) {
	defer close(p.exited)
	defer populators.Add(-1)
	for {
		pos := int(p.pos.Load())
		from, to := max(done, pos), min(len(p.buf), pos+populateLead)
		if p.room != nil {
			to = min(to, pos+p.room())
		}
		if from >= len(p.buf) {
			return
		}
		if from >= to {
			select {
			case <-p.wake:
				continue
			case <-p.stop:
				return
			}
		}
		select {
		case <-p.stop:
			return
		default:
		}
		to = min(to, from+populateStep)
		if !populate(p.buf, from, to) {
			return
		}
		done = to
		p.done.Store(int64(done))
	}
}

// moved tells p that the reader read up to pos, waking p if that is a step
// on from the last wake-up call.
func (p *populator) moved(pos int) {
	p.pos.Store(int64(pos))
	if pos-p.woken >= populateStep {
		p.woken = pos
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
}

// end stops p and waits for it to return: no call of it is running then.
func (p *populator) end() {
	close(p.stop)
	<-p.exited
}

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
// Anything else (a socket) is left as it is. It reports whether src is a
// pipe.
func widenPipe(src io.Reader) (pipe bool) {
	sc, ok := src.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	_ = rc.Control(func(fd uintptr) {
		var st unix.Stat_t
		if unix.Fstat(int(fd), &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
			return
		}
		pipe = true
		if !widenPipes {
			return
		}
		size := pipeSize
		if m := pipeMax(); m > 0 {
			size = min(size, m)
		}
		_, _ = unix.FcntlInt(fd, unix.F_SETPIPE_SZ, size)
	})
	return pipe
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
