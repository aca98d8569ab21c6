package sandbox

import (
	"encoding/binary"
	"io"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"unicode/utf8"
	"unsafe"

	"github.com/corral-sandbox/corral/internal/utf8tail"

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
//     directly. If that fills and more bytes arrive, the stream reserves
//     what its limit lets it keep (up to reserveMax, doubling beyond): the
//     reservation is not zeroed, so its memory is faulted in only as output
//     arrives, and the output is copied once (its first MiB) instead of at
//     every growth. A large buffer is faulted in ahead of the reads: by a
//     goroutine of its own, a bounded step ahead (see populator), or for a
//     pipe by the reader, a chunk at a time (see populateChunk). Growing
//     copies in pieces, so that the garbage collector can always stop the
//     reader.
//   - When the reader ends, the buffer becomes the text without a copy (it
//     is never written again), unless more than a quarter of it is unused:
//     then the text is an exact copy, which does not pin the rest.
//   - A read made when the buffer is full or the limit reached (to learn
//     whether more follows) lands in a scratch buffer's small probe area;
//     bytes past the limit are dropped there, and the reader stops.
//
// CPU: once a stream has a buffer of its own, each read is checked as it
// arrives, while it is in the cache: whether it is valid UTF-8, and whether
// the provider's Sanitize would change it (cut as live output cuts it, see
// PreparedCommon.SanitizeHold). A result that passes both is returned as
// read, without a second pass over it; any other is decoded and sanitized
// whole (see stream.result). A pipe (a host command's streams) is widened
// to pipeSize once its output outgrows the scratch buffer.
//
// At the default 1 MiB limit an output flood therefore costs each stream
// its 1 MiB result and nothing else.
type capture struct {
	limit OutputLimit
	live  *live // nil: no live output

	stdout stream
	stderr stream

	// sanitize and hold are the provider's Sanitize and SanitizeHold, set
	// (if at all) before start: the readers check the output against them
	// as it arrives (see stream.result).
	sanitize func(string) string
	hold     func(string) int

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

	// Set with out: plain if out is known to be valid UTF-8, clean if the
	// capture's sanitizer is known to leave it unchanged.
	plain, clean bool
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
	// growth is the factor by which a full buffer grows past the
	// reservation (see reserveMax).
	growth = 2
	// pipeSize is what a pipe is widened to (at most the system's
	// fs.pipe-max-size) once its output outgrows the scratch buffer.
	pipeSize = 1 << 20
	// heldMax bounds how much output the fused sanitizer check holds back
	// (SanitizeHold's answer); past it, the result is sanitized whole.
	heldMax = 64 << 10
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
	r := &reader{c: c, name: name, s: s, keep: limit, valid: true, clean: c.sanitize == nil || c.hold != nil}
	if c.limit.Combined > 0 {
		r.keep = c.limit.Combined
	}
	defer r.finish()
	// An idle stream (most stderrs) holds no buffer while it waits: its
	// first read lands in r.first, made by the wait itself (see
	// firstRead); pend is what of it the loop has not taken yet.
	pend, pendErr := firstRead(src, r.first[:])
	if len(pend) == 0 && pendErr != nil {
		return // an empty stream: EOF (or an error) at once
	}
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
			p = p[:r.populate(len(p))]
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
		var n int
		var err error
		switch {
		case len(pend) > 0:
			n = copy(p, pend)
			pend = pend[n:]
		case pendErr != nil:
			err = pendErr
		default:
			n, err = src.Read(p)
		}
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
				r.check(false)
			case a > 0:
				r.add(src, p[:a])
				r.check(false)
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

	// What check found so far in buf: valid, if buf[:checked] is valid
	// UTF-8 (checked stops before a sequence a later read may complete);
	// clean, if the capture's sanitizer leaves buf[:sanitized] unchanged.
	// Once false, either stays false and its check stops.
	valid, clean       bool
	checked, sanitized int

	// pop faults buf in ahead of the reads on a goroutine of its own, if
	// buf is large and src is not a pipe (see populator); nil if not.
	pop *populator
	// pipe: src is a pipe, whose buffer is populated by the reader itself
	// (see populateChunk).
	pipe bool
	// populated is how much of buf the reader populated ahead of its
	// reads (a pipe's); -1 if it does not.
	populated int

	// first receives the stream's first read (see firstRead).
	first [firstReadSize]byte
}

// populate returns how much of the n bytes the next read may fill, past
// buf's length, are populated (at least one page's worth), for a pipe
// populating the next chunk first if none are; a populator is told where
// the reads are.
func (r *reader) populate(n int) int {
	if r.pop != nil {
		r.pop.moved(len(r.buf))
		return n
	}
	if r.populated < 0 || !r.pipe {
		return n
	}
	if cap(r.buf) < populateMin || !populateAhead {
		r.populated = -1
		return n
	}
	if r.populated <= len(r.buf) {
		to := min(cap(r.buf), len(r.buf)+populateChunk)
		if !populate(r.buf, len(r.buf), to) {
			r.populated = -1
			return n
		}
		r.populated = to
	}
	return min(n, r.populated-len(r.buf))
}

// stopPopulating stops buf's populator, if any: before buf is copied or
// given up, no populating may run on it.
func (r *reader) stopPopulating() {
	if r.pop != nil {
		r.pop.end()
		r.pop = nil
	}
}

// add appends p, which the probe area holds, growing the buffer: the
// output outgrew the scratch buffer, or the stream's own buffer.
func (r *reader) add(src io.Reader, p []byte) {
	if r.buf == nil {
		// Output this large may well be a flood: a pipe gets wider.
		r.pipe = widenPipe(src)
		r.buf = grow(r.sc[:r.small], r.small+len(p), r.keep)
	} else {
		r.stopPopulating()
		r.buf = grow(r.buf, len(r.buf)+len(p), r.keep)
	}
	r.buf = append(r.buf, p...)
	r.populated = len(r.buf)
	if !r.pipe {
		var room func() int
		if c := r.c; c.limit.Combined > 0 {
			// Half of what the combined limit still allows each stream.
			room = func() int { return int(c.room(r.s, 0) / 2) }
		}
		r.pop = startPopulatorWithin(r.buf, room)
	}
}

// finish sets the stream's text and gives the scratch buffer back.
func (r *reader) finish() {
	if r.c.live != nil {
		r.c.live.flush(r.name, r.s)
	}
	r.stopPopulating()
	switch {
	case r.buf != nil:
		r.check(true)
		r.s.plain, r.s.clean = r.valid, r.clean && r.c.sanitize != nil
		r.s.out = ownedString(r.buf)
	case r.sc != nil:
		r.s.out = string(r.sc[:r.small])
	}
	r.putScratch()
}

// check looks at what buf holds past what it looked at before (see reader):
// whether it is valid UTF-8 and whether the capture's sanitizer changes it.
// Before the end (final false) it leaves out what a later read may extend:
// an incomplete UTF-8 sequence, and what SanitizeHold holds back.
func (r *reader) check(final bool) {
	if r.valid && r.checked < len(r.buf) {
		p := r.buf[r.checked:]
		n := len(p)
		if !final {
			n -= utf8tail.Incomplete(p)
		}
		if a := asciiPrefix(p[:n]); utf8.Valid(p[a:n]) {
			r.checked += n
		} else {
			r.valid = false
		}
	}
	san := r.c.sanitize
	if !r.clean || san == nil || r.sanitized == len(r.buf) {
		return
	}
	// buf[sanitized:] is never written again (the buffer only grows, and a
	// new one is a copy): it can be seen as a string for the check.
	s := unsafe.String(&r.buf[r.sanitized], len(r.buf)-r.sanitized)
	cut := len(s)
	if !final {
		cut -= min(max(r.c.hold(s), 0), len(s))
	}
	if len(s)-cut > heldMax {
		r.clean = false
		return
	}
	if cut == 0 {
		return
	}
	if out := san(s[:cut]); unsafe.StringData(out) == unsafe.StringData(s) && len(out) == cut || out == s[:cut] {
		r.sanitized += cut
	} else {
		r.clean = false
	}
}

// asciiPrefix returns the length of a prefix of p, a multiple of 64 bytes,
// that is all ASCII: the bulk of most output, checked 64 bytes at a time
// (≈ 1.3× utf8.Valid's speed on ASCII), before utf8.Valid checks the rest.
func asciiPrefix(p []byte) int {
	n := 0
	for len(p)-n >= 64 {
		q := p[n : n+64 : n+64]
		w := binary.LittleEndian.Uint64(q[0:]) | binary.LittleEndian.Uint64(q[8:]) |
			binary.LittleEndian.Uint64(q[16:]) | binary.LittleEndian.Uint64(q[24:]) |
			binary.LittleEndian.Uint64(q[32:]) | binary.LittleEndian.Uint64(q[40:]) |
			binary.LittleEndian.Uint64(q[48:]) | binary.LittleEndian.Uint64(q[56:])
		if w&0x8080808080808080 != 0 {
			break
		}
		n += 64
	}
	return n
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

// firstReadSize bounds the read a stream's wait makes (see firstRead).
const firstReadSize = 512

// firstRead waits until src has something to read (data, EOF or an error)
// and returns the first read of it, made into p by the wait itself: the
// read that finds the stream empty parks in the runtime's poller, and the
// one after the wake-up is the read (an empty stream, such as most
// stderrs, costs two reads: nothing, then EOF; polling for readiness
// first, then reading, cost a poll(2) more each time). A src that cannot
// be polled is not read: firstRead returns nothing and no error, and the
// caller reads it as before.
func firstRead(src io.Reader, p []byte) ([]byte, error) {
	sc, ok := src.(syscall.Conn)
	if !ok {
		return nil, nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil, nil
	}
	// Read resets the descriptor's readiness before it calls f, and waits
	// for the next edge when f returns false. An error of the wait itself
	// (a closed stream, a descriptor that cannot be polled) leaves nothing
	// read: the caller's next Read reports it.
	n := 0
	var rerr error
	werr := rc.Read(func(fd uintptr) bool {
		for {
			n, rerr = unix.Read(int(fd), p)
			switch rerr {
			case unix.EINTR:
				continue
			case unix.EAGAIN:
				n, rerr = 0, nil
				return false
			}
			return true
		}
	})
	switch {
	case werr != nil:
		return nil, nil
	case rerr != nil:
		return nil, &os.PathError{Op: "read", Path: "stream", Err: rerr}
	case n == 0:
		return nil, io.EOF
	}
	return p[:n], nil
}

// grow returns a new buffer holding b, with room for at least need bytes
// in all, and at most keep unless need is more: firstBuffer for a stream's
// first buffer, then the reservation (keep, at most reserveMax), then growth
// times b's capacity. Its free part is not zeroed.
func grow(b []byte, need int, keep int64) []byte {
	size := int64(firstBuffer)
	if cap(b) >= firstBuffer {
		size = max(min(keep, reserveMax()), growth*int64(cap(b)))
	}
	size = min(max(size, int64(need)), max(keep, int64(need)))
	nb := allocBuffer(int(size))[:len(b)]
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

// result returns the stream's text as RunCommand returns it: decoded as
// UTF-8 unless raw, then passed through sanitizer (which must be the
// capture's sanitizer, if it had one). Output the reader already found
// valid, or clean, is not looked at again. It must only be called once the
// stream's reader returned.
func (s *stream) result(raw bool, sanitizer func(string) string) string {
	if !raw && !s.plain {
		return render(s.out, sanitizer)
	}
	if s.clean {
		return s.out
	}
	return sanitize(s.out, sanitizer)
}

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
