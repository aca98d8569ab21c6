package lsp_test

import (
	"bytes"
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/corral-sandbox/corral/plugins/lsp"
)

func frame(body string) string {
	return "Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
}

func TestReadMessage(t *testing.T) {
	a := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`
	b := `{"jsonrpc":"2.0","method":"initialized","params":{"é":"ü"}}`
	tests := []struct {
		name string
		in   string
		want []string
		err  error // after the messages; nil means io.EOF
	}{
		{"two messages", frame(a) + frame(b), []string{a, b}, nil},
		{"empty input", "", nil, nil},
		{"content type and case", "content-length: 2\r\nContent-Type: application/vscode-jsonrpc; charset=utf-8\r\n\r\n{}", []string{"{}"}, nil},
		{"leading zeros and spaces", "Content-Length:   002  \r\n\r\n{}", []string{"{}"}, nil},
		{"unknown field ignored", "X-Foo: bar\r\nContent-Length: 2\r\n\r\n{}", []string{"{}"}, nil},
		{"eof in header", "Content-Length: 2\r\n", nil, io.ErrUnexpectedEOF},
		{"eof in first line", "Content-Len", nil, io.ErrUnexpectedEOF},
		{"eof in body", "Content-Length: 10\r\n\r\n{}", nil, io.ErrUnexpectedEOF},
		{"missing length", "Content-Type: x\r\n\r\n{}", nil, lsp.ErrFraming},
		{"blank line only", "\r\n", nil, lsp.ErrFraming},
		{"negative length", "Content-Length: -2\r\n\r\n{}", nil, lsp.ErrFraming},
		{"plus sign", "Content-Length: +2\r\n\r\n{}", nil, lsp.ErrFraming},
		{"hex length", "Content-Length: 0x2\r\n\r\n{}", nil, lsp.ErrFraming},
		{"empty length", "Content-Length:\r\n\r\n{}", nil, lsp.ErrFraming},
		{"two lengths", "Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}", nil, lsp.ErrFraming},
		{"bare LF", "Content-Length: 2\n\n{}", nil, lsp.ErrFraming},
		{"no colon", "Content-Length 2\r\n\r\n{}", nil, lsp.ErrFraming},
		{"space in name", "Content Length: 2\r\n\r\n{}", nil, lsp.ErrFraming},
		{"too large", "Content-Length: 1025\r\n\r\n", nil, lsp.ErrTooLarge},
		{"huge", "Content-Length: 99999999999999999999999\r\n\r\n", nil, lsp.ErrTooLarge},
		{"long header", "X: " + strings.Repeat("a", 5000) + "\r\n", nil, lsp.ErrFraming},
		{"many fields", strings.Repeat("X: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n", 200), nil, lsp.ErrFraming},
		{"not json", frame("hello there"), nil, lsp.ErrNotJSON},
		{"json array", frame(`[{"id":1}]`), nil, lsp.ErrNotJSON},
		{"json string", frame(`"x"`), nil, lsp.ErrNotJSON},
		{"truncated json", frame(`{"id":1`), nil, lsp.ErrNotJSON},
		{"empty body", frame(""), nil, lsp.ErrNotJSON},
		{"garbage after message", frame(a) + "garbage\r\n\r\n", []string{a}, lsp.ErrFraming},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// One byte at a time, to exercise every boundary.
			r := lsp.NewReader(iotest.OneByteReader(strings.NewReader(tt.in)), 1024)
			for _, w := range tt.want {
				m, err := r.ReadMessage()
				if err != nil || string(m) != w {
					t.Fatalf("got %q, %v; want %q", m, err, w)
				}
			}
			_, err := r.ReadMessage()
			want := tt.err
			if want == nil {
				want = io.EOF
			}
			if !errors.Is(err, want) {
				t.Fatalf("error %v, want %v", err, want)
			}
			if errors.Is(want, lsp.ErrTooLarge) || errors.Is(want, lsp.ErrNotJSON) {
				if !errors.Is(err, lsp.ErrFraming) {
					t.Errorf("error %v does not wrap ErrFraming", err)
				}
			}
		})
	}
}

func TestReadMessageReaderError(t *testing.T) {
	boom := errors.New("boom")
	r := lsp.NewReader(io.MultiReader(strings.NewReader("Content-Length: 2\r\n"), iotest.ErrReader(boom)), 0)
	if _, err := r.ReadMessage(); !errors.Is(err, boom) {
		t.Fatalf("error %v, want boom", err)
	}
}

func TestWriteMessageRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	msgs := []string{`{}`, `{"jsonrpc":"2.0","id":"x","result":null}`, `{"s":"` + strings.Repeat("ü", 3000) + `"}`}
	for _, m := range msgs {
		if err := lsp.WriteMessage(&buf, []byte(m)); err != nil {
			t.Fatal(err)
		}
	}
	if !strings.HasPrefix(buf.String(), "Content-Length: 2\r\n\r\n{}Content-Length: ") {
		t.Fatalf("framing %q", buf.String()[:40])
	}
	r := lsp.NewReader(&buf, 0)
	for _, m := range msgs {
		got, err := r.ReadMessage()
		if err != nil || string(got) != m {
			t.Fatalf("got %q, %v", clipTest(got), err)
		}
	}
	if _, err := r.ReadMessage(); err != io.EOF {
		t.Fatalf("end: %v", err)
	}
}

func TestCheckMessage(t *testing.T) {
	for _, tt := range []struct {
		msg  string
		want error
	}{
		{`{"jsonrpc":"2"}`, nil},
		{` {}`, nil},
		{`{`, lsp.ErrNotJSON},
		{`[]`, lsp.ErrNotJSON},
		{`null`, lsp.ErrNotJSON},
		{``, lsp.ErrNotJSON},
		{`{"a":"` + strings.Repeat("x", 20) + `"}`, lsp.ErrTooLarge},
	} {
		if err := lsp.CheckMessage([]byte(tt.msg), 16); !errors.Is(err, tt.want) && !(tt.want == nil && err == nil) {
			t.Errorf("CheckMessage(%q) = %v, want %v", tt.msg, err, tt.want)
		}
	}
}

func clipTest(b []byte) string {
	if len(b) > 40 {
		return string(b[:40]) + "…"
	}
	return string(b)
}

// FuzzReadMessage checks that the reader never panics, never returns more
// than its limit, returns only JSON objects, and that what it accepts
// survives a write/read round trip.
func FuzzReadMessage(f *testing.F) {
	f.Add([]byte(frame(`{"id":1}`)))
	f.Add([]byte("Content-Length: 3\r\n\r\n{}}"))
	f.Add([]byte("content-length:0002\r\nContent-Type: x\r\n\r\n{}"))
	f.Add([]byte("Content-Length: 99999999999\r\n\r\n"))
	f.Add([]byte("\r\n\r\n"))
	f.Add([]byte(frame(`{}`) + frame(`{"a":[1,2,{"b":null}]}`)))
	const limit = 256
	f.Fuzz(func(t *testing.T, in []byte) {
		r := lsp.NewReader(bytes.NewReader(in), limit)
		for i := 0; i < 64; i++ {
			m, err := r.ReadMessage()
			if err != nil {
				if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, lsp.ErrFraming) {
					t.Fatalf("unexpected error kind: %v", err)
				}
				return
			}
			if len(m) > limit {
				t.Fatalf("message of %d bytes over the %d limit", len(m), limit)
			}
			if err := lsp.CheckMessage(m, limit); err != nil {
				t.Fatalf("accepted an invalid message %q: %v", m, err)
			}
			var buf bytes.Buffer
			if err := lsp.WriteMessage(&buf, m); err != nil {
				t.Fatal(err)
			}
			again, err := lsp.NewReader(&buf, limit).ReadMessage()
			if err != nil || !bytes.Equal(again, m) {
				t.Fatalf("round trip: %q, %v", again, err)
			}
		}
	})
}
