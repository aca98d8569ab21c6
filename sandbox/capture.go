package sandbox

import (
	"io"
	"sync"
	"sync/atomic"
)

// capture collects a command's stdout and stderr into bounded buffers.
type capture struct {
	limit OutputLimit

	mu     sync.Mutex
	stdout []byte
	stderr []byte

	combined     atomic.Int64 // bytes accepted across both streams
	overflowOnce sync.Once
	overflow     chan struct{} // closed when a limit was exceeded
	wg           sync.WaitGroup
	done         chan struct{} // closed when both readers returned
}

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

const readChunk = 64 << 10

func (c *capture) read(r io.Reader, dst *[]byte, limit int64) {
	defer c.wg.Done()
	if r == nil {
		return
	}
	buf := make([]byte, readChunk)
	var own int64
	for {
		n, err := r.Read(buf)
		if n > 0 {
			accept := int64(n)
			if c.limit.Combined > 0 {
				used := c.combined.Add(int64(n))
				if used > c.limit.Combined {
					accept = max(0, int64(n)-(used-c.limit.Combined))
				}
			} else if own+accept > limit {
				accept = max(0, limit-own)
			}
			own += accept
			c.mu.Lock()
			*dst = append(*dst, buf[:accept]...)
			c.mu.Unlock()
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

// snapshot returns copies of what was captured so far; readers may still be
// running if the drain was cut short.
func (c *capture) snapshot() (stdout, stderr []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]byte(nil), c.stdout...), append([]byte(nil), c.stderr...)
}
