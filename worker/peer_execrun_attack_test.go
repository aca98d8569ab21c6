package worker

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/wire"
)

// dialAsUID connects to sock from a locked thread whose effective uid is
// uid for the connect alone (SO_PEERCRED records the connecting thread's
// credentials), then gives the thread its root back.
func dialAsUID(t *testing.T, sock string, uid int) *wire.Conn {
	t.Helper()
	type res struct {
		c   *wire.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		runtime.LockOSThread()
		// Only this thread: the raw system call, not syscall.Setresuid
		// (which changes every thread).
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), uintptr(uid), ^uintptr(0)); e != 0 {
			ch <- res{err: e}
			return // the thread stays locked and ends with the goroutine
		}
		c, err := wire.Dial(context.Background(), sock)
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), 0, ^uintptr(0)); e != 0 {
			ch <- res{c, err}
			return // still not root: let the thread end with the goroutine
		}
		runtime.UnlockOSThread()
		ch <- res{c, err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("dial as uid %d: %v", uid, r.err)
	}
	return r.c
}

// TestForbiddenPeerExecRun: a peer the worker does not serve (uid 65534)
// that sends hello and an exec-run at once, without waiting for an
// answer, gets the connection error "forbidden" and nothing else: the
// exec-run is never interpreted, its command never runs, and its
// descriptors are not kept.
func TestForbiddenPeerExecRun(t *testing.T) {
	h := newHarness(t, nil)
	proj := h.project(t, 1)
	for _, d := range []string{filepath.Dir(filepath.Dir(h.sock)), filepath.Dir(h.sock)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(h.sock, 0o666); err != nil {
		t.Fatal(err)
	}
	c := dialAsUID(t, h.sock, 65534)
	defer c.Close()
	if err := c.Send(&wire.Hello{Protocol: wire.Protocol}); err != nil {
		t.Fatal(err)
	}
	p := newRunPipes(t)
	p.send(t, c, &wire.ExecRun{ID: "sneak", Project: proj, Cwd: "/workspace",
		Argv: []string{"sh", "-c", "touch /workspace/sneaked; echo ran"}})
	_ = c.UnixConn().SetReadDeadline(time.Now().Add(20 * time.Second))
	m, files, err := c.Recv()
	for _, f := range files {
		f.Close()
	}
	if err != nil {
		t.Fatalf("recv: %v", err)
	}
	if e, ok := m.(*wire.Error); !ok || e.Code != wire.CodeForbidden {
		t.Fatalf("got %#v, want the connection error forbidden", m)
	}
	if m, _, err := c.Recv(); err == nil {
		t.Fatalf("after forbidden: %#v", m)
	}
	c.Close() // the worker drains until the peer closes
	if !readsEOF(t, p.outR) {
		t.Error("the forbidden peer's descriptors are still open")
	}
	if _, err := os.Stat(filepath.Join(h.root, "p1", "sneaked")); err == nil {
		t.Fatal("a forbidden peer's exec-run ran")
	}
}
