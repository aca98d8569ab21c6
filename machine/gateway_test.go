package machine

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/wire"
)

var project = Project{ID: 7, Workspace: "/srv/projects/7"}

func req(argv ...string) ExecRequest {
	return ExecRequest{Project: project, Account: 1, Lease: "lease-1", Argv: argv, Cwd: "/workspace"}
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(string(bytes.TrimRight(p, "\n")))
	return len(p), nil
}

// setup starts a fake worker and a gateway connected to it; both are
// stopped at cleanup (gateway first).
func setup(t *testing.T, opts Options) (*Gateway, *fakeWorker) {
	t.Helper()
	return setupRun(t, opts, false)
}

// setupRun is setup with a fake worker that announces wire.FeatureExecRun
// or not.
func setupRun(t *testing.T, opts Options, execRun bool) (*Gateway, *fakeWorker) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "worker.sock")
	f := startFakeRun(t, path, execRun)
	if opts.Logger == nil {
		opts.Logger = testLogger(t)
	}
	if opts.MinBackoff == 0 {
		opts.MinBackoff = 5 * time.Millisecond
		opts.MaxBackoff = 50 * time.Millisecond
	}
	g := New(SocketTransport{Path: path}, opts)
	t.Cleanup(func() {
		g.Close()
		f.stop()
	})
	return g, f
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents) - 1
}

func TestNilTransport(t *testing.T) {
	g := New(nil, Options{})
	defer g.Close()
	ctx := ctxT(t)
	if _, err := g.Exec(ctx, req("true")); err != ErrNoPrivilegedTransport {
		t.Errorf("Exec = %v, want ErrNoPrivilegedTransport", err)
	}
	if _, err := g.Dial(ctx, project, 80); !errors.Is(err, ErrNoPrivilegedTransport) {
		t.Errorf("Dial = %v, want ErrNoPrivilegedTransport", err)
	}
	if err := g.Ping(ctx); !errors.Is(err, ErrNoPrivilegedTransport) {
		t.Errorf("Ping = %v, want ErrNoPrivilegedTransport", err)
	}
	if ErrNoPrivilegedTransport.Error() != "no privileged transport in this process" {
		t.Errorf("message %q", ErrNoPrivilegedTransport)
	}
	var nilG *Gateway
	if _, err := nilG.Exec(ctx, req("true")); err != ErrNoPrivilegedTransport {
		t.Errorf("nil gateway Exec = %v", err)
	}
	if g.HasTransport() || nilG.HasTransport() {
		t.Error("HasTransport true without a transport")
	}
	if !New(SocketTransport{Path: "/nonexistent"}, Options{}).closeForTest().HasTransport() {
		t.Error("HasTransport false with a transport")
	}
}

func TestHandshakeAndPing(t *testing.T) {
	g, f := setup(t, Options{})
	ctx := ctxT(t)
	if err := g.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if err := g.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if n := f.handshakes.Load(); n != 1 {
		t.Errorf("%d handshakes, want 1 persistent connection", n)
	}
}

func TestExecRoundTrip(t *testing.T) {
	g, _ := setup(t, Options{})
	ctx := ctxT(t)
	if err := g.Ping(ctx); err != nil { // warm up before counting descriptors
		t.Fatal(err)
	}
	before := openFDs(t)
	for _, tc := range []struct {
		argv []string
		code int
	}{{[]string{"cat"}, 0}, {[]string{"cat", "3"}, 3}} {
		s, err := g.Exec(ctx, req(tc.argv...))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(s.Stdin, "hello through the socketpair"); err != nil {
			t.Fatal(err)
		}
		if err := s.Stdin.Close(); err != nil { // EOF for the command
			t.Fatal(err)
		}
		out, err := io.ReadAll(s.Stdout)
		if err != nil || string(out) != "out:hello through the socketpair" {
			t.Errorf("stdout %q, %v", out, err)
		}
		errOut, err := io.ReadAll(s.Stderr)
		if err != nil || string(errOut) != "err" {
			t.Errorf("stderr %q, %v", errOut, err)
		}
		exit, err := s.Wait()
		if err != nil || exit.Code == nil || *exit.Code != tc.code || exit.Signal != "" {
			t.Errorf("Wait = %+v, %v; want code %d", exit, err, tc.code)
		}
		select {
		case <-s.Done():
		default:
			t.Error("Done not closed after Wait")
		}
		s.Close()
		s.Close()
	}
	if after := openFDs(t); after != before {
		t.Errorf("descriptor leak: %d before, %d after", before, after)
	}
}

// settledFDs returns the number of open descriptors once it stops
// changing (or equals want, if want >= 0), waiting at most two seconds.
func settledFDs(t *testing.T, want int) int {
	t.Helper()
	n := openFDs(t)
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline) && n != want; {
		time.Sleep(20 * time.Millisecond)
		m := openFDs(t)
		if want < 0 && m == n {
			break
		}
		n = m
	}
	return n
}

func TestExecRejected(t *testing.T) {
	g, _ := setup(t, Options{})
	before := -1
	for range 2 {
		_, err := g.Exec(ctxT(t), req("reject"))
		var rej *RejectedError
		if !errors.As(err, &rej) || !errors.Is(err, ErrBadRequest) {
			t.Fatalf("Exec = %v, want *RejectedError bad-argv", err)
		}
		// The fake worker closes the descriptors of the attach that
		// followed the rejected start on its own time.
		if before < 0 {
			before = settledFDs(t, -1)
		} else if after := settledFDs(t, before); after != before {
			t.Errorf("descriptor leak: %d, then %d", before, after)
		}
	}
}

func TestExecNotStarted(t *testing.T) {
	g, _ := setup(t, Options{})
	s, err := g.Exec(ctxT(t), req("notstarted"))
	if err != nil {
		t.Fatalf("Exec = %v; a program that cannot run is reported by Wait", err)
	}
	defer s.Close()
	exit, err := s.Wait()
	if !errors.Is(err, ErrNotStarted) || exit.Code != nil || exit.Signal != "" {
		t.Errorf("Wait = %+v, %v; want ErrNotStarted and no exit", exit, err)
	}
	if errors.Is(err, ErrInterrupted) {
		t.Error("not-started is not an interruption")
	}
}

func TestExecSignal(t *testing.T) {
	g, _ := setup(t, Options{})
	s, err := g.Exec(ctxT(t), req("signal"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if exit, err := s.Wait(); err != nil || exit.Signal != "SIGTERM" || exit.Code != nil {
		t.Errorf("Wait = %+v, %v; want SIGTERM", exit, err)
	}
}

func TestCancel(t *testing.T) {
	g, f := setup(t, Options{})
	ctx := ctxT(t)
	s, err := g.Exec(ctx, req("sleep"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	select {
	case <-s.Done():
		t.Fatal("session ended before cancel")
	case <-time.After(20 * time.Millisecond):
	}
	for range 3 {
		if err := s.Cancel(ctx); err != nil {
			t.Fatal(err)
		}
	}
	exit, err := s.Wait()
	if err != nil || exit.Signal != "SIGKILL" {
		t.Errorf("Wait = %+v, %v; want SIGKILL", exit, err)
	}
	if err := s.Cancel(ctx); err != nil {
		t.Errorf("Cancel after end = %v", err)
	}
	if err := g.Ping(ctx); err != nil { // all frames before it were handled
		t.Fatal(err)
	}
	if n := f.cancels.Load(); n != 1 {
		t.Errorf("worker got %d exec-cancel, want 1", n)
	}
}

func TestExecContextEndsBeforeAccept(t *testing.T) {
	g, f := setup(t, Options{})
	ctx, cancel := context.WithTimeout(ctxT(t), 50*time.Millisecond)
	defer cancel()
	_, err := g.Exec(ctx, req("noanswer"))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Exec = %v, want deadline exceeded", err)
	}
	if err := g.Ping(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if n := f.cancels.Load(); n != 1 {
		t.Errorf("worker got %d exec-cancel for the abandoned session, want 1", n)
	}
}

func TestInterruptedBeforeWait(t *testing.T) {
	var mu sync.Mutex
	var got [][]string
	called := make(chan struct{})
	release := make(chan struct{})
	g, f := setup(t, Options{OnInterrupted: func(ids []string) {
		mu.Lock()
		got = append(got, ids)
		mu.Unlock()
		close(called)
		<-release
	}})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(unblock) // runs before the gateway is closed, even on failure
	ctx := ctxT(t)
	var sessions []*Session
	for _, id := range []string{"b-session", "a-session"} {
		r := req("hang")
		r.ID = id
		s, err := g.Exec(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		sessions = append(sessions, s)
	}
	waited := make(chan error, len(sessions))
	for _, s := range sessions {
		go func() { _, err := s.Wait(); waited <- err }()
	}

	f.dropConns() // the worker "crashes"
	select {
	case <-called:
	case <-time.After(5 * time.Second):
		t.Fatal("OnInterrupted not called")
	}
	// While OnInterrupted runs, no Wait may return.
	select {
	case err := <-waited:
		t.Fatalf("Wait returned %v before OnInterrupted finished", err)
	case <-time.After(50 * time.Millisecond):
	}
	for _, s := range sessions {
		select {
		case <-s.Done():
			t.Fatal("Done closed before OnInterrupted finished")
		default:
		}
	}
	unblock()
	for range sessions {
		err := <-waited
		if !errors.Is(err, ErrInterrupted) {
			t.Errorf("Wait = %v, want ErrInterrupted", err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if want := [][]string{{"a-session", "b-session"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("OnInterrupted calls %v, want %v", got, want)
	}
}

func TestReconnectAfterRestart(t *testing.T) {
	var interrupted [][]string
	var mu sync.Mutex
	path := filepath.Join(t.TempDir(), "worker.sock")
	f := startFake(t, path)
	g := New(SocketTransport{Path: path}, Options{
		Logger:     testLogger(t),
		MinBackoff: 5 * time.Millisecond, MaxBackoff: 40 * time.Millisecond,
		OnInterrupted: func(ids []string) {
			mu.Lock()
			interrupted = append(interrupted, ids)
			mu.Unlock()
		},
	})
	defer g.Close()
	ctx := ctxT(t)
	s, err := g.Exec(ctx, req("hang"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	f.stop() // kill the worker: listener and connection
	if _, err := s.Wait(); !errors.Is(err, ErrInterrupted) {
		t.Fatalf("Wait = %v, want ErrInterrupted", err)
	}
	// While the worker is down, calls fail with ErrUnavailable (after an
	// attempt that began after the call) rather than hanging.
	if _, err := g.Exec(ctx, req("cat")); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Exec with the worker down = %v, want ErrUnavailable", err)
	}

	f2 := startFake(t, path)
	defer f2.stop()
	var s2 *Session
	deadline := time.Now().Add(5 * time.Second)
	for {
		s2, err = g.Exec(ctx, req("cat"))
		if err == nil || time.Now().After(deadline) || !errors.Is(err, ErrUnavailable) {
			break
		}
	}
	if err != nil {
		t.Fatalf("Exec after restart = %v", err)
	}
	defer s2.Close()
	s2.Stdin.Close()
	if out, _ := io.ReadAll(s2.Stdout); string(out) != "out:" {
		t.Errorf("stdout %q", out)
	}
	if exit, err := s2.Wait(); err != nil || *exit.Code != 0 {
		t.Errorf("Wait = %+v, %v", exit, err)
	}
	if n := f2.handshakes.Load(); n != 1 {
		t.Errorf("new worker saw %d handshakes, want 1", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(interrupted) != 1 || !slices.Equal(interrupted[0], []string{s.ID}) {
		t.Errorf("OnInterrupted calls %v, want one with %s", interrupted, s.ID)
	}
}

func TestUnavailable(t *testing.T) {
	g := New(SocketTransport{Path: filepath.Join(t.TempDir(), "nobody-home")}, Options{
		MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond, Logger: testLogger(t)})
	defer g.Close()
	start := time.Now()
	_, err := g.Exec(ctxT(t), req("true"))
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, unix.ENOENT) {
		t.Errorf("Exec = %v, want ErrUnavailable wrapping ENOENT", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("took %v to fail", d)
	}
}

func TestProtocolRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "worker.sock")
	f := &fakeWorker{t: t, path: path, conns: map[*wire.Conn]bool{},
		hello: &wire.Error{Code: wire.CodeUnsupportedProtocol, Message: "only protocol 1"}}
	l, err := wire.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	f.l = l
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			uc, err := l.AcceptUnix()
			if err != nil {
				return
			}
			f.serveConn(wire.NewConn(uc))
		}
	}()
	defer f.stop()
	g := New(SocketTransport{Path: path}, Options{MinBackoff: time.Millisecond, Logger: testLogger(t)})
	defer g.Close()
	_, err = g.Exec(ctxT(t), req("true"))
	var pe *wire.ProtocolError
	if !errors.Is(err, ErrUnavailable) || !errors.As(err, &pe) || pe.Code != wire.CodeUnsupportedProtocol {
		t.Errorf("Exec = %v, want ErrUnavailable with unsupported-protocol", err)
	}
}

func TestDial(t *testing.T) {
	g, _ := setup(t, Options{})
	ctx := ctxT(t)
	nc, err := g.Dial(ctx, project, 8080)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nc.Write([]byte("ping over the dialed socket")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := nc.Read(buf)
	if err != nil || string(buf[:n]) != "ping over the dialed socket" {
		t.Errorf("echo %q, %v", buf[:n], err)
	}
	nc.Close()

	_, err = g.Dial(ctx, project, 0)
	var rej *RejectedError
	if !errors.As(err, &rej) || !errors.Is(err, ErrDialFailed) {
		t.Errorf("Dial port 0 = %v, want dial-failed", err)
	}
}

func TestPingTimeout(t *testing.T) {
	var ids []string
	var mu sync.Mutex
	g, f := setup(t, Options{PingInterval: 20 * time.Millisecond, OnInterrupted: func(s []string) {
		mu.Lock()
		ids = append(ids, s...)
		mu.Unlock()
	}})
	ctx := ctxT(t)
	s, err := g.Exec(ctx, req("hang"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// Healthy pings keep the session alive.
	select {
	case <-s.Done():
		t.Fatal("session interrupted while the worker answered pings")
	case <-time.After(100 * time.Millisecond):
	}
	f.noPong.Store(true)
	select {
	case <-s.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("unanswered pings did not end the connection")
	}
	if _, err := s.Wait(); !errors.Is(err, ErrInterrupted) || !errors.Is(err, ErrPingTimeout) {
		t.Errorf("Wait = %v, want ErrInterrupted by ErrPingTimeout", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(ids, []string{s.ID}) {
		t.Errorf("OnInterrupted got %v", ids)
	}
}

func TestAnswersWorkerPing(t *testing.T) {
	client, server := seqpacketPair(t)
	g := New(NewConnTransport(client), Options{Logger: testLogger(t)})
	defer g.Close()
	sc := wire.NewConn(server)
	defer sc.Close()
	if err := wire.ServerHello(sc, "test/1"); err != nil {
		t.Fatal(err)
	}
	if err := sc.Send(&wire.Ping{ID: "w1"}); err != nil {
		t.Fatal(err)
	}
	m, _, err := sc.Recv()
	if p, ok := m.(*wire.Pong); err != nil || !ok || p.ID != "w1" {
		t.Fatalf("got %#v, %v; want pong w1", m, err)
	}
}

func seqpacketPair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conv := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "sp")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	return conv(fds[0]), conv(fds[1])
}

func TestConnTransportIsFinal(t *testing.T) {
	client, server := seqpacketPair(t)
	f := &fakeWorker{t: t, conns: map[*wire.Conn]bool{}}
	sc := wire.NewConn(server)
	f.serveConn(sc)
	defer f.stop()

	var interrupted []string
	var mu sync.Mutex
	g := New(NewConnTransport(client), Options{Logger: testLogger(t), MinBackoff: time.Millisecond,
		OnInterrupted: func(ids []string) { mu.Lock(); interrupted = ids; mu.Unlock() }})
	defer g.Close()
	ctx := ctxT(t)
	s, err := g.Exec(ctx, req("hang"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	f.dropConns()
	if _, err := s.Wait(); !errors.Is(err, ErrInterrupted) {
		t.Fatalf("Wait = %v", err)
	}
	_, err = g.Exec(ctx, req("cat"))
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, ErrTransportExhausted) {
		t.Errorf("Exec after losing the inherited connection = %v, want ErrTransportExhausted", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(interrupted, []string{s.ID}) {
		t.Errorf("OnInterrupted got %v", interrupted)
	}
}

func TestConnTransportFromFile(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[1])
	if _, err := ConnTransportFromFile(os.NewFile(uintptr(fds[0]), "stream")); err == nil {
		t.Error("a SOCK_STREAM socket was accepted as the worker connection")
	}
	a, b := seqpacketPair(t)
	defer b.Close()
	af, err := a.File()
	a.Close()
	if err != nil {
		t.Fatal(err)
	}
	tr, err := ConnTransportFromFile(af)
	if err != nil {
		t.Fatal(err)
	}
	c, err := tr.Connect(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if _, err := tr.Connect(ctxT(t)); !errors.Is(err, ErrTransportExhausted) {
		t.Errorf("second Connect = %v", err)
	}
}

func TestClose(t *testing.T) {
	var ids []string
	g, _ := setup(t, Options{OnInterrupted: func(s []string) { ids = s }})
	ctx := ctxT(t)
	s, err := g.Exec(ctx, req("hang"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	g.Close()
	g.Close()
	select {
	case <-s.Done():
	default:
		t.Fatal("Close returned before the session ended")
	}
	if _, err := s.Wait(); !errors.Is(err, ErrInterrupted) || !errors.Is(err, ErrClosed) {
		t.Errorf("Wait = %v, want ErrInterrupted and ErrClosed", err)
	}
	if !slices.Equal(ids, []string{s.ID}) {
		t.Errorf("OnInterrupted got %v", ids)
	}
	if _, err := g.Exec(ctx, req("cat")); !errors.Is(err, ErrClosed) {
		t.Errorf("Exec after Close = %v", err)
	}
}

func TestDuplicateID(t *testing.T) {
	g, _ := setup(t, Options{})
	ctx := ctxT(t)
	r := req("sleep")
	r.ID = "same"
	s, err := g.Exec(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := g.Exec(ctx, r); err == nil {
		t.Error("a second session with the same id was sent")
	}
	s.Cancel(ctx)
	s.Wait()
	s2, err := g.Exec(ctx, req("cat"))
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	s2.Stdin.Close()
	s2.Wait()
}

func TestExecFailurePathsCloseDescriptors(t *testing.T) {
	var interrupted []string
	var mu sync.Mutex
	g, f := setup(t, Options{OnInterrupted: func(ids []string) {
		mu.Lock()
		interrupted = append(interrupted, ids...)
		mu.Unlock()
	}})
	ctx := ctxT(t)
	if err := g.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	before := openFDs(t)

	// The connection is lost after the streams were attached.
	r := req("dropattach")
	r.ID = "dropped"
	_, err := g.Exec(ctx, r)
	if !errors.Is(err, ErrInterrupted) {
		t.Fatalf("Exec = %v, want ErrInterrupted", err)
	}
	mu.Lock()
	if !slices.Equal(interrupted, []string{"dropped"}) {
		t.Errorf("OnInterrupted got %v before Exec returned", interrupted)
	}
	mu.Unlock()

	// ctx ends while waiting for exec-started.
	sctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := g.Exec(sctx, req("nostart")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Exec = %v, want deadline exceeded", err)
	}
	if err := g.Ping(ctx); err != nil { // reconnected, and the cancel was handled
		t.Fatal(err)
	}
	if n := f.cancels.Load(); n != 1 {
		t.Errorf("worker got %d exec-cancel, want 1", n)
	}
	deadline := time.Now().Add(2 * time.Second)
	for openFDs(t) != before && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond) // the fake releases its copies asynchronously
	}
	if after := openFDs(t); after != before {
		t.Errorf("descriptor leak: %d before, %d after", before, after)
	}
}

func (g *Gateway) closeForTest() *Gateway { g.Close(); return g }

// TestExecWholeLifeBeforeExecLooks: accepted, started and exit read by the
// connection's reader before Exec looks at them (the hook delays Exec after
// the attach) still make a successful Exec whose Wait has the exit.
func TestExecWholeLifeBeforeExecLooks(t *testing.T) {
	testHookAfterAttach = func() { time.Sleep(20 * time.Millisecond) }
	defer func() { testHookAfterAttach = nil }()
	g, _ := setup(t, Options{})
	for i := 0; i < 10; i++ {
		s, err := g.Exec(ctxT(t), req("instant"))
		if err != nil {
			t.Fatalf("exec %d: %v", i, err)
		}
		exit, err := s.Wait()
		s.Close()
		if err != nil || exit.Code == nil || *exit.Code != 0 {
			t.Fatalf("exec %d: Wait = %+v, %v", i, exit, err)
		}
	}
}

// TestUserNeedsFeature: a session user is refused, before anything is
// sent, by a gateway whose worker did not announce the "user" feature.
func TestUserNeedsFeature(t *testing.T) {
	client, server := seqpacketPair(t)
	f := &fakeWorker{t: t, conns: map[*wire.Conn]bool{}}
	f.serveConn(wire.NewConn(server))
	defer f.stop()
	g := New(NewConnTransport(client), Options{Logger: testLogger(t)})
	defer g.Close()
	r := req("true")
	r.User = "root"
	if s, err := g.Exec(ctxT(t), r); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("Exec with a user on a worker without %q: %v, %v", wire.FeatureUser, s, err)
	}
	r.User = ""
	s, err := g.Exec(ctxT(t), r)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Wait(); err != nil {
		t.Fatal(err)
	}
}

// TestTTYNeedsFeature: a terminal is refused, before anything is sent, by a
// gateway whose worker did not announce the "tty" feature.
func TestTTYNeedsFeature(t *testing.T) {
	client, server := seqpacketPair(t)
	f := &fakeWorker{t: t, conns: map[*wire.Conn]bool{}}
	f.serveConn(wire.NewConn(server))
	defer f.stop()
	g := New(NewConnTransport(client), Options{Logger: testLogger(t)})
	defer g.Close()
	r := req("true")
	r.TTY = &TTY{Rows: 24, Cols: 80}
	if s, err := g.Exec(ctxT(t), r); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("Exec with a tty on a worker without %q: %v, %v", wire.FeatureTTY, s, err)
	}
	r.TTY = nil
	s, err := g.Exec(ctxT(t), r)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Wait(); err != nil {
		t.Fatal(err)
	}
}

// TestExecRun: to a worker that announces exec-run, Exec sends one exec-run
// frame per command (no exec-start, no exec-attach) and takes exec-started
// without an exec-accepted before it; every outcome still arrives, and no
// descriptor is left behind. The other tests run the old sequence.
func TestExecRun(t *testing.T) {
	g, f := setupRun(t, Options{}, true)
	ctx := ctxT(t)
	if err := g.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	before := openFDs(t)
	s, err := g.Exec(ctx, req("cat", "4"))
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(s.Stdin, "in")
	s.Stdin.Close()
	if out, err := io.ReadAll(s.Stdout); err != nil || string(out) != "out:in" {
		t.Errorf("stdout %q, %v", out, err)
	}
	if exit, err := s.Wait(); err != nil || exit.Code == nil || *exit.Code != 4 {
		t.Errorf("Wait = %+v, %v; want code 4", exit, err)
	}
	s.Close()

	var rej *RejectedError
	if _, err := g.Exec(ctx, req("reject")); !errors.As(err, &rej) || !errors.Is(err, ErrBadRequest) {
		t.Errorf("Exec(reject) = %v, want *RejectedError bad-argv", err)
	}
	s, err = g.Exec(ctx, req("notstarted"))
	if err != nil {
		t.Fatalf("Exec(notstarted) = %v", err)
	}
	if _, err := s.Wait(); !errors.Is(err, ErrNotStarted) {
		t.Errorf("Wait = %v, want ErrNotStarted", err)
	}
	s.Close()
	for range 5 { // the whole life read before Exec looks
		s, err := g.Exec(ctx, req("instant"))
		if err != nil {
			t.Fatalf("Exec(instant) = %v", err)
		}
		if exit, err := s.Wait(); err != nil || exit.Code == nil || *exit.Code != 0 {
			t.Errorf("Wait = %+v, %v", exit, err)
		}
		s.Close()
	}
	s, err = g.Exec(ctx, req("sleep"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Cancel(ctx); err != nil {
		t.Fatal(err)
	}
	if exit, err := s.Wait(); err != nil || exit.Signal != "SIGKILL" {
		t.Errorf("Wait after Cancel = %+v, %v", exit, err)
	}
	s.Close()

	if n := f.runs.Load(); n != 9 {
		t.Errorf("worker got %d exec-run frames, want 9", n)
	}
	if n := f.startAttach.Load(); n != 0 {
		t.Errorf("worker got %d exec-start or exec-attach frames, want none", n)
	}
	if after := settledFDs(t, before); after != before {
		t.Errorf("descriptor leak: %d before, %d after", before, after)
	}
}

// TestStdinClosedUnwritten: closing a session's stdin that was never
// written (its descriptor not yet in the poller) delivers EOF to the
// command, and writing after the session was released fails.
func TestStdinClosedUnwritten(t *testing.T) {
	g, _ := setup(t, Options{})
	ctx := ctxT(t)
	s, err := g.Exec(ctx, req("cat"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Stdin.Close(); err != nil {
		t.Fatal(err)
	}
	if out, err := io.ReadAll(s.Stdout); err != nil || string(out) != "out:" {
		t.Errorf("stdout %q, %v; want the command to have read EOF at once", out, err)
	}
	if exit, err := s.Wait(); err != nil || exit.Code == nil || *exit.Code != 0 {
		t.Errorf("Wait = %+v, %v", exit, err)
	}
	s.Close()
	if _, err := s.Stdin.Write([]byte("late")); err == nil {
		t.Error("Write on a released stdin succeeded")
	}
	if err := s.Stdin.Close(); err == nil {
		t.Error("Close on a released stdin succeeded")
	}
}
