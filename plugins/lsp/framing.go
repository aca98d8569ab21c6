package lsp

// The base protocol of the Language Server Protocol: every message is a
// header part and a content part, the header part being ASCII fields
// terminated by "\r\n" and itself terminated by an empty line:
//
//	Content-Length: 52\r\n
//	Content-Type: application/vscode-jsonrpc; charset=utf-8\r\n   (optional)
//	\r\n
//	{"jsonrpc":"2.0","id":1,"method":"initialize",...}
//
// Content-Length (decimal, bytes of the content) is required; other
// fields are accepted and ignored. The content is one JSON-RPC message: a
// JSON object. Reader is strict — anything else is a framing error, never
// guessed around — and bounded: a header part longer than maxHeader bytes
// or content longer than the reader's limit is refused before it is read.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// DefaultMaxMessage is the default bound on one message's content, both
// ways: 16 MiB.
const DefaultMaxMessage = 16 << 20

// maxHeader bounds a message's header part (all fields and line ends).
const maxHeader = 4096

// Framing errors. Every error ReadMessage returns for malformed input wraps
// ErrFraming; oversized content also wraps ErrTooLarge, and content that
// is not a JSON object also wraps ErrNotJSON. CheckMessage's errors wrap
// ErrTooLarge or ErrNotJSON.
var (
	ErrFraming  = errors.New("lsp: bad message framing")
	ErrTooLarge = errors.New("lsp: message too large")
	ErrNotJSON  = errors.New("lsp: message is not a JSON object")
)

// Reader reads Content-Length framed messages. It is not safe for
// concurrent use.
type Reader struct {
	r   *bufio.Reader
	max int
}

// NewReader returns a Reader over r whose messages have at most max bytes
// of content; max <= 0 means DefaultMaxMessage.
func NewReader(r io.Reader, max int) *Reader {
	if max <= 0 {
		max = DefaultMaxMessage
	}
	return &Reader{r: bufio.NewReaderSize(r, maxHeader), max: max}
}

// ReadMessage returns the next message's content (a JSON object, as read).
// It returns io.EOF when the input ends between messages and
// io.ErrUnexpectedEOF when it ends inside one; other errors of the
// underlying reader are returned as they are. Malformed input is an error
// wrapping ErrFraming; the Reader must not be used after one.
func (r *Reader) ReadMessage() ([]byte, error) {
	length, err := r.readHeader()
	if err != nil {
		return nil, err
	}
	body := make([]byte, length)
	if _, err := io.ReadFull(r.r, body); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	if err := checkJSONObject(body); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrFraming, err)
	}
	return body, nil
}

// readHeader reads a header part and returns its Content-Length.
func (r *Reader) readHeader() (int, error) {
	length := -1
	used := 0
	for first := true; ; first = false {
		line, err := r.r.ReadSlice('\n')
		used += len(line)
		switch {
		case err == bufio.ErrBufferFull || err == nil && used > maxHeader:
			return 0, fmt.Errorf("%w: header part longer than %d bytes", ErrFraming, maxHeader)
		case err == io.EOF && first && len(line) == 0:
			return 0, io.EOF
		case err == io.EOF:
			return 0, io.ErrUnexpectedEOF
		case err != nil:
			return 0, err
		}
		if len(line) < 2 || line[len(line)-2] != '\r' {
			return 0, fmt.Errorf("%w: header line %q does not end with CRLF", ErrFraming, clip(line))
		}
		line = line[:len(line)-2]
		if len(line) == 0 {
			break
		}
		name, value, ok := bytes.Cut(line, []byte{':'})
		if !ok || len(name) == 0 || !isToken(name) {
			return 0, fmt.Errorf("%w: malformed header line %q", ErrFraming, clip(line))
		}
		if !strings.EqualFold(string(name), "Content-Length") {
			continue // Content-Type and anything else: accepted, ignored
		}
		if length >= 0 {
			return 0, fmt.Errorf("%w: more than one Content-Length", ErrFraming)
		}
		v := string(bytes.TrimSpace(value))
		if v == "" || strings.TrimLeft(v, "0123456789") != "" {
			return 0, fmt.Errorf("%w: invalid Content-Length %q", ErrFraming, clip([]byte(v)))
		}
		n, err := strconv.ParseUint(v, 10, 63)
		if err != nil || n > uint64(r.max) {
			return 0, fmt.Errorf("%w: %w: Content-Length %s exceeds the %d-byte limit", ErrFraming, ErrTooLarge, clip([]byte(v)), r.max)
		}
		length = int(n)
	}
	if length < 0 {
		return 0, fmt.Errorf("%w: missing Content-Length", ErrFraming)
	}
	return length, nil
}

// isToken reports whether b is an HTTP-style header field name.
func isToken(b []byte) bool {
	for _, c := range b {
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`()<>@,;:\"/[]?={}`, c) >= 0 {
			return false
		}
	}
	return true
}

// clip shortens b for an error message.
func clip(b []byte) string {
	const n = 64
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}

// WriteMessage writes msg to w as one framed message (header and content
// in a single Write). It does not check msg; see CheckMessage.
func WriteMessage(w io.Writer, msg []byte) error {
	buf := make([]byte, 0, len(msg)+32)
	buf = append(buf, "Content-Length: "...)
	buf = strconv.AppendInt(buf, int64(len(msg)), 10)
	buf = append(buf, "\r\n\r\n"...)
	buf = append(buf, msg...)
	_, err := w.Write(buf)
	return err
}

// CheckMessage reports whether msg may be sent as one message: a JSON
// object of at most max bytes (max <= 0 means DefaultMaxMessage). The
// error wraps ErrTooLarge or ErrNotJSON.
func CheckMessage(msg []byte, max int) error {
	if max <= 0 {
		max = DefaultMaxMessage
	}
	if len(msg) > max {
		return fmt.Errorf("%w: %d bytes exceed the %d-byte limit", ErrTooLarge, len(msg), max)
	}
	return checkJSONObject(msg)
}

func checkJSONObject(b []byte) error {
	t := bytes.TrimLeft(b, " \t\r\n")
	if len(t) == 0 || t[0] != '{' || !json.Valid(b) {
		return fmt.Errorf("%w: %q", ErrNotJSON, clip(b))
	}
	return nil
}
