// Package tailbuf keeps the end of a stream: the last bytes a child
// process wrote, to explain its failure.
package tailbuf

import "sync"

// Buffer is an io.Writer that keeps the last Max bytes written to it (all
// of them for Max <= 0). Its zero value keeps everything; it is safe for
// concurrent use and must not be copied after first use.
type Buffer struct {
	Max int

	mu sync.Mutex
	b  []byte
}

// Write keeps p's end; it never fails.
func (t *Buffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if over := len(t.b) - t.Max; t.Max > 0 && over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(p), nil
}

// String returns the kept bytes.
func (t *Buffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}
