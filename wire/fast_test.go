package wire

import (
	"reflect"
	"strings"
	"testing"
)

// fastCases are allMessages and variants that exercise the corners of
// appendFrame and decodeFast: numbers, empty and nil lists and maps,
// values, and strings that need escaping (which take the general path).
func fastCases() []Message {
	ms := allMessages()
	ms = append(ms,
		&ExecExit{ID: "x", Code: intp(-1)},
		&ExecExit{ID: "x", Code: intp(1 << 40)},
		&ExecExit{ID: "x", NotStarted: true},
		&ExecStart{ID: "x", Project: Project{ID: -3}, Account: -1 << 62, Argv: []string{}, Cwd: "/w", Env: map[string]string{}},
		&ExecStart{ID: "x", Argv: []string{"", "a b", "~!@#$%^*()_+{}|:?`-=[];',./"}, Env: map[string]string{"Z": "", "A": "1", "M": "x=y"}},
		&ExecStart{ID: "x", Argv: []string{"<html>", "a&b", "tab\there", "quote\"", "back\\slash", "é", "\x00", "\xff"}},
		&ExecStart{ID: "x", Argv: []string{"a"}, Env: map[string]string{"K": "\u2028"}},
		&Hello{Protocol: -7, Worker: "w<1>"},
		&NetDial{ID: "d", Port: 65535, Project: Project{ID: 1 << 50, Workspace: "/a/b"}},
		ExecStarted{ID: "value"},
		Ping{},
		&Error{Code: "c", Message: ""},
	)
	return ms
}

// TestFastPathsMatchJSON: wherever appendFrame answers, it writes exactly
// what encoding/json would; wherever decodeFast accepts, the general path
// decodes the same message.
func TestFastPathsMatchJSON(t *testing.T) {
	fastEncoded, fastDecoded := 0, 0
	for _, m := range fastCases() {
		p := pointerTo(m)
		want, err := encodeJSON(p)
		if err != nil {
			t.Fatal(err)
		}
		if got, ok := appendFrame(nil, m); ok {
			fastEncoded++
			if string(got) != string(want) {
				t.Errorf("appendFrame(%#v)\n= %s\nwant %s", m, got, want)
			}
		}
		b, err := Encode(m)
		if err != nil || string(b) != string(want) {
			t.Errorf("Encode(%#v) = %s, %v; want %s", m, b, err, want)
		}
		general, err := decodeJSON(b, FDCount(m))
		if err != nil {
			t.Fatalf("decodeJSON(%s): %v", b, err)
		}
		if got, ok := decodeFast(b, FDCount(m)); ok {
			fastDecoded++
			if !reflect.DeepEqual(got, general) {
				t.Errorf("decodeFast(%s) = %#v, general path %#v", b, got, general)
			}
		}
		if _, ok := decodeFast(b, FDCount(m)+1); ok {
			t.Errorf("decodeFast(%s) accepted a wrong descriptor count", b)
		}
	}
	// The frames of a command's life take the fast paths.
	if n := len(fastCases()); fastEncoded < n-5 || fastDecoded < n-5 {
		t.Errorf("fast paths taken %d and %d times of %d", fastEncoded, fastDecoded, n)
	}
}

// TestDecodeFastRefusesNonCanonical: frames the general path reads, but
// not as appendFrame writes them, are left to it — and decoded as before.
func TestDecodeFastRefusesNonCanonical(t *testing.T) {
	for _, s := range []string{
		`{"type":"exec-exit","id":"a","code":01}`,
		`{"type":"exec-exit","id":"a","code":-0}`,
		`{"type":"exec-exit", "id":"a","code":0}`,
		`{"type":"exec-exit","code":0,"id":"a"}`,
		`{"type":"exec-exit","id":"a","id":"b","code":0}`,
		`{"type":"exec-exit","id":"a","code":0,"extra":1}`,
		`{"type":"exec-exit","id":"a","code":1e0}`,
		`{"type":"exec-exit","id":"a","code":0,"notStarted":false}`,
		`{"type":"ping","id":""}`,
		`{"type":"exec-start","id":"a","project":{"id":1,"workspace":"/w"},"account":0,"lease":"","argv":["x"],"cwd":"/","env":{"B":"1","A":"2"}}`,
		`{"type":"exec-start","id":"a","project":{"id":1,"workspace":"/w"},"account":0,"lease":"","argv":["x"],"cwd":"/","env":{"A":"1","A":"2"}}`,
		`{"type":"exec-start","id":"a","project":{"id":1,"workspace":"/w"},"account":0,"lease":"","argv":["x"],"cwd":"/","env":{}}`,
		`{"type":"exec-attach","id":"a","fds":3}`,
		`{"type":"exec-accepted","id":"a"} `,
		`{"type":"exec-accepted","id":"a\u0062"}`,
		`{"type":"hello","protocol":1234567890123456789}`,
	} {
		nfds := 0
		if strings.Contains(s, "exec-attach") {
			nfds = 3
		}
		if _, ok := decodeFast([]byte(s), nfds); ok {
			t.Errorf("decodeFast accepted %s", s)
		}
		m1, err1 := Decode([]byte(s), nfds)
		m2, err2 := decodeJSON([]byte(s), nfds)
		if !reflect.DeepEqual(m1, m2) || (err1 == nil) != (err2 == nil) {
			t.Errorf("Decode(%s) = %#v, %v; general path %#v, %v", s, m1, err1, m2, err2)
		}
	}
}
