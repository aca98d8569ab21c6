package sandbox

import (
	"io"
	"strings"
	"sync"
	"sync/atomic"
)

// capture collects a command's stdout and stderr into bounded buffers.
type capture struct {
	limit OutputLimit

	stdout stream
	stderr stream

	combined     atomic.Int64 // bytes accepted across both streams
	overflowOnce sync.Once
	overflow     chan struct{} // closed when a limit was exceeded
	wg           sync.WaitGroup
	done         chan struct{} // closed when both readers returned
}

// stream is one captured stream: a list of chunks that grow geometrically
// (4 KiB up to 1 MiB), so that a large output is never moved while it is
// read, and a small one costs a small buffer.
type stream struct {
	chunks [][]byte
	n      atomic.Int64 // bytes accepted
}

const (
	firstChunk = 4 << 10
	maxChunk   = 1 << 20
)

func newCapture(limit OutputLimit) *capture {
	return &capture{limit: limit, overflow: make(chan struct{}), done: make(chan struct{})}
}

// start reads both streams until EOF, error or overflow.
func (c *capture) start(stdout, stderr io.Reader) {
	c.wg.Add(2)
	go c.read(stdout, &c.stdout, c.limit.Stdout)
	go c.read(stderr, &c.stderr, c.limit.Stderr)
	go func() { c.wg.Wait(); close(c.done) }()
}

func (c *capture) read(r io.Reader, s *stream, limit int64) {
	defer c.wg.Done()
	if r == nil {
		return
	}
	var cur []byte
	size := firstChunk
	for {
		if len(cur) == cap(cur) {
			cur = make([]byte, 0, size)
			s.chunks = append(s.chunks, nil)
			size = min(2*size, maxChunk)
		}
		n, err := r.Read(cur[len(cur):cap(cur)])
		if n > 0 {
			accept := int64(n)
			if c.limit.Combined > 0 {
				used := c.combined.Add(int64(n))
				if used > c.limit.Combined {
					accept = max(0, int64(n)-(used-c.limit.Combined))
				}
			} else if own := s.n.Load(); own+accept > limit {
				accept = max(0, limit-own)
			}
			cur = cur[:len(cur)+int(accept)]
			s.chunks[len(s.chunks)-1] = cur
			s.n.Add(accept)
			if accept < int64(n) {
				c.overflowOnce.Do(func() { close(c.overflow) })
				return
			}
		}
		if err != nil {
			return
		}
	}
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

// text joins a stream's chunks into one string with a single copy. It must
// only be called once the stream's reader returned.
func (s *stream) text() string {
	switch len(s.chunks) {
	case 0:
		return ""
	case 1:
		return string(s.chunks[0])
	}
	var b strings.Builder
	b.Grow(int(s.n.Load()))
	for _, ch := range s.chunks {
		b.Write(ch)
	}
	return b.String()
}
