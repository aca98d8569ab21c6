package ctl

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"os"
	"reflect"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestRoundTripWithDescriptors(t *testing.T) {
	c, initEnd, err := Pair()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	e := NewEndpoint(int(initEnd.Fd()))
	defer initEnd.Close()

	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	code := 3
	if err := c.Send(&Msg{Op: OpStart, SID: 7, Argv: []string{"a", "b"}, Code: &code}, w, w, w); err != nil {
		t.Fatal(err)
	}
	w.Close()
	m, fds, err := e.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if m.Op != OpStart || m.SID != 7 || len(m.Argv) != 2 || *m.Code != 3 || len(fds) != 3 {
		t.Fatalf("%+v %d descriptors", m, len(fds))
	}
	flags, err := unix.FcntlInt(uintptr(fds[0]), unix.F_GETFD, 0)
	if err != nil || flags&unix.FD_CLOEXEC == 0 {
		t.Errorf("received descriptor not close-on-exec: %v", err)
	}
	for _, fd := range fds {
		unix.Close(fd)
	}
	if n, err := r.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("pipe still open: %v", err)
	}
	if _, _, err := e.TryRecv(); !errors.Is(err, ErrWouldBlock) {
		t.Fatalf("TryRecv on an empty channel: %v", err)
	}
	if err := e.Send(&Msg{Op: OpExit, SID: 7}); err != nil {
		t.Fatal(err)
	}
	if m, _, err := c.RecvTimeout(time.Second); err != nil || m.Op != OpExit {
		t.Fatalf("%+v %v", m, err)
	}
	if _, _, err := c.RecvTimeout(10 * time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("timeout: %v", err)
	}
}

func TestMismatchClosesDescriptors(t *testing.T) {
	c, initEnd, err := Pair()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	defer initEnd.Close()
	if err := c.Send(&Msg{Op: OpKill}, os.Stdin); !errors.Is(err, ErrFDMismatch) {
		t.Fatalf("Send with a stray descriptor: %v", err)
	}
	// A peer that sends descriptors with a message that carries none.
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	exit, _, err := encode(&Msg{Op: OpExit, SID: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Sendmsg(int(initEnd.Fd()), exit, unix.UnixRights(int(w.Fd())), nil, 0); err != nil {
		t.Fatal(err)
	}
	w.Close()
	if _, _, err := c.Recv(); !errors.Is(err, ErrFDMismatch) {
		t.Fatalf("Recv: %v", err)
	}
	if n, err := r.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("descriptor of a rejected packet left open: %v", err)
	}
}

func TestCloseUnblocksRecv(t *testing.T) {
	c, initEnd, err := Pair()
	if err != nil {
		t.Fatal(err)
	}
	defer initEnd.Close()
	done := make(chan error, 1)
	go func() { _, _, err := c.Recv(); done <- err }()
	time.Sleep(10 * time.Millisecond)
	c.Close()
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Fatalf("Recv after Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := c.Send(&Msg{Op: OpKill}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Send after Close: %v", err)
	}
}

func TestPeerCloseIsErrClosed(t *testing.T) {
	c, initEnd, err := Pair()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	initEnd.Close()
	if _, _, err := c.Recv(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Recv after the peer closed: %v", err)
	}
}

func TestEncodingRoundTrip(t *testing.T) {
	code, neg := 0, -129
	for _, m := range []*Msg{
		{Op: OpReady},
		{Op: OpStart, SID: 1 << 40, Argv: []string{"sh", "-c", "", "\xff\x00é"}, Env: []string{"PATH=/bin", "A="}, Cwd: "/workspace"},
		{Op: OpExit, SID: 3, Code: &code},
		{Op: OpExit, SID: 4, Code: &neg},
		{Op: OpExit, SID: 5, Signal: "SIGKILL"},
		{Op: OpNotStarted, SID: 6, Message: "exec \"x\": not found"},
		{Op: OpConfig, Config: &Config{Hostname: "h", UID: 1000, GID: 1000, NProc: 5, DefaultUser: "root", Layers: 2, HostBinds: []string{"/usr"}, GuestWorkspace: "/w", GuestHome: "/h"}},
		{Op: OpConfig, Config: &Config{Hostname: "h", DefaultUser: "app:staff", UID: 1000, GID: 1000}},
		{Op: OpLookup, SID: 8, User: "nobody"},
		{Op: OpLookedUp, SID: 8, Cred: &Cred{UID: 65534, GID: 65534, Groups: []uint32{1, 1 << 31}, Home: "/nonexistent"}},
		{Op: OpLookedUp, SID: 9, Message: "unknown user \"x\""},
		{Op: OpStart, SID: 10, Argv: []string{"id"}, Cwd: "/workspace", Cred: &Cred{UID: 0, GID: 0, Home: "/root"}},
		{Op: OpStart, SID: 11, Argv: []string{"id"}, Cwd: "/workspace", User: "root"},
	} {
		b, _, err := encode(m, make([]int, FDCount(m)))
		if err != nil {
			t.Fatalf("encode %+v: %v", m, err)
		}
		got, err := unmarshal(b)
		if err != nil {
			t.Fatalf("decode %+v: %v", m, err)
		}
		if !reflect.DeepEqual(got, m) {
			t.Errorf("round trip: got %+v, want %+v", got, m)
		}
		// Every strict prefix and any trailing byte is refused.
		for i := range b {
			if _, err := unmarshal(b[:i]); err == nil {
				t.Errorf("%s: prefix of %d bytes accepted", m.Op, i)
			}
		}
		if _, err := unmarshal(append(b, 0)); err == nil {
			t.Errorf("%s: trailing byte accepted", m.Op)
		}
	}
	if _, _, err := encode(&Msg{Op: "bogus"}, nil); err == nil {
		t.Error("unknown op encoded")
	}
	for _, b := range [][]byte{nil, {0, 0, 0}, {11, 0, 0}, {byte(len(opNames)), 0, 0}, {2, 0x80, 0},
		{9, hasUser, 0, 0, 0, 0, 0, 0, 0},                                      // an empty user
		{10, hasCred, 0, 0, 0, 0, 0, 0, 0x80, 0x80, 0x80, 0x80, 0x10, 0, 0, 0}, // a uid above 2^32-1
	} {
		if _, err := unmarshal(b); err == nil {
			t.Errorf("%v accepted", b)
		}
	}
}

// FuzzUnmarshal: the worker decodes whatever a machine's init sends; no
// packet makes it panic or over-allocate, and whatever it accepts is a
// message that encodes and decodes back to itself.
func FuzzUnmarshal(f *testing.F) {
	code := 7
	for _, m := range []*Msg{
		{Op: OpReady},
		{Op: OpStart, SID: 9, Argv: []string{"sh", "-c", "x"}, Env: []string{"A=b"}, Cwd: "/workspace"},
		{Op: OpExit, SID: 3, Code: &code},
		{Op: OpConfig, Config: &Config{Hostname: "h", UID: 1000}},
		{Op: OpConfig, Config: &Config{Hostname: "h", UID: 1000, Layers: 3, HostBinds: []string{"/usr"}, DefaultUser: "user:1000"}},
		{Op: OpLookup, SID: 4, User: "1000:1000"},
		{Op: OpLookedUp, SID: 4, Cred: &Cred{UID: 1000, GID: 1000, Groups: []uint32{27, 100}, Home: "/home/corral"}},
		{Op: OpStart, SID: 5, Argv: []string{"id"}, Cred: &Cred{UID: 4242, GID: 4242, Home: "/"}},
		{Op: OpStart, SID: 6, Argv: []string{"sh"}, TTY: &Winsize{Rows: 24, Cols: 80}},
		{Op: OpStarted, SID: 6, TTY: &Winsize{Rows: 24, Cols: 80}},
	} {
		b, _, err := encode(m, make([]int, FDCount(m)))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := unmarshal(b)
		if err != nil {
			return
		}
		enc, _, err := encode(m, make([]int, FDCount(m)))
		if err != nil {
			t.Fatalf("accepted %q but cannot encode %+v: %v", b, m, err)
		}
		again, err := unmarshal(enc)
		if err != nil || !reflect.DeepEqual(again, m) {
			t.Fatalf("accepted %q as %+v, which encodes to %q and decodes as %+v, %v", b, m, enc, again, err)
		}
	})
}

// TestConfigMountLimits: a config carrying more layers or host binds than
// one SCM_RIGHTS message holds is refused by both ends; one at the limits
// travels with all its descriptors.
func TestConfigMountLimits(t *testing.T) {
	for _, cfg := range []*Config{{Layers: MaxLayers + 1}, {Layers: -1}, {HostBinds: make([]string, MaxHostBinds+1)}} {
		if _, _, err := encode(&Msg{Op: OpConfig, Config: cfg}, make([]int, max(cfg.Mounts(), 0))); err == nil {
			t.Errorf("config with %d layers, %d binds encoded", cfg.Layers, len(cfg.HostBinds))
		}
		// The packet a peer could send: op, bits, SID, no argv nor env,
		// three empty strings, then the config.
		raw, _ := json.Marshal(cfg)
		b := []byte{opCodes[OpConfig], hasConfig, 0, 0, 0, 0, 0, 0}
		b = binary.AppendUvarint(b, uint64(len(raw)))
		b = append(b, raw...)
		if _, err := unmarshal(b); !errors.Is(err, errMalformed) {
			t.Errorf("decoded a config with %d layers, %d binds: %v", cfg.Layers, len(cfg.HostBinds), err)
		}
	}
	c, initEnd, err := Pair()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	defer initEnd.Close()
	e := NewEndpoint(int(initEnd.Fd()))
	cfg := &Config{Layers: MaxLayers, HostBinds: make([]string, MaxHostBinds)}
	files := make([]*os.File, cfg.Mounts())
	for i := range files {
		files[i] = os.Stdin
	}
	if err := c.Send(&Msg{Op: OpConfig, Config: cfg}, files...); err != nil {
		t.Fatal(err)
	}
	m, fds, err := e.Recv()
	if err != nil || m.Config.Layers != MaxLayers || len(fds) != cfg.Mounts() {
		t.Fatalf("%+v %d descriptors, %v", m, len(fds), err)
	}
	for _, fd := range fds {
		unix.Close(fd)
	}
}
