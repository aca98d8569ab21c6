package sandbox

import (
	"io"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// capture collects a command's stdout and stderr, each into one buffer that
// never grows past what its limit lets it keep.
//
// Memory: a stream's bytes are read straight into the buffer that becomes
// its text, so a capture makes no transient copy of the output.
//
//   - A stream waits for its first byte (or EOF) holding no buffer.
//   - It then reads into a pooled scratch buffer; output that fits
//     (scratchData bytes) is copied once, into a string of its exact size.
//   - Larger output gets a buffer of its own of min(limit, 1 MiB), read into
//     directly, that grows fourfold (up to the limit) only when it is full
//     and more bytes arrive. Growing copies in pieces, so that the garbage
//     collector can always stop the reader.
//   - When the reader ends, the buffer becomes the text without a copy (it
//     is never written again), unless more than a quarter of it is unused:
//     then the text is an exact copy, which does not pin the rest.
//   - A read made when the buffer is full or the limit reached (to learn
//     whether more follows) lands in a scratch buffer's small probe area;
//     bytes past the limit are dropped there, and the reader stops.
//
// At the default 1 MiB limit an output flood therefore costs each stream
// its 1 MiB result and nothing else.
type capture struct {
	limit OutputLimit
	live  *live // nil: no live output

	stdout stream
	stderr stream

	combined     atomic.Int64 // bytes read across both streams, past the limit included
	overflowOnce sync.Once
	overflow     chan struct{} // closed when a limit was exceeded
	running      atomic.Int32  // readers that have not returned
	done         chan struct{} // closed when both readers returned
}

// stream is one captured stream.
type stream struct {
	n    atomic.Int64 // bytes accepted so far
	out  string       // the accepted bytes; set when the reader returns
	held []byte       // live output held back (see live)
}

const (
	// scratchData is how much output a stream collects in its pooled
	// scratch buffer before it gets a buffer of its own.
	scratchData = 28 << 10
	// probeSize is the scratch buffer's probe area: reads made when a
	// stream's buffer is full (to learn whether more follows) land there.
	probeSize = 4 << 10
	// firstBuffer bounds a stream's first own buffer.
	firstBuffer = 1 << 20
	// growth is the factor by which a full buffer grows. Every byte of a
	// new buffer is fresh memory to fault in (and to zero, if reused), and
	// what it holds is copied: a factor of 4 touches 1.33× the output and
	// copies a third of it, against 2× and all of it for a factor of 2.
	growth = 4
	// copyPiece bounds one memmove while a buffer grows or is trimmed
	// (see copyPieces).
	copyPiece = 1 << 20
)

// scratch is a stream's buffer until its output outgrows scratchData, and
// the landing place of probe reads.
type scratch [scratchData + probeSize]byte

var (
	scratchPool = sync.Pool{New: func() any { return new(scratch) }}
	// scratchesOut counts scratch buffers taken from the pool and not
	// given back (for tests).
	scratchesOut atomic.Int64
)

func newCapture(limit OutputLimit, lv *live) *capture {
	return &capture{limit: limit, live: lv, overflow: make(chan struct{}), done: make(chan struct{})}
}

// start reads both streams until EOF, error or overflow.
func (c *capture) start(stdout, stderr io.Reader) {
	c.running.Store(2)
	go c.read(stdout, Stdout, &c.stdout, c.limit.Stdout)
	go c.read(stderr, Stderr, &c.stderr, c.limit.Stderr)
}

// readerDone closes done when the last reader returns.
func (c *capture) readerDone() {
	if c.running.Add(-1) == 0 {
		close(c.done)
	}
}

// room reports how many more bytes stream s may accept: what is left of
// its own limit, or of the combined limit (which the other stream may take
// in the meantime: accept settles that).
func (c *capture) room(s *stream, limit int64) int64 {
	if c.limit.Combined > 0 {
		return max(0, c.limit.Combined-c.combined.Load())
	}
	return max(0, limit-s.n.Load())
}

// accept counts n bytes just read into s and reports how many of them fit
// the limits; fewer than n means the output overflowed.
func (c *capture) accept(s *stream, limit int64, n int) int {
	accept := int64(n)
	if c.limit.Combined > 0 {
		if used := c.combined.Add(int64(n)); used > c.limit.Combined {
			accept = max(0, accept-(used-c.limit.Combined))
		}
	} else if own := s.n.Load(); own+accept > limit {
		accept = max(0, limit-own)
	}
	s.n.Add(accept)
	return int(accept)
}

// read collects src into s until EOF, an error or an overflow of limit (the
// stream's own) or of the combined limit. It sets s.out before it returns.
func (c *capture) read(src io.Reader, name Stream, s *stream, limit int64) {
	defer c.readerDone()
	if src == nil {
		return
	}
	r := &reader{c: c, name: name, s: s, keep: limit}
	if c.limit.Combined > 0 {
		r.keep = c.limit.Combined
	}
	defer r.finish()
	// An idle stream (most stderrs) holds no buffer while it waits.
	waitReadable(src)
	r.sc = getScratch()
	for {
		room := c.room(s, limit)
		// Read into free space, never more than the limits leave room
		// for; if there is none, into the probe area.
		var p []byte
		probe := false
		switch {
		case room > 0 && r.buf == nil && r.small < scratchData:
			p = r.sc[r.small:min(scratchData, r.small+int(min(room, scratchData)))]
		case room > 0 && r.buf != nil && len(r.buf) < cap(r.buf):
			p = r.buf[len(r.buf):min(cap(r.buf), len(r.buf)+int(min(room, int64(cap(r.buf)))))]
		default:
			probe = true
			if r.sc == nil {
				r.sc = getScratch()
			}
			p = r.sc[scratchData:]
			if room > 0 {
				p = p[:min(len(p), int(room))]
			}
		}
		n, err := src.Read(p)
		if n > 0 {
			a := c.accept(s, limit, n)
			if a > 0 && c.live != nil {
				c.live.deliver(name, s, p[:a])
			}
			switch {
			case !probe && r.buf == nil:
				r.small += a
			case !probe:
				r.buf = r.buf[:len(r.buf)+a]
			case a > 0:
				r.add(p[:a])
			}
			if a < n {
				c.overflowOnce.Do(func() { close(c.overflow) })
				return
			}
		}
		if probe && r.buf != nil {
			r.putScratch()
		}
		if err != nil {
			return
		}
	}
}

// reader is the state of one stream's reader.
type reader struct {
	c    *capture
	name Stream
	s    *stream
	keep int64 // the most bytes the stream can keep: its limit, or the combined one

	// sc is held while the output fits it (buf is nil), and during a probe.
	sc    *scratch
	small int    // bytes collected in sc while buf is nil
	buf   []byte // the stream's own buffer, once its output outgrew sc
}

// add appends p, which the probe area holds, growing the buffer: the
// output outgrew the scratch buffer, or the stream's own buffer.
func (r *reader) add(p []byte) {
	if r.buf == nil {
		r.buf = grow(r.sc[:r.small], r.small+len(p), r.keep)
	} else {
		r.buf = grow(r.buf, len(r.buf)+len(p), r.keep)
	}
	r.buf = append(r.buf, p...)
}

// finish sets the stream's text and gives the scratch buffer back.
func (r *reader) finish() {
	if r.c.live != nil {
		r.c.live.flush(r.name, r.s)
	}
	switch {
	case r.buf != nil:
		r.s.out = ownedString(r.buf)
	case r.sc != nil:
		r.s.out = string(r.sc[:r.small])
	}
	r.putScratch()
}

func (r *reader) putScratch() {
	if r.sc != nil {
		scratchPool.Put(r.sc)
		scratchesOut.Add(-1)
		r.sc = nil
	}
}

func getScratch() *scratch {
	scratchesOut.Add(1)
	return scratchPool.Get().(*scratch)
}

// waitReadable returns once src has something to read (data, EOF or an
// error), or at once if src cannot be polled.
func waitReadable(src io.Reader) {
	sc, ok := src.(syscall.Conn)
	if !ok {
		return
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return
	}
	// Read resets the descriptor's readiness before it calls f: f must
	// look itself, and returns false to wait for the next edge. An error
	// (a closed stream, a descriptor that cannot be polled) ends the wait;
	// the next Read reports it.
	var fds [1]unix.PollFd
	_ = rc.Read(func(fd uintptr) bool {
		fds[0] = unix.PollFd{Fd: int32(fd), Events: unix.POLLIN}
		n, err := unix.Poll(fds[:], 0)
		return err != nil || n > 0
	})
}

// grow returns a new buffer holding b, with room for at least need bytes
// in all: growth times b's capacity, at least firstBuffer, at most keep.
func grow(b []byte, need int, keep int64) []byte {
	size := max(growth*cap(b), firstBuffer, need)
	size = int(min(int64(size), max(keep, int64(need))))
	nb := make([]byte, len(b), size)
	copyPieces(nb, b)
	return nb
}

// copyPieces copies src into dst (as copy does) in pieces of at most
// copyPiece bytes, yielding between pieces: the garbage collector cannot
// stop a goroutine inside a memmove (a signal almost always lands there),
// and it spins on another core until it can.
func copyPieces(dst, src []byte) {
	for len(src) > 0 {
		n := copy(dst, src[:min(len(src), copyPiece)])
		dst, src = dst[n:], src[n:]
		if len(src) > 0 {
			runtime.Gosched()
		}
	}
}

// ownedString returns b as a string. The caller gives b up: it must never be
// written again. If more than a quarter of b's capacity is unused, the
// string is an exact copy, so that it does not pin the unused part.
func ownedString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	if cap(b)-len(b) <= cap(b)/4 {
		return unsafe.String(unsafe.SliceData(b), len(b))
	}
	var sb strings.Builder
	sb.Grow(len(b)) // exact, and not zeroed
	for len(b) > 0 {
		n, _ := sb.Write(b[:min(len(b), copyPiece)])
		if b = b[n:]; len(b) > 0 {
			runtime.Gosched() // as in copyPieces
		}
	}
	return sb.String()
}

func (c *capture) overflowed() bool {
	select {
	case <-c.overflow:
		return true
	default:
		return false
	}
}

// sizes returns how many bytes each stream captured so far.
func (c *capture) sizes() (stdout, stderr int64) {
	return c.stdout.n.Load(), c.stderr.n.Load()
}

// text returns the stream's captured bytes. It must only be called once the
// stream's reader returned.
func (s *stream) text() string { return s.out }

// live delivers output as it is read (RunOptions.OnOutput), sanitized,
// holding back what may begin a rewrite (PreparedCommon.SanitizeHold).
// Each stream's held bytes are touched by its reader only.
type live struct {
	fn       func(Stream, []byte)
	sanitize func(string) string // nil: deliver as read
	hold     func(string) int    // nil with sanitize: hold everything
}

// deliver passes p, just read from stream name, on.
func (l *live) deliver(name Stream, s *stream, p []byte) {
	if l.sanitize == nil {
		l.fn(name, p)
		return
	}
	s.held = append(s.held, p...)
	text := string(s.held)
	h := len(text)
	if l.hold != nil {
		h = min(max(l.hold(text), 0), len(text))
	}
	cut := len(text) - h
	if cut == 0 {
		return
	}
	l.fn(name, []byte(l.sanitize(text[:cut])))
	s.held = append(s.held[:0], s.held[cut:]...)
}

// flush delivers what stream name held back; the stream has ended.
func (l *live) flush(name Stream, s *stream) {
	if len(s.held) == 0 {
		return
	}
	l.fn(name, []byte(l.sanitize(string(s.held))))
	s.held = nil
}
