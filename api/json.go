package api

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"unicode/utf8"
)

// ErrorBody is the pinned JSON form of a command that did not complete —
// the form `corral run --json`, the runner, the daemon's API and its client
// share:
//
//	{"error":{"kind":K,"message":S,"stdout":S,"stderr":S}}
//
// Kind is an ErrorKind for a command, or one of the daemon's kinds for its
// other errors; Stdout and Stderr are the partial output (empty when
// nothing ran). A start error whose program was not found or not
// executable adds "reason" (the sandbox's CommandError.Reason) after
// "stderr": {"error":{"kind":"start",...,"stderr":"","reason":"notFound"}}.
type ErrorBody struct {
	Kind    string
	Message string
	Stdout  string
	Stderr  string
	Reason  string
}

// MarshalJSON writes the pinned body.
func (b ErrorBody) MarshalJSON() ([]byte, error) {
	var buf bytes.Buffer
	err := b.WriteJSON(&buf, false)
	return buf.Bytes(), err
}

// UnmarshalJSON decodes the pinned body: unknown members of "error" are
// refused, and so is a body without a kind.
func (b *ErrorBody) UnmarshalJSON(data []byte) error {
	var v struct {
		Error *struct {
			Kind    string `json:"kind"`
			Message string `json:"message"`
			Stdout  string `json:"stdout"`
			Stderr  string `json:"stderr"`
			Reason  string `json:"reason"`
		} `json:"error"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		return fmt.Errorf("api: error body: %w", err)
	}
	if v.Error == nil || v.Error.Kind == "" {
		return errors.New("api: error body without a kind")
	}
	*b = ErrorBody{Kind: v.Error.Kind, Message: v.Error.Message, Stdout: v.Error.Stdout, Stderr: v.Error.Stderr, Reason: v.Error.Reason}
	return nil
}

// WriteJSON streams the pinned body to w, byte for byte what
// encoding/json writes for it (json.Marshal when escapeHTML, an Encoder
// with SetEscapeHTML(false) otherwise; without the Encoder's newline). It
// holds no copy of the output: a 64 MiB stdout of NUL bytes becomes 384 MiB
// of JSON on w, written in small pieces.
func (b ErrorBody) WriteJSON(w io.Writer, escapeHTML bool) error {
	return b.writeJSON(w, escapeHTML, false)
}

// WriteJSONBase64 is WriteJSON with stdout and stderr written as the
// base64 (standard alphabet, padded) of their bytes: what WriteJSON writes
// for a copy of b whose Stdout and Stderr were so encoded, without that
// copy.
func (b ErrorBody) WriteJSONBase64(w io.Writer, escapeHTML bool) error {
	return b.writeJSON(w, escapeHTML, true)
}

func (b ErrorBody) writeJSON(w io.Writer, escapeHTML, b64 bool) error {
	jw := newJSONWriter(w, escapeHTML)
	out := jw.str
	if b64 {
		out = jw.base64
	}
	jw.raw(`{"error":{"kind":`)
	jw.str(b.Kind)
	jw.raw(`,"message":`)
	jw.str(b.Message)
	jw.raw(`,"stdout":`)
	out(b.Stdout)
	jw.raw(`,"stderr":`)
	out(b.Stderr)
	if b.Reason != "" {
		jw.raw(`,"reason":`)
		jw.str(b.Reason)
	}
	jw.raw(`}}`)
	return jw.flush()
}

// WriteJSON streams r's JSON form ({"stdout":S,"stderr":S,"code":N|null,
// "signal":S|null}, plus "oomKilled":true, as MarshalJSON writes it) to w, byte for byte what encoding/json writes for it
// (see ErrorBody.WriteJSON), without a copy of the output. MarshalJSON
// always escapes HTML, so WriteJSON(w, true) is what every encoder writes
// for r.
func (r CommandResult) WriteJSON(w io.Writer, escapeHTML bool) error {
	return r.writeJSON(w, escapeHTML, false)
}

// WriteJSONBase64 is WriteJSON with stdout and stderr written as the
// base64 (standard alphabet, padded) of their bytes: what WriteJSON writes
// for a copy of r whose Stdout and Stderr were so encoded, without that
// copy.
func (r CommandResult) WriteJSONBase64(w io.Writer, escapeHTML bool) error {
	return r.writeJSON(w, escapeHTML, true)
}

func (r CommandResult) writeJSON(w io.Writer, escapeHTML, b64 bool) error {
	jw := newJSONWriter(w, escapeHTML)
	out := jw.str
	if b64 {
		out = jw.base64
	}
	jw.raw(`{"stdout":`)
	out(r.Stdout)
	jw.raw(`,"stderr":`)
	out(r.Stderr)
	jw.raw(`,"code":`)
	if r.Code != nil {
		jw.raw(strconv.Itoa(*r.Code))
	} else {
		jw.raw("null")
	}
	jw.raw(`,"signal":`)
	if r.Signal != "" {
		jw.str(r.Signal)
	} else {
		jw.raw("null")
	}
	if r.OOMKilled && r.Signal != "" {
		jw.raw(`,"oomKilled":true`)
	}
	jw.raw(`}`)
	return jw.flush()
}

// jsonWriter writes JSON tokens through a small buffer; the first error
// sticks.
type jsonWriter struct {
	w          *bufio.Writer
	escapeHTML bool
	err        error
}

func newJSONWriter(w io.Writer, escapeHTML bool) *jsonWriter {
	return &jsonWriter{w: bufio.NewWriterSize(w, 32<<10), escapeHTML: escapeHTML}
}

func (j *jsonWriter) raw(s string) {
	if j.err == nil {
		_, j.err = j.w.WriteString(s)
	}
}

func (j *jsonWriter) flush() error {
	if j.err == nil {
		j.err = j.w.Flush()
	}
	return j.err
}

// base64 writes the base64 of s's bytes as a JSON string (its alphabet
// needs no escapes), a piece at a time.
func (j *jsonWriter) base64(s string) {
	if j.err != nil {
		return
	}
	j.w.WriteByte('"')
	enc := base64.NewEncoder(base64.StdEncoding, j.w)
	const piece = 3 << 10
	for len(s) > 0 {
		n := min(len(s), piece)
		_, _ = enc.Write([]byte(s[:n]))
		s = s[n:]
	}
	_ = enc.Close()
	_, j.err = j.w.Write([]byte{'"'})
}

const hexDigits = "0123456789abcdef"

// str writes s as a JSON string with encoding/json's escapes: the short
// forms \" \\ \b \f \n \r \t, \u00XX for other control bytes, \u003c
// \u003e \u0026 for < > & when escaping HTML, \u2028 and \u2029 always,
// and \ufffd for each invalid UTF-8 byte.
func (j *jsonWriter) str(s string) {
	if j.err != nil {
		return
	}
	w := j.w
	w.WriteByte('"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && (!j.escapeHTML || (c != '<' && c != '>' && c != '&')) {
				i++
				continue
			}
			w.WriteString(s[start:i])
			switch c {
			case '"', '\\':
				w.WriteByte('\\')
				w.WriteByte(c)
			case '\b':
				w.WriteString(`\b`)
			case '\f':
				w.WriteString(`\f`)
			case '\n':
				w.WriteString(`\n`)
			case '\r':
				w.WriteString(`\r`)
			case '\t':
				w.WriteString(`\t`)
			default:
				w.WriteString(`\u00`)
				w.WriteByte(hexDigits[c>>4])
				w.WriteByte(hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			w.WriteString(s[start:i])
			w.WriteString(`\ufffd`)
			i++
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			w.WriteString(s[start:i])
			w.WriteString(`\u202`)
			w.WriteByte(hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	w.WriteString(s[start:])
	_, j.err = w.Write([]byte{'"'})
}
