package daemon

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/corral-sandbox/corral/api"
	"github.com/corral-sandbox/corral/internal/utf8tail"

	"github.com/coder/websocket"
)

// outputRing is a background process's retained output: the last size
// bytes it wrote (its pumps write whole UTF-8 characters: see pumpOutput), as chunks tagged with their stream, in one offset space
// (the offset of a byte is how many bytes of either stream came before
// it). Older output falls off the front; start is where what is retained
// begins. Readers wait for more with wait. It is safe for concurrent use.
type outputRing struct {
	size int64

	mu      sync.Mutex
	chunks  []outputChunk // oldest first, contiguous, ending at end
	start   int64         // offset of the first retained byte
	end     int64         // offset after the last byte written
	bytes   [2]int64      // total written per stream (stdout, stderr)
	closed  bool          // no more output will come
	changed chan struct{} // closed and replaced on every change
}

// outputChunk is one write of one stream.
type outputChunk struct {
	stream byte // StreamStdout or StreamStderr
	offset int64
	data   []byte
}

func newOutputRing(size int64) *outputRing {
	return &outputRing{size: size, changed: make(chan struct{})}
}

// write appends p (copied) as stream's.
func (o *outputRing) write(stream byte, p []byte) {
	if len(p) == 0 {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.bytes[stream-StreamStdout] += int64(len(p))
	if int64(len(p)) > o.size {
		// Only its tail can be kept.
		drop := int64(len(p)) - o.size
		o.end += drop
		p = p[drop:]
		o.chunks = o.chunks[:0]
		o.start = o.end
	}
	// Coalesce with the previous chunk of the same stream while it is
	// small: fewer, larger chunks for readers.
	if n := len(o.chunks); n > 0 && o.chunks[n-1].stream == stream && len(o.chunks[n-1].data)+len(p) <= 32<<10 {
		o.chunks[n-1].data = append(o.chunks[n-1].data, p...)
	} else {
		o.chunks = append(o.chunks, outputChunk{stream: stream, offset: o.end, data: append([]byte(nil), p...)})
	}
	o.end += int64(len(p))
	for o.end-o.start > o.size {
		c := &o.chunks[0]
		over := o.end - o.start - o.size
		if int64(len(c.data)) <= over {
			o.start += int64(len(c.data))
			o.chunks[0] = outputChunk{}
			o.chunks = o.chunks[1:]
			continue
		}
		c.data = c.data[over:]
		c.offset += over
		o.start += over
	}
	o.notify()
}

// close says no more output will come.
func (o *outputRing) close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.closed {
		o.closed = true
		o.notify()
	}
}

func (o *outputRing) notify() {
	close(o.changed)
	o.changed = make(chan struct{})
}

// outputState is what a ring holds.
type outputState struct {
	Start, End     int64
	Stdout, Stderr int64 // bytes written per stream
	Closed         bool
}

func (o *outputRing) state() outputState {
	o.mu.Lock()
	defer o.mu.Unlock()
	return outputState{Start: o.start, End: o.end, Stdout: o.bytes[0], Stderr: o.bytes[1], Closed: o.closed}
}

// readLimit bounds the bytes one read copies: a reader replaying a full
// ring of 16 MiB takes it in steps, not in one copy.
const readLimit = 256 << 10

// read returns the retained chunks from offset from on (the first one cut
// at from; from before start means from start), at most about readLimit
// bytes of them, the offset after them, whether that is the end of what
// was written, whether the ring is closed (no more will be written), and a
// channel closed on the next change. The chunks share no memory with the
// ring's.
func (o *outputRing) read(from int64) (chunks []outputChunk, next int64, atEnd, closed bool, changed <-chan struct{}) {
	o.mu.Lock()
	defer o.mu.Unlock()
	next = max(from, o.start)
	var n int
	for _, c := range o.chunks {
		cend := c.offset + int64(len(c.data))
		if cend <= next {
			continue
		}
		if n >= readLimit {
			break
		}
		skip := max(next-c.offset, 0)
		data := c.data[skip:]
		if len(data) > readLimit-n {
			// Cut at a character's start when the output is UTF-8 (the
			// writers never split one: see outputRing.write).
			cut := readLimit - n
			for k := cut; k > cut-4 && k > 0; k-- {
				if utf8.RuneStart(data[k]) {
					cut = k
					break
				}
			}
			data = data[:cut]
		}
		chunks = append(chunks, outputChunk{stream: c.stream, offset: c.offset + skip, data: append([]byte(nil), data...)})
		n += len(data)
		next = c.offset + skip + int64(len(data))
	}
	return chunks, next, next >= o.end, o.closed, o.changed
}

// wait blocks until changed is closed or ctx ends; it reports false when
// ctx ended.
func waitChanged(ctx context.Context, changed <-chan struct{}) bool {
	select {
	case <-changed:
		return true
	case <-ctx.Done():
		return false
	}
}

// processOutput serves GET /v1/projects/{id}/processes/{pid}/output
// ?from=OFFSET&follow=1|0&encoding=base64: the retained output from
// OFFSET on (default 0; an offset that fell off the ring starts where the
// ring starts, which the first chunk's offset and the
// Corral-Output-Start header say), as NDJSON:
//
//	{"stream":"stdout"|"stderr","offset":N,"data":S}   one chunk per line
//	{"offset":N,"state":S,"exit":{…}|null,"error":{…}|null}   the last line
//
// data is UTF-8 text (invalid bytes become U+FFFD) or, with
// encoding=base64, the base64 of the bytes. offset is the chunk's first
// byte's; the last line's offset is where a reader continues. With
// follow=1 (the default) the answer follows new output until the process
// ended and everything was sent; with follow=0 it ends with what is there
// (its last line says "running" if it still runs). A WebSocket upgrade on
// the same URL carries the same lines, one text message each, and closes
// (1000) after the last. A reader that goes away changes nothing for the
// process.
func (a *App) processOutput(w http.ResponseWriter, r *http.Request) error {
	proj, p, err := a.projectProcess(r)
	if err != nil {
		return err
	}
	q := r.URL.Query()
	var from int64
	if v := q.Get("from"); v != "" {
		if from, err = strconv.ParseInt(v, 10, 64); err != nil || from < 0 {
			return apiErr(http.StatusBadRequest, KindInvalid, "from must be a non-negative integer")
		}
	}
	follow := true
	switch q.Get("follow") {
	case "", "1", "true":
	case "0", "false":
		follow = false
	default:
		return apiErr(http.StatusBadRequest, KindInvalid, "follow must be 1 or 0")
	}
	binary := false
	switch q.Get("encoding") {
	case "":
	case api.EncodingBase64:
		binary = true
	default:
		return apiErr(http.StatusBadRequest, KindInvalid, "encoding %q is not supported (only %q)", q.Get("encoding"), api.EncodingBase64)
	}
	var send func(ctx context.Context, line []byte) error
	var finish func()
	if strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		conn, err := websocket.Accept(w, r, nil)
		if err != nil {
			return &APIError{Status: http.StatusBadRequest, Kind: KindInvalid, Message: "WebSocket upgrade failed", Cause: err}
		}
		if !a.enterSession() {
			_ = conn.Close(websocket.StatusGoingAway, "shutting down")
			return nil
		}
		defer a.wg.Done()
		// Reads only to notice the client closing.
		rctx := conn.CloseRead(context.Background())
		defer conn.CloseNow()
		send = func(ctx context.Context, line []byte) error {
			ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			return conn.Write(ctx, websocket.MessageText, line)
		}
		finish = func() { _ = conn.Close(websocket.StatusNormalClosure, "end") }
		ctx, untrack := a.trackSession(a.ctx, r, proj.ID)
		defer untrack()
		ctx, stop := context.WithCancel(ctx)
		defer stop()
		go func() {
			select {
			case <-rctx.Done():
			case <-ctx.Done():
			}
			stop()
		}()
		a.streamOutput(ctx, p, from, follow, binary, send, finish)
		return nil
	}
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", api.MediaNDJSON)
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Corral-Output-Start", strconv.FormatInt(p.out.state().Start, 10))
	w.WriteHeader(http.StatusOK)
	_ = rc.Flush()
	send = func(_ context.Context, line []byte) error {
		_ = rc.SetWriteDeadline(time.Now().Add(30 * time.Second))
		if _, err := w.Write(append(line, '\n')); err != nil {
			return err
		}
		return rc.Flush()
	}
	ctx, untrack := a.trackSession(r.Context(), r, proj.ID)
	defer untrack()
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		select {
		case <-a.ctx.Done():
		case <-ctx.Done():
		}
		stop()
	}()
	a.streamOutput(ctx, p, from, follow, binary, send, func() {})
	return nil
}

// streamOutput sends p's output from from on, then the last line.
func (a *App) streamOutput(ctx context.Context, p *bgProcess, from int64, follow, binary bool, send func(context.Context, []byte) error, finish func()) {
	next := from
	for {
		chunks, n, atEnd, closed, changed := p.out.read(next)
		final := closed && atEnd // nothing more will come
		for _, c := range chunks {
			data := c.data
			line := api.ProcessOutputChunk{Stream: "stdout", Offset: c.offset}
			if c.stream == StreamStderr {
				line.Stream = "stderr"
			}
			if binary {
				line.Data = base64.StdEncoding.EncodeToString(data)
			} else {
				line.Data = string(bytes.ToValidUTF8(data, []byte("\uFFFD")))
			}
			b, _ := json.Marshal(line)
			if send(ctx, b) != nil {
				return
			}
		}
		next = n
		switch {
		case final:
			// The outcome is set just after the ring closes.
			select {
			case <-p.done:
			case <-ctx.Done():
				return
			}
		case !atEnd:
			continue // more is there: the next step
		case follow:
			if !waitChanged(ctx, changed) {
				return
			}
			continue
		}
		in := p.info()
		b, _ := json.Marshal(api.ProcessOutputEnd{Offset: next, State: in.State, Exit: in.Exit, Error: in.Error})
		if send(ctx, b) == nil {
			finish()
		}
		return
	}
}

// pumpOutput copies r into o as stream's until r fails. A write never
// ends inside a UTF-8 character: an incomplete sequence at the end of a
// read waits for the next read (or r's end), so that text chunks are
// whole characters. The bytes are unchanged.
func pumpOutput(o *outputRing, stream byte, r io.Reader) {
	buf := make([]byte, 32<<10)
	held := 0
	for {
		n, err := r.Read(buf[held:])
		n += held
		held = 0
		if err == nil {
			held = utf8tail.Incomplete(buf[:n])
		}
		o.write(stream, buf[:n-held])
		copy(buf, buf[n-held:n])
		if err != nil {
			return
		}
	}
}
