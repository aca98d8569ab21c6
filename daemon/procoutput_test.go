package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/corral-sandbox/corral/api"
)

// The ring keeps the newest bytes across chunks of both streams, cutting
// the oldest chunk where the bound falls, and reads from any offset.
func TestOutputRing(t *testing.T) {
	o := newOutputRing(10)
	o.write(StreamStdout, []byte("abcd"))
	o.write(StreamStderr, []byte("EFG"))
	o.write(StreamStdout, []byte("hijkl"))
	st := o.state()
	if st.Start != 2 || st.End != 12 || st.Stdout != 9 || st.Stderr != 3 {
		t.Fatalf("state %+v", st)
	}
	chunks, next, atEnd, closed, _ := o.read(0)
	var got []string
	for _, c := range chunks {
		got = append(got, string(rune('0'+c.stream))+":"+string(c.data)+"@"+string(rune('0'+c.offset)))
	}
	if strings.Join(got, " ") != "1:cd@2 2:EFG@4 1:hijkl@7" || next != 12 || !atEnd || closed {
		t.Fatalf("read(0): %v next %d atEnd %v", got, next, atEnd)
	}
	if chunks, next, _, _, _ := o.read(8); len(chunks) != 1 || string(chunks[0].data) != "ijkl" || chunks[0].offset != 8 || next != 12 {
		t.Fatalf("read(8): %+v %d", chunks, next)
	}
	// One write larger than the ring keeps its tail.
	o.write(StreamStdout, bytes.Repeat([]byte("x"), 25))
	if st := o.state(); st.Start != 27 || st.End != 37 {
		t.Fatalf("after a large write: %+v", st)
	}
	// Reads copy at most readLimit bytes per step.
	big := newOutputRing(3 * readLimit)
	big.write(StreamStdout, bytes.Repeat([]byte("y"), 2*readLimit+5))
	if _, next, atEnd, _, _ := big.read(0); next != readLimit || atEnd {
		t.Fatalf("first step: next %d atEnd %v", next, atEnd)
	}
}

// Text chunks never split a UTF-8 character, also where a step or a write
// cut one; every byte is sent once, in order.
func TestStreamOutputUTF8(t *testing.T) {
	p := &bgProcess{out: newOutputRing(4 * readLimit), done: make(chan struct{}), state: api.ProcessRunning}
	text := strings.Repeat("é", readLimit) // 2 bytes each: a step ends mid-character
	b := []byte(text)
	r, w := io.Pipe()
	go func() {
		_, _ = w.Write(b[:5]) // ends mid-character
		_, _ = w.Write(b[5:])
		w.Close()
	}()
	pumpOutput(p.out, StreamStdout, r)
	p.out.close()
	p.state = api.ProcessExited
	close(p.done)
	var out strings.Builder
	var last map[string]any
	send := func(_ context.Context, line []byte) error {
		var m map[string]any
		if err := json.Unmarshal(line, &m); err != nil {
			t.Fatal(err)
		}
		if d, ok := m["data"].(string); ok {
			if strings.ContainsRune(d, '\uFFFD') {
				t.Fatalf("a split character at offset %v", m["offset"])
			}
			out.WriteString(d)
		} else {
			last = m
		}
		return nil
	}
	(&App{}).streamOutput(context.Background(), p, 0, true, false, send, func() {})
	if out.String() != text || last["offset"] != float64(len(b)) || last["state"] != api.ProcessExited {
		t.Fatalf("got %d bytes, last %v", out.Len(), last)
	}
}
