package wire

import (
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

func addSeeds(f *testing.F, add func(b []byte, nfds int)) {
	for _, m := range allMessages() {
		b, err := Encode(m)
		if err != nil {
			f.Fatal(err)
		}
		add(b, FDCount(m))
	}
	for _, s := range []string{
		``, `{}`, `null`, `[]`, `{"type":null}`, `{"type":"hello","protocol":1}`,
		`{"type":"exec-attach","fds":3,"id":"x"}`, `{"type":"exec-exit","id":"x","code":1,"signal":"SIGKILL"}`,
		`{"type":"exec-start","id":"x","argv":["a\u0000b"],"env":{"A":null}}`, `{"type":"net-dialed","fds":1e0,"id":"x"}`,
		`{"type":"net-listen","id":"x","project":{"id":1,"workspace":"/w"},"port":65536}`, `{"type":"net-listening","fds":1,"id":""}`,
		`{"type":"ping","TYPE":"pong","Id":"x"}`,
		`{"type":"machine-reset","id":"","project":{"id":1}}`, `{"type":"machine-reset-done"}`,
		`{"type":"ping","TYPE":"pong","Id":"x"}`, `{"type":"exec-start","id":"x","argv":["sh"],"tty":{"rows":1e9}}`,
		`{"type":"exec-tty","fds":1,"id":"x"}`,
	} {
		add([]byte(s), 0)
	}
}

// FuzzDecode checks that Decode never panics, that it returns either a
// message or a *ProtocolError, and that whatever it accepts re-encodes to a
// frame it accepts again, stably.
func FuzzDecode(f *testing.F) {
	addSeeds(f, func(b []byte, nfds int) { f.Add(b, nfds) })
	f.Fuzz(func(t *testing.T, b []byte, nfds int) {
		m, err := Decode(b, nfds)
		if err != nil {
			var pe *ProtocolError
			if !errors.As(err, &pe) || pe.Code == "" {
				t.Fatalf("Decode error %v is not a *ProtocolError", err)
			}
			if m != nil {
				t.Fatal("message returned with an error")
			}
			return
		}
		if nfds != FDCount(m) {
			t.Fatalf("accepted %s with %d fds, want %d", m.Type(), nfds, FDCount(m))
		}
		enc1, err := Encode(m)
		if err != nil {
			var pe *ProtocolError
			if errors.As(err, &pe) && pe.Code == CodeTooLarge {
				return // re-escaping can grow a frame near the limit
			}
			t.Fatalf("Encode of decoded %#v: %v", m, err)
		}
		m2, err := Decode(enc1, FDCount(m))
		if err != nil {
			t.Fatalf("Decode(Encode(m)) = %v for %s", err, enc1)
		}
		enc2, err := Encode(m2)
		if err != nil || string(enc2) != string(enc1) {
			t.Fatalf("unstable encoding: %s then %s, %v", enc1, enc2, err)
		}
	})
}

// FuzzRecv sends arbitrary packets with up to 7 real descriptors over a
// real socketpair and checks that Recv either returns exactly the declared
// descriptors or closes every one it received.
func FuzzRecv(f *testing.F) {
	addSeeds(f, func(b []byte, nfds int) { f.Add(b, uint8(nfds)) })
	f.Fuzz(func(t *testing.T, b []byte, nfds uint8) {
		if len(b) == 0 || len(b) > MaxFrame+16 {
			return // an empty packet reads as EOF; keep sizes near the limit
		}
		n := int(nfds % 8)
		ua, ub := rawPair(t)
		defer ua.Close()
		c := NewConn(ub)
		defer c.Close()
		r := sendRaw(t, ua, b, n)
		defer closeAll(r)
		m, files, err := c.Recv()
		if err != nil {
			var pe *ProtocolError
			if !errors.As(err, &pe) {
				t.Fatalf("Recv: %v is not a protocol error", err)
			}
			for i, f := range r {
				if !pipeWriterClosed(t, f) {
					t.Fatalf("descriptor %d still open after %v", i, err)
				}
			}
			return
		}
		defer closeAll(files)
		if len(files) != FDCount(m) || len(files) != n {
			t.Fatalf("%s: %d files, sent %d", m.Type(), len(files), n)
		}
	})
}

// pipeWriterClosed reports whether every write end of the pipe read by r is
// closed, without blocking.
func pipeWriterClosed(t *testing.T, r *os.File) bool {
	fds := []unix.PollFd{{Fd: int32(r.Fd()), Events: unix.POLLIN}}
	if _, err := unix.Poll(fds, 1000); err != nil {
		t.Fatal(err)
	}
	return fds[0].Revents&unix.POLLHUP != 0
}
