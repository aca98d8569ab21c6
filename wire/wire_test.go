package wire

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/corral-sandbox/corral/internal/pdeath.spawner"))
}

// pair returns two connected protocol connections over a real
// SOCK_SEQPACKET socketpair.
func pair(t testing.TB) (*Conn, *Conn) {
	t.Helper()
	a, b := rawPair(t)
	return NewConn(a), NewConn(b)
}

func rawPair(t testing.TB) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conv := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "seqpacket")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	return conv(fds[0]), conv(fds[1])
}

// openFDs counts this process's open descriptors.
func openFDs(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents) - 1 // the directory being read
}

// checkNoLeak records the descriptor count and, at cleanup, fails the test
// if it grew. Call it after warming up the poller.
func checkNoLeak(t *testing.T) {
	t.Helper()
	a, b := pair(t) // make sure epoll and friends exist before counting
	a.Close()
	b.Close()
	before := openFDs(t)
	t.Cleanup(func() {
		if after := openFDs(t); after != before {
			t.Errorf("descriptor leak: %d open before, %d after", before, after)
		}
	})
}

func pipes(t testing.TB, n int) (r, w []*os.File) {
	t.Helper()
	for range n {
		pr, pw, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		r = append(r, pr)
		w = append(w, pw)
	}
	return r, w
}

func closeAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

func intp(i int) *int { return &i }

// allMessages has one valid instance of every message type.
func allMessages() []Message {
	return []Message{
		&Hello{Protocol: 2, Worker: "corral/test"},
		&Hello{Protocol: 2},
		&Error{Code: CodeBadFrame, Message: "nope"},
		&Error{ID: "d1", Code: CodeDialFailed, Message: "connection refused"},
		&Ping{ID: "p1"},
		&Ping{},
		&Pong{ID: "p1"},
		&ExecStart{ID: "s1", Project: Project{ID: 7, Workspace: "/srv/p/7"}, Account: 3, Lease: "L1",
			Argv: []string{"sh", "-c", "echo hi"}, Cwd: "/workspace", Env: map[string]string{"A": "b", "PATH": "/bin"}},
		&ExecStart{ID: "s2", Project: Project{ID: 1, Workspace: "/w"}, Argv: []string{"true"}, Cwd: "/workspace"},
		&ExecAccepted{ID: "s1"},
		&ExecRejected{ID: "s1", Code: CodeBadCwd, Message: "cwd escapes"},
		&ExecAttach{ID: "s1"},
		&ExecStarted{ID: "s1"},
		&ExecExit{ID: "s1", Code: intp(0)},
		&ExecExit{ID: "s1", Code: intp(3)},
		&ExecExit{ID: "s1", Signal: "SIGKILL"},
		&ExecExit{ID: "s1", NotStarted: true, Message: "exec: no such file"},
		&ExecCancel{ID: "s1"},
		&NetDial{ID: "d1", Project: Project{ID: 7, Workspace: "/srv/p/7"}, Port: 8080},
		&NetDialed{ID: "d1"},
		&NetListen{ID: "l1", Project: Project{ID: 7, Workspace: "/srv/p/7"}, Port: 3128},
		&NetListening{ID: "l1"},
		&MachineReset{ID: "r1", Project: Project{ID: 7, Workspace: "/srv/p/7"}},
		&MachineResetDone{ID: "r1"},
		&ExecStart{ID: "t1", Project: Project{ID: 1, Workspace: "/w"}, Argv: []string{"sh"}, Cwd: "/workspace", TTY: &TTY{Rows: 24, Cols: 80}},
		&ExecTTY{ID: "t1"},
		&ExecSignal{ID: "s1", Signal: "SIGTERM"},
		&ExecRun{ID: "r1", Project: Project{ID: 7, Workspace: "/srv/p/7"}, Account: 3, Lease: "L1",
			Argv: []string{"true"}, Cwd: "/workspace", Env: map[string]string{"PATH": "/bin"}},
		&ExecRun{ID: "r2", Project: Project{ID: 1, Workspace: "/w"}, Argv: []string{"sh"}, Cwd: "/workspace", TTY: &TTY{Rows: 24, Cols: 80}},
		&FileRequest{ID: "f1", Project: Project{ID: 7, Workspace: "/w"}, User: "1000", Op: OpList, Path: "/workspace", Depth: 2, Limit: 10},
		&FileRequest{ID: "f2", Project: Project{ID: 7, Workspace: "/w"}, Op: OpRename, Path: "a", To: "b"},
		&FileWatch{ID: "f3", Project: Project{ID: 7, Workspace: "/w"}, Path: "/workspace/d", Recursive: true},
		&FileEntries{ID: "f1", Entries: []FileStat{{Name: "x", Path: "/workspace/x", Type: "file", Size: 3, Mode: 0o644, MTime: 1}}},
		&FileOpened{ID: "f4", Stat: &FileStat{Name: "x", Path: "/workspace/x", Type: "file"}},
		&FileOpened{ID: "f5", Tmp: "/workspace/.corral-put-1"},
		&FileResult{ID: "f1", Truncated: true},
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	for _, m := range allMessages() {
		t.Run(m.Type(), func(t *testing.T) {
			b, err := Encode(m)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(string(b), `{"type":"`+m.Type()+`"`) {
				t.Errorf("frame %s does not start with its type", b)
			}
			if n := FDCount(m); n > 0 && !strings.Contains(string(b), `"fds":`) {
				t.Errorf("frame %s lacks fds", b)
			}
			got, err := Decode(b, FDCount(m))
			if err != nil {
				t.Fatalf("Decode(%s): %v", b, err)
			}
			if !reflect.DeepEqual(got, m) {
				t.Errorf("round trip: got %#v, want %#v", got, m)
			}
			// Values encode like pointers.
			vb, err := Encode(reflect.ValueOf(m).Elem().Interface().(Message))
			if err != nil || string(vb) != string(b) {
				t.Errorf("value encoding %s, %v; want %s", vb, err, b)
			}
		})
	}
}

func TestPinnedFrames(t *testing.T) {
	// The exact bytes other programs see.
	tests := []struct {
		m    Message
		want string
	}{
		{&Hello{Protocol: 2}, `{"type":"hello","protocol":2}`},
		{&ExecAttach{ID: "x"}, `{"type":"exec-attach","fds":3,"id":"x"}`},
		{&ExecRun{ID: "x", Argv: []string{"true"}}, `{"type":"exec-run","fds":3,"id":"x","project":{"id":0,"workspace":""},"account":0,"lease":"","argv":["true"],"cwd":""}`},
		{&NetDialed{ID: "x"}, `{"type":"net-dialed","fds":1,"id":"x"}`},
		{&NetListen{ID: "x", Project: Project{ID: 7, Workspace: "/w"}, Port: 3128}, `{"type":"net-listen","id":"x","project":{"id":7,"workspace":"/w"},"port":3128}`},
		{&NetListening{ID: "x"}, `{"type":"net-listening","fds":1,"id":"x"}`},
		{&ExecTTY{ID: "x"}, `{"type":"exec-tty","fds":1,"id":"x"}`},
		{&ExecStart{ID: "x", Argv: []string{"sh"}, TTY: &TTY{Rows: 24, Cols: 80}}, `{"type":"exec-start","id":"x","project":{"id":0,"workspace":""},"account":0,"lease":"","argv":["sh"],"cwd":"","tty":{"rows":24,"cols":80}}`},
		{&ExecExit{ID: "x", Code: intp(0)}, `{"type":"exec-exit","id":"x","code":0}`},
		{&ExecExit{ID: "x", NotStarted: true}, `{"type":"exec-exit","id":"x","notStarted":true}`},
		{&Ping{}, `{"type":"ping"}`},
		{&ExecSignal{ID: "x", Signal: "SIGTERM"}, `{"type":"exec-signal","id":"x","signal":"SIGTERM"}`},
		{&MachineReset{ID: "r", Project: Project{ID: 7, Workspace: "/w"}}, `{"type":"machine-reset","id":"r","project":{"id":7,"workspace":"/w"}}`},
		{&MachineResetDone{ID: "r"}, `{"type":"machine-reset-done","id":"r"}`},
		{&FileOpened{ID: "f", Tmp: "/t"}, `{"type":"file-opened","fds":1,"id":"f","tmp":"/t"}`},
		{&FileWatch{ID: "f", Path: "/p"}, `{"type":"file-watch","fds":1,"id":"f","project":{"id":0,"workspace":""},"path":"/p"}`},
		{&FileRequest{ID: "f", Op: "stat", Path: "x"}, `{"type":"file-request","id":"f","project":{"id":0,"workspace":""},"op":"stat","path":"x"}`},
		{&Error{Code: "unsupported-protocol", Message: "m"}, `{"type":"error","code":"unsupported-protocol","message":"m"}`},
	}
	for _, tt := range tests {
		b, err := Encode(tt.m)
		if err != nil || string(b) != tt.want {
			t.Errorf("Encode(%#v) = %s, %v; want %s", tt.m, b, err, tt.want)
		}
	}
}

func TestDecodeErrors(t *testing.T) {
	big := `{"type":"ping","id":"` + strings.Repeat("x", MaxFrame) + `"}`
	tests := []struct {
		name  string
		frame string
		nfds  int
		code  string
	}{
		{"empty", ``, 0, CodeBadFrame},
		{"truncated", `{"type":"hello","proto`, 0, CodeBadFrame},
		{"garbage", `hello`, 0, CodeBadFrame},
		{"array", `[1,2]`, 0, CodeBadFrame},
		{"null", `null`, 0, CodeBadFrame},
		{"string", `"hello"`, 0, CodeBadFrame},
		{"trailing", `{"type":"ping"} {}`, 0, CodeBadFrame},
		{"missing type", `{"protocol":2}`, 0, CodeBadFrame},
		{"type not string", `{"type":2}`, 0, CodeBadFrame},
		{"type null", `{"type":null}`, 0, CodeBadFrame},
		{"unknown type", `{"type":"exec-frobnicate","id":"x"}`, 0, CodeUnknownType},
		{"too large", big, 0, CodeTooLarge},
		{"attach fewer fds", `{"type":"exec-attach","fds":3,"id":"x"}`, 2, CodeFDMismatch},
		{"attach more fds", `{"type":"exec-attach","fds":3,"id":"x"}`, 4, CodeFDMismatch},
		{"attach undeclared", `{"type":"exec-attach","id":"x"}`, 3, CodeFDMismatch},
		{"attach declares 2", `{"type":"exec-attach","fds":2,"id":"x"}`, 2, CodeFDMismatch},
		{"hello with fd", `{"type":"hello","protocol":2}`, 1, CodeFDMismatch},
		{"hello declares fd", `{"type":"hello","fds":1,"protocol":2}`, 1, CodeFDMismatch},
		{"fds negative", `{"type":"net-dialed","fds":-1,"id":"x"}`, 0, CodeFDMismatch},
		{"fds string", `{"type":"net-dialed","fds":"1","id":"x"}`, 1, CodeFDMismatch},
		{"fds null", `{"type":"net-dialed","fds":null,"id":"x"}`, 1, CodeFDMismatch},
		{"net-listening without fd", `{"type":"net-listening","fds":1,"id":"x"}`, 0, CodeFDMismatch},
		{"net-listen with fd", `{"type":"net-listen","fds":1,"id":"x","port":1}`, 1, CodeFDMismatch},
		{"net-listening empty id", `{"type":"net-listening","fds":1}`, 1, CodeBadField},
		{"tty without fd", `{"type":"exec-tty","fds":1,"id":"x"}`, 0, CodeFDMismatch},
		{"tty undeclared", `{"type":"exec-tty","id":"x"}`, 1, CodeFDMismatch},
		{"tty rows too big", `{"type":"exec-start","id":"x","argv":["sh"],"tty":{"rows":65536,"cols":80}}`, 0, CodeBadField},
		{"tty rows negative", `{"type":"exec-start","id":"x","argv":["sh"],"tty":{"rows":-1,"cols":80}}`, 0, CodeBadField},
		{"argv not array", `{"type":"exec-start","id":"x","argv":"sh"}`, 0, CodeBadField},
		{"protocol string", `{"type":"hello","protocol":"2"}`, 0, CodeBadField},
		{"empty id", `{"type":"exec-cancel","id":""}`, 0, CodeBadField},
		{"no id", `{"type":"exec-started"}`, 0, CodeBadField},
		{"exit no outcome", `{"type":"exec-exit","id":"x"}`, 0, CodeBadField},
		{"exit two outcomes", `{"type":"exec-exit","id":"x","code":1,"signal":"SIGTERM"}`, 0, CodeBadField},
		{"exit notStarted and code", `{"type":"exec-exit","id":"x","code":0,"notStarted":true}`, 0, CodeBadField},
		{"rejected no code", `{"type":"exec-rejected","id":"x"}`, 0, CodeBadField},
		{"error no code", `{"type":"error","message":"x"}`, 0, CodeBadField},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := Decode([]byte(tt.frame), tt.nfds)
			var pe *ProtocolError
			if !errors.As(err, &pe) {
				t.Fatalf("Decode = %#v, %v; want *ProtocolError", m, err)
			}
			if pe.Code != tt.code {
				t.Errorf("code %q (%v), want %q", pe.Code, err, tt.code)
			}
			if m != nil {
				t.Errorf("message %#v returned with error", m)
			}
		})
	}
}

func TestDecodeIgnoresUnknownMembers(t *testing.T) {
	m, err := Decode([]byte(`{"type":"hello","protocol":2,"worker":"other/1","features":["x"],"later":{"a":1}}`), 0)
	if err != nil {
		t.Fatal(err)
	}
	if h := m.(*Hello); h.Protocol != 2 || h.Worker != "other/1" || !h.Has("x") || h.Has(FeatureUser) {
		t.Errorf("got %#v", h)
	}
}

// The announced extensions: their members decode, and frames without them
// encode exactly as before (the pinned bytes stay valid for every worker).
func TestFeatureMembers(t *testing.T) {
	m, err := Decode([]byte(`{"type":"exec-start","id":"1","project":{"id":3,"workspace":"/w","image":"deb","limits":{"memory":1024,"cpuMillis":500}},"account":1,"lease":"l","argv":["true"],"cwd":"","user":"root"}`), 0)
	if err != nil {
		t.Fatal(err)
	}
	s := m.(*ExecStart)
	if s.User != "root" || s.Project.Image != "deb" || s.Project.Limits == nil || s.Project.Limits.Memory != 1024 || s.Project.Limits.CPU != 500 {
		t.Errorf("got %#v", s)
	}
	b, err := Encode(&ExecStart{ID: "1", Project: Project{ID: 3, Workspace: "/w"}, Argv: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"type":"exec-start","id":"1","project":{"id":3,"workspace":"/w"},"account":0,"lease":"","argv":["true"],"cwd":""}`; string(b) != want {
		t.Errorf("encoded\n%s\nwant\n%s", b, want)
	}
	m, err = Decode([]byte(`{"type":"exec-exit","id":"1","signal":"SIGKILL","oomKilled":true}`), 0)
	if err != nil || !m.(*ExecExit).OOMKilled {
		t.Errorf("oomKilled exit: %v %#v", err, m)
	}
	if _, err := Decode([]byte(`{"type":"exec-exit","id":"1","code":0,"oomKilled":true}`), 0); err == nil {
		t.Error("oomKilled without signal accepted")
	}
}

func TestEncodeErrors(t *testing.T) {
	var nilStart *ExecStart
	tests := []struct {
		name string
		m    Message
		code string
	}{
		{"nil", nil, CodeBadFrame},
		{"nil pointer", nilStart, CodeBadFrame},
		{"too large", &Ping{ID: strings.Repeat("x", MaxFrame)}, CodeTooLarge},
		{"empty id", &ExecAccepted{}, CodeBadField},
		{"exit without outcome", &ExecExit{ID: "x"}, CodeBadField},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Encode(tt.m)
			var pe *ProtocolError
			if !errors.As(err, &pe) || pe.Code != tt.code {
				t.Errorf("Encode err = %v, want code %q", err, tt.code)
			}
		})
	}
}

func TestConnRoundTripEveryMessage(t *testing.T) {
	checkNoLeak(t)
	a, b := pair(t)
	defer a.Close()
	defer b.Close()
	for _, m := range allMessages() {
		t.Run(m.Type(), func(t *testing.T) {
			r, w := pipes(t, FDCount(m))
			defer closeAll(r)
			err := a.Send(m, w...)
			closeAll(w)
			if err != nil {
				t.Fatal(err)
			}
			got, files, err := b.Recv()
			if err != nil {
				t.Fatal(err)
			}
			defer closeAll(files)
			if !reflect.DeepEqual(got, m) {
				t.Errorf("got %#v, want %#v", got, m)
			}
			if len(files) != FDCount(m) {
				t.Fatalf("%d files, want %d", len(files), FDCount(m))
			}
			// Each received descriptor is the write end of the
			// matching pipe, and close-on-exec.
			for i, f := range files {
				flags, err := unix.FcntlInt(f.Fd(), unix.F_GETFD, 0)
				if err != nil || flags&unix.FD_CLOEXEC == 0 {
					t.Errorf("fd %d: flags %#x, %v: not close-on-exec", i, flags, err)
				}
				msg := []byte{'0' + byte(i)}
				if _, err := f.Write(msg); err != nil {
					t.Fatal(err)
				}
				f.Close()
				buf := make([]byte, 8)
				n, err := r[i].Read(buf)
				if err != nil || string(buf[:n]) != string(msg) {
					t.Errorf("pipe %d read %q, %v; want %q", i, buf[:n], err, msg)
				}
				// Only our copy of the write end existed: EOF now.
				if n, err := r[i].Read(buf); err != io.EOF {
					t.Errorf("pipe %d: read %d, %v after close; want EOF", i, n, err)
				}
			}
		})
	}
}

func TestSendWrongFileCount(t *testing.T) {
	a, b := pair(t)
	defer a.Close()
	defer b.Close()
	r, w := pipes(t, 2)
	defer closeAll(r)
	defer closeAll(w)
	if err := a.Send(&ExecAttach{ID: "x"}, w...); err == nil {
		t.Error("Send of exec-attach with 2 files succeeded")
	}
	if err := a.Send(&Ping{}, w[0]); err == nil {
		t.Error("Send of ping with a file succeeded")
	}
}

// sendRaw sends one packet with arbitrary bytes and n fresh pipe write ends.
// It returns the read ends; the write ends are closed here.
func sendRaw(t testing.TB, c *net.UnixConn, b []byte, n int) []*os.File {
	t.Helper()
	r, w := pipes(t, n)
	defer closeAll(w)
	var oob []byte
	if n > 0 {
		fds := make([]int, n)
		for i, f := range w {
			fds[i] = int(f.Fd())
		}
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := c.WriteMsgUnix(b, oob, nil); err != nil {
		t.Fatal(err)
	}
	return r
}

// assertClosedRemotely checks that no write end of the pipes whose read ends
// are r is open anywhere: reading gives EOF at once.
func assertClosedRemotely(t *testing.T, r []*os.File) {
	t.Helper()
	for i, f := range r {
		f.SetReadDeadline(time.Now().Add(2 * time.Second))
		if n, err := f.Read(make([]byte, 1)); err != io.EOF {
			t.Errorf("pipe %d: read %d, %v; want EOF (a received descriptor stayed open)", i, n, err)
		}
	}
}

func TestRecvProtocolErrorsCloseDescriptors(t *testing.T) {
	tests := []struct {
		name  string
		frame string
		nfds  int
		code  string
	}{
		{"oversized", `{"type":"exec-attach","fds":3,"id":"` + strings.Repeat("x", MaxFrame) + `"}`, 3, CodeTooLarge},
		{"fewer fds", `{"type":"exec-attach","fds":3,"id":"x"}`, 2, CodeFDMismatch},
		{"more fds", `{"type":"exec-attach","fds":3,"id":"x"}`, 4, CodeFDMismatch},
		{"fds on hello", `{"type":"hello","protocol":2}`, 1, CodeFDMismatch},
		{"far too many fds", `{"type":"exec-attach","fds":3,"id":"x"}`, 40, CodeFDMismatch},
		{"truncated json", `{"type":"exec-attach","fds":3,"id":"x`, 3, CodeBadFrame},
		{"bad json", `{"type":"exec-attach",,}`, 3, CodeBadFrame},
		{"unknown type", `{"type":"exec-teleport","fds":3,"id":"x"}`, 3, CodeUnknownType},
		{"bad field", `{"type":"exec-attach","fds":3,"id":7}`, 3, CodeBadField},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkNoLeak(t)
			ua, ub := rawPair(t)
			b := NewConn(ub)
			defer ua.Close()
			defer b.Close()
			r := sendRaw(t, ua, []byte(tt.frame), tt.nfds)
			defer closeAll(r)
			m, files, err := b.Recv()
			var pe *ProtocolError
			if !errors.As(err, &pe) || pe.Code != tt.code {
				t.Fatalf("Recv = %v, %d files, %v; want code %q", m, len(files), err, tt.code)
			}
			if m != nil || files != nil {
				t.Errorf("Recv returned %v, %v with an error", m, files)
			}
			assertClosedRemotely(t, r)
			// The bad packet was consumed whole: the next frame is intact.
			if err := NewConn(ua).Send(&Ping{ID: "next"}); err != nil {
				t.Fatal(err)
			}
			m, _, err = b.Recv()
			if p, ok := m.(*Ping); err != nil || !ok || p.ID != "next" {
				t.Errorf("next Recv = %#v, %v; want ping next", m, err)
			}
		})
	}
}

func TestRecvMaxFrameExactly(t *testing.T) {
	a, b := pair(t)
	defer a.Close()
	defer b.Close()
	prefix := `{"type":"ping","id":"`
	id := strings.Repeat("y", MaxFrame-len(prefix)-2)
	m := &Ping{ID: id}
	if err := a.Send(m); err != nil {
		t.Fatal(err)
	}
	got, _, err := b.Recv()
	if err != nil || got.(*Ping).ID != id {
		t.Fatalf("Recv of a %d-byte frame: %v", MaxFrame, err)
	}
}

func TestRecvEOFAndClose(t *testing.T) {
	a, b := pair(t)
	a.Close()
	if _, _, err := b.Recv(); err != io.EOF {
		t.Errorf("Recv after peer close = %v, want io.EOF", err)
	}
	b.Close()

	a, b = pair(t)
	defer a.Close()
	done := make(chan error, 1)
	go func() { _, _, err := b.Recv(); done <- err }()
	time.Sleep(20 * time.Millisecond)
	b.Close()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("Recv after Close = %v, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not unblock Recv")
	}
}

func TestHandshake(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "w.sock")
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 || fi.Mode().Type() != os.ModeSocket {
		t.Fatalf("socket mode %v, %v; want 0600 socket", fi.Mode(), err)
	}
	srvErr := make(chan error, 1)
	go func() {
		uc, err := l.AcceptUnix()
		if err != nil {
			srvErr <- err
			return
		}
		c := NewConn(uc)
		defer c.Close()
		if err := ServerHello(c, "corral/test"); err != nil {
			srvErr <- err
			return
		}
		m, _, err := c.Recv()
		if err == nil {
			err = c.Send(&Pong{ID: m.(*Ping).ID})
		}
		srvErr <- err
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	h, err := ClientHello(c)
	if err != nil || h.Protocol != 2 || h.Worker != "corral/test" {
		t.Fatalf("ClientHello = %#v, %v", h, err)
	}
	if err := c.Send(&Ping{ID: "1"}); err != nil {
		t.Fatal(err)
	}
	if m, _, err := c.Recv(); err != nil || m.(*Pong).ID != "1" {
		t.Fatalf("pong: %#v, %v", m, err)
	}
	if err := <-srvErr; err != nil {
		t.Fatal(err)
	}
}

func TestServerHelloRefuses(t *testing.T) {
	tests := []struct {
		name  string
		first Message
		raw   string
		code  string
	}{
		{"protocol 1", &Hello{Protocol: 1}, "", CodeUnsupportedProtocol},
		{"protocol 3", &Hello{Protocol: 3}, "", CodeUnsupportedProtocol},
		{"no protocol", nil, `{"type":"hello"}`, CodeUnsupportedProtocol},
		{"not hello", &Ping{}, "", CodeBadFrame},
		{"bad json", nil, `{"type":`, CodeBadFrame},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client, server := pair(t)
			defer client.Close()
			defer server.Close()
			if tt.first != nil {
				if err := client.Send(tt.first); err != nil {
					t.Fatal(err)
				}
			} else if _, _, err := client.UnixConn().WriteMsgUnix([]byte(tt.raw), nil, nil); err != nil {
				t.Fatal(err)
			}
			err := ServerHello(server, "corral/test")
			var pe *ProtocolError
			if !errors.As(err, &pe) || pe.Code != tt.code {
				t.Fatalf("ServerHello = %v, want code %q", err, tt.code)
			}
			m, _, err := client.Recv()
			if e, ok := m.(*Error); err != nil || !ok || e.Code != tt.code || e.ID != "" {
				t.Errorf("client got %#v, %v; want error frame %q", m, err, tt.code)
			}
		})
	}
}

func TestClientHelloRefused(t *testing.T) {
	for _, tt := range []struct {
		name  string
		reply Message
		code  string
	}{
		{"error frame", &Error{Code: CodeUnsupportedProtocol, Message: "no"}, CodeUnsupportedProtocol},
		{"other protocol", &Hello{Protocol: 3}, CodeUnsupportedProtocol},
		{"not hello", &Pong{}, CodeBadFrame},
	} {
		t.Run(tt.name, func(t *testing.T) {
			client, server := pair(t)
			defer client.Close()
			defer server.Close()
			if err := server.Send(tt.reply); err != nil {
				t.Fatal(err)
			}
			_, err := ClientHello(client)
			var pe *ProtocolError
			if !errors.As(err, &pe) || pe.Code != tt.code {
				t.Fatalf("ClientHello = %v, want code %q", err, tt.code)
			}
			if m, _, err := server.Recv(); err != nil || m.(*Hello).Protocol != 2 {
				t.Errorf("server got %#v, %v; want hello 2", m, err)
			}
		})
	}
}

func TestListenStaleAndNonSocket(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "s")
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("stale socket not left behind: %v", err)
	}
	l, err = Listen(path)
	if err != nil {
		t.Fatalf("Listen over stale socket: %v", err)
	}
	l.Close()

	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(file); err == nil {
		t.Fatal("Listen replaced a regular file")
	}
	if b, _ := os.ReadFile(file); string(b) != "keep" {
		t.Error("regular file was modified")
	}
}

func TestConcurrentSend(t *testing.T) {
	a, b := pair(t)
	defer a.Close()
	defer b.Close()
	const n = 200
	errc := make(chan error, 4)
	for g := range 4 {
		go func() {
			for i := range n / 4 {
				if err := a.Send(&Ping{ID: string(rune('a'+g)) + "-" + string(rune('0'+i%10))}); err != nil {
					errc <- err
					return
				}
			}
			errc <- nil
		}()
	}
	for range n {
		if _, _, err := b.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	for range 4 {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
}

// TestSendTimeout: a frame that fits is sent at once; one that finds the
// peer's buffer full waits at most the timeout, fails with
// os.ErrDeadlineExceeded and is not sent; once the peer reads, sending
// works again (no deadline is left behind).
func TestSendTimeout(t *testing.T) {
	a, b := pair(t)
	defer a.Close()
	defer b.Close()
	big := &Error{Code: "c", Message: strings.Repeat("x", 32<<10)}
	sent := 0
	for {
		err := a.SendTimeout(50*time.Millisecond, big)
		if err == nil {
			sent++
			continue
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("SendTimeout on a full socket: %v", err)
		}
		break
	}
	if sent == 0 {
		t.Fatal("nothing fitted into an empty socket")
	}
	for range sent {
		if _, _, err := b.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(60 * time.Millisecond) // past the deadline of the failed send
	if err := a.SendTimeout(50*time.Millisecond, &Ping{ID: "after"}); err != nil {
		t.Fatalf("SendTimeout after the peer read: %v", err)
	}
	if err := a.Send(&Ping{ID: "plain"}); err != nil {
		t.Fatalf("Send after SendTimeout: %v", err)
	}
	for _, want := range []string{"after", "plain"} {
		m, _, err := b.Recv()
		if p, ok := m.(*Ping); err != nil || !ok || p.ID != want {
			t.Fatalf("Recv = %#v, %v; want ping %s (the failed frame must not have been sent)", m, err, want)
		}
	}
}

// TestSendFDsAndRecvFDs: descriptors given as numbers arrive as the
// packet's descriptors, in order; a wrong count sends nothing.
func TestSendFDsAndRecvFDs(t *testing.T) {
	a, b := pair(t)
	defer a.Close()
	defer b.Close()
	r, w := pipes(t, 3)
	defer closeAll(r)
	if err := a.SendFDs(&ExecAttach{ID: "x"}, int(w[0].Fd()), int(w[1].Fd())); err == nil {
		t.Fatal("SendFDs with two descriptors for exec-attach succeeded")
	}
	if err := a.SendFDs(&ExecAttach{ID: "x"}, int(w[0].Fd()), int(w[1].Fd()), int(w[2].Fd())); err != nil {
		t.Fatal(err)
	}
	closeAll(w)
	m, fds, err := b.RecvFDs()
	if err != nil {
		t.Fatal(err)
	}
	if at, ok := m.(*ExecAttach); !ok || at.ID != "x" || len(fds) != 3 {
		t.Fatalf("RecvFDs = %#v, %v", m, fds)
	}
	for i, fd := range fds {
		if _, err := unix.Write(fd, []byte{byte('a' + i)}); err != nil {
			t.Fatal(err)
		}
		unix.Close(fd)
		buf := make([]byte, 2)
		if n, _ := r[i].Read(buf); n != 1 || buf[0] != byte('a'+i) {
			t.Errorf("descriptor %d does not reach pipe %d: %q", i, i, buf[:n])
		}
	}
}
