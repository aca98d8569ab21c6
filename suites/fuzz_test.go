package suites

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/internal/testworker"
	"github.com/corral-sandbox/corral/wire"
)

// FuzzWorkerLiveSocket sends arbitrary packets, with 0–3 descriptors, to a
// live worker after the handshake (and, for a third of the inputs, instead
// of it). Whatever arrives, the worker answers or closes that connection
// without leaking what it was sent, and keeps serving others: a fresh
// connection can still handshake and ping. The seeds run in every `go test`;
// `go test ./suites -fuzz FuzzWorkerLiveSocket` runs the campaign.
func FuzzWorkerLiveSocket(f *testing.F) {
	seeds := []string{
		`{"type":"ping","id":"1"}`,
		`{"type":"exec-start","id":"a","project":{"id":1,"workspace":"/nonexistent"},"argv":["true"],"cwd":"/workspace"}`,
		`{"type":"exec-attach","id":"a","fds":3}`,
		`{"type":"exec-cancel","id":"zzz"}`,
		`{"type":"net-dial","id":"d","project":{"id":1,"workspace":"/x"},"port":80}`,
		`{"type":"net-listen","id":"l","project":{"id":1,"workspace":"/x"},"port":3128}`,
		`{"type":"net-listen","id":"l","project":{"id":1,"workspace":"/x"},"port":0}`,
		`{"type":"net-listening","id":"l","fds":1}`,
		`{"type":"hello","protocol":1}`,
		`{"type":"exec-exit","id":"a","code":0}`,
		`{"type":"nope"}`,
		`{"type":"exec-start","fds":2}`,
		`{"type":"exec-start","id":"t","project":{"id":1,"workspace":"/nonexistent"},"argv":["sh"],"cwd":"/workspace","tty":{"rows":24,"cols":80}}`,
		`{"type":"exec-tty","fds":1,"id":"t"}`,
		`[]`, `{`, "\x00\xff", ``,
		`{"type":"exec-start","id":"b","project":{"id":1,"workspace":"../../etc"},"argv":["sh","-c","\u0000"],"cwd":"rel","env":{"A=B":"x"}}`,
		`{"type":"machine-reset","id":"r","project":{"id":1,"workspace":"/x"}}`,
		`{"type":"machine-reset","id":"","project":{"id":-1}}`,
		`{"type":"exec-start","id":"c","project":{"id":2,"workspace":"/x","image":"../../etc"},"argv":["true"]}`,
		`{"type":"machine-reset-done","id":"r"}`,
	}
	for i, s := range seeds {
		f.Add([]byte(s), uint8(i%4), i%3 == 0)
	}
	// One worker for the whole campaign.
	fuzzWorker := testworker.Start(f, testworker.Options{})
	f.Fuzz(func(t *testing.T, packet []byte, nfds uint8, skipHello bool) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := wire.Dial(ctx, fuzzWorker.Socket)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if !skipHello {
			if _, err := wire.ClientHello(c); err != nil {
				t.Fatal(err)
			}
		}
		// Raw packet with n descriptors (ends of pipes we keep the other
		// side of, to see that the worker releases them).
		n := int(nfds % 4)
		var ours, theirs []*os.File
		for i := 0; i < n; i++ {
			r, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			ours, theirs = append(ours, r), append(theirs, w)
		}
		fds := make([]int, n)
		for i, f := range theirs {
			fds[i] = int(f.Fd())
		}
		var oob []byte
		if n > 0 {
			oob = unix.UnixRights(fds...)
		}
		raw, err := c.UnixConn().SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var sendErr error
		_ = raw.Write(func(fd uintptr) bool {
			sendErr = unix.Sendmsg(int(fd), packet, oob, nil, 0)
			return sendErr != unix.EAGAIN
		})
		for _, f := range theirs {
			f.Close()
		}
		// Read until the worker closes or goes quiet.
		_ = c.UnixConn().SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		for {
			_, files, err := c.Recv()
			for _, f := range files {
				f.Close()
			}
			if err != nil {
				break
			}
		}
		c.Close()
		// Descriptors the worker received were closed, unless a session
		// that holds them legitimately runs: cancel-free seeds do not start
		// one (no valid workspace), so every pipe reaches EOF.
		for _, r := range ours {
			_ = r.SetReadDeadline(time.Now().Add(2 * time.Second))
			buf := make([]byte, 1)
			if _, err := r.Read(buf); err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
				t.Errorf("the worker kept a descriptor it was sent (%q, %d fds, send %v)", packet, n, sendErr)
			}
			r.Close()
		}
		// The worker still serves.
		c2, err := wire.Dial(ctx, fuzzWorker.Socket)
		if err != nil {
			t.Fatalf("worker gone after %q: %v", packet, err)
		}
		defer c2.Close()
		if _, err := wire.ClientHello(c2); err != nil {
			t.Fatalf("handshake after %q: %v", packet, err)
		}
		if err := c2.Send(&wire.Ping{ID: "p"}); err != nil {
			t.Fatal(err)
		}
		if m, _, err := c2.Recv(); err != nil || m.Type() != wire.TypePong {
			t.Fatalf("ping after %q: %v %v", packet, m, err)
		}
	})
}
