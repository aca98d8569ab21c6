package wire

import (
	"bytes"
	"reflect"
	"testing"
)

// hotMessages are hot frames in the shapes the fast codec writes, and some
// it must leave to encoding/json (strings it escapes, notStarted).
func hotMessages() []Message {
	code, neg, big := 0, -1, 1<<40
	id := "0b9f6a0e-6a43-4f4e-9e4c-1f2a3b4c5d6e"
	return []Message{
		&ExecAccepted{ID: id}, &ExecStarted{ID: id}, &ExecCancel{ID: id}, &ExecAttach{ID: id},
		&ExecExit{ID: id, Code: &code}, &ExecExit{ID: id, Code: &neg}, &ExecExit{ID: id, Code: &big},
		&ExecExit{ID: id, Signal: "SIGKILL"}, &ExecExit{ID: id, Signal: "SIGKILL", OOMKilled: true},
		&ExecExit{ID: id, NotStarted: true, Message: "no such file"},
		&ExecStart{ID: id, Project: Project{ID: 12, Workspace: "/srv/p/12"}, Account: 3, Lease: id,
			Argv: []string{"git", "status"}, Cwd: "/workspace", Env: map[string]string{"PATH": "/bin", "A": "", "HOME": "/h"}},
		&ExecStart{ID: id, Project: Project{ID: 1, Workspace: "/w", Image: "debian", Limits: &Limits{Memory: 1 << 30, CPU: -1, Tmp: 5}},
			Account: 0, Lease: "l", Argv: []string{}, Cwd: "", User: "root", TTY: &TTY{Rows: 24, Cols: 80}},
		&ExecStart{ID: id, Project: Project{ID: 1, Workspace: "/w", Limits: &Limits{}}, Lease: "l", Argv: nil},
		&ExecStart{ID: id, Project: Project{ID: 1, Workspace: "/w"}, Lease: "l", Argv: []string{"echo", "a<b", "\"q\"", "é", "\n"}},
		&ExecStart{ID: id, Project: Project{ID: -5, Workspace: "/w"}, Lease: "l", Argv: []string{"x"}, Env: map[string]string{"K": "v&w"}},
		&ExecRun{ID: id, Project: Project{ID: 12, Workspace: "/srv/p/12"}, Account: 3, Lease: id,
			Argv: []string{"git", "status"}, Cwd: "/workspace", Env: map[string]string{"PATH": "/bin", "A": "", "HOME": "/h"}},
		&ExecRun{ID: id, Project: Project{ID: 1, Workspace: "/w", Image: "debian", Limits: &Limits{Pids: 9}},
			Lease: "l", Argv: []string{"sh"}, Cwd: "/workspace", User: "1000", TTY: &TTY{Rows: 1, Cols: 2}},
		&ExecRun{ID: id, Project: Project{ID: 1, Workspace: "/w"}, Lease: "l", Argv: []string{"a\\b"}},
	}
}

// TestFastCodecMatchesJSON: the fast encoder writes encoding/json's bytes
// (or declines), and the fast decoder reads back what decodeJSON reads.
func TestFastCodecMatchesJSON(t *testing.T) {
	fast := 0
	for _, m := range append(hotMessages(), allMessages()...) {
		want, err := encodeJSON(pointerTo(m))
		if err != nil {
			t.Fatal(err)
		}
		got, err := Encode(m)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("Encode(%#v)\n = %s\nwant %s", m, got, want)
		}
		if f := encodeFast(pointerTo(m)); f != nil {
			fast++
		}
		wantM, err := decodeJSON(want, FDCount(m))
		if err != nil {
			t.Fatalf("decodeJSON(%s): %v", want, err)
		}
		if fm := decodeFast(want, FDCount(m)); fm != nil && !reflect.DeepEqual(fm, wantM) {
			t.Errorf("decodeFast(%s)\n = %#v\nwant %#v", want, fm, wantM)
		}
	}
	// The plain hot frames must take the fast path both ways.
	for _, m := range hotMessages()[:9] {
		b := encodeFast(pointerTo(m))
		if b == nil {
			t.Errorf("encodeFast declined %#v", m)
			continue
		}
		if decodeFast(b, FDCount(m)) == nil {
			t.Errorf("decodeFast declined %s", b)
		}
	}
	for _, m := range hotMessages()[len(hotMessages())-3 : len(hotMessages())-1] {
		b := encodeFast(pointerTo(m))
		if b == nil || decodeFast(b, 3) == nil {
			t.Errorf("exec-run %#v did not take the fast path both ways (%s)", m, b)
		}
		if decodeFast(b, 0) != nil {
			t.Errorf("decodeFast accepted %s without its descriptors", b)
		}
	}
	if fast < 10 {
		t.Errorf("only %d messages took the fast encoder", fast)
	}
}

// TestFastDecodeDeclines: frames off the canonical shape, or invalid, are
// left to decodeJSON (whose verdict Decode returns).
func TestFastDecodeDeclines(t *testing.T) {
	for _, tc := range []struct {
		frame string
		nfds  int
	}{
		{`{"type":"exec-started","id":""}`, 0},
		{`{"type":"exec-started","id":"x"}`, 1},
		{`{"type":"exec-started", "id":"x"}`, 0},
		{`{"type":"exec-started","id":"x"} `, 0},
		{`{"type":"exec-started","id":"x","id":"y"}`, 0},
		{`{"type":"exec-started","id":"\u0078"}`, 0},
		{`{"type":"exec-attach","fds":3,"id":"x"}`, 2},
		{`{"type":"exec-exit","id":"x","code":01}`, 0},
		{`{"type":"exec-exit","id":"x","code":1e2}`, 0},
		{`{"type":"exec-exit","id":"x","code":1.0}`, 0},
		{`{"type":"exec-exit","id":"x","code":99999999999999999999}`, 0},
		{`{"type":"exec-exit","id":"x","code":1,"signal":"SIGKILL"}`, 0},
		{`{"type":"exec-exit","id":"x"}`, 0},
		{`{"type":"exec-exit","id":"x","oomKilled":true}`, 0},
		{`{"type":"exec-start","id":"x","project":{"id":1,"workspace":"/w"},"account":1,"lease":"l","argv":["a"],"cwd":"/","env":{"B":"1","A":"2"}}`, 0},
		{`{"type":"exec-start","id":"x","project":{"id":1,"workspace":"/w"},"account":1,"lease":"l","argv":["a"],"cwd":"/","env":{"A":"1","A":"2"}}`, 0},
		{`{"type":"exec-start","id":"x","project":{"id":1,"workspace":"/w"},"account":1,"lease":"l","argv":["a"],"cwd":"/","tty":{"rows":70000,"cols":1}}`, 0},
		{`{"type":"exec-start","id":"x","project":{"id":1,"workspace":"/w","limits":{"memory":0}},"account":1,"lease":"l","argv":["a"],"cwd":"/"}`, 0},
	} {
		if m := decodeFast([]byte(tc.frame), tc.nfds); m != nil {
			t.Errorf("decodeFast(%s, %d) = %#v, want a decline", tc.frame, tc.nfds, m)
		}
	}
}

// FuzzFastDecode: whatever the fast decoder accepts, decodeJSON accepts
// with the same message.
func FuzzFastDecode(f *testing.F) {
	for _, m := range append(hotMessages(), allMessages()...) {
		b, err := Encode(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, FDCount(m))
	}
	f.Fuzz(func(t *testing.T, b []byte, nfds int) {
		fm := decodeFast(b, nfds)
		if fm == nil {
			return
		}
		jm, err := decodeJSON(b, nfds)
		if err != nil {
			t.Fatalf("decodeFast accepted %q (%d fds), decodeJSON: %v", b, nfds, err)
		}
		if !reflect.DeepEqual(fm, jm) {
			t.Fatalf("decodeFast(%q) = %#v, decodeJSON = %#v", b, fm, jm)
		}
	})
}

// FuzzFastEncode: the fast encoder writes encoding/json's bytes for
// exec-start, exec-run and exec-exit built from fuzzed strings.
func FuzzFastEncode(f *testing.F) {
	f.Add("id", "/w", "git", "status", "PATH", "/bin", int64(3), 0, "")
	f.Add("i<d", "/w\n", "é", "", "", "", int64(-1), -7, "SIGKILL")
	f.Fuzz(func(t *testing.T, id, ws, a0, a1, k, v string, n int64, code int, sig string) {
		for _, m := range []Message{
			&ExecStart{ID: id, Project: Project{ID: n, Workspace: ws}, Account: n, Lease: id, Argv: []string{a0, a1}, Cwd: ws,
				Env: map[string]string{k: v, "Z" + k: a1}, User: sig},
			&ExecRun{ID: id, Project: Project{ID: n, Workspace: ws}, Account: n, Lease: id, Argv: []string{a0}, Cwd: ws,
				Env: map[string]string{k: v}, User: sig},
			&ExecExit{ID: id, Code: &code},
			&ExecExit{ID: id, Signal: sig, OOMKilled: true},
		} {
			if validate(m) != nil {
				continue
			}
			fb := encodeFast(m)
			if fb == nil {
				continue
			}
			jb, err := encodeJSON(m)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(fb, jb) {
				t.Fatalf("encodeFast = %s\nencodeJSON = %s", fb, jb)
			}
			if dm := decodeFast(fb, FDCount(m)); dm != nil && !reflect.DeepEqual(dm, m) {
				t.Fatalf("decodeFast(encodeFast(m)) = %#v, want %#v", dm, m)
			}
		}
	})
}

// BenchmarkEncodeTurnJSON is BenchmarkEncodeTurn through encoding/json
// alone (the codec before the fast path), for comparison in one run.
func BenchmarkEncodeTurnJSON(b *testing.B) {
	ms := turnFrames()
	b.ReportAllocs()
	for b.Loop() {
		for _, m := range ms {
			if _, err := encodeJSON(pointerTo(m)); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkDecodeTurnJSON is BenchmarkDecodeTurn through encoding/json
// alone.
func BenchmarkDecodeTurnJSON(b *testing.B) {
	var frames [][]byte
	var nfds []int
	for _, m := range turnFrames() {
		f, err := Encode(m)
		if err != nil {
			b.Fatal(err)
		}
		frames, nfds = append(frames, f), append(nfds, FDCount(m))
	}
	b.ReportAllocs()
	for b.Loop() {
		for i, f := range frames {
			if _, err := decodeJSON(f, nfds[i]); err != nil {
				b.Fatal(err)
			}
		}
	}
}
