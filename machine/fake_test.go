package machine

import (
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/wire"
)

// fakeWorker is a minimal protocol-2 server for testing the gateway (the
// consumer of the protocol); the real worker is tested in package worker.
// Its behaviour is chosen by argv[0]:
//
//	reject       exec-rejected bad-argv
//	noanswer     never answers exec-start
//	cat [code]   copies stdin to stdout ("out:" prefix), writes "err" to
//	             stderr, exits with code (default 0)
//	notstarted   exec-exit notStarted (no exec-started)
//	signal       exits by SIGTERM
//	sleep        runs until exec-cancel, then exits by SIGKILL
//	hang         runs until the connection closes
//	dropattach   closes the connection on exec-attach (or exec-run)
//	nostart      never sends exec-started; exits by SIGKILL on exec-cancel
//
// net-dial to port 0 fails with dial-failed; any other port returns a
// socket whose peer echoes.
type fakeWorker struct {
	t      testing.TB
	path   string
	l      *net.UnixListener
	hello  wire.Message // reply to the client's hello; nil: a proper one
	noPong atomic.Bool
	// execRun announces wire.FeatureExecRun; runs counts the exec-run
	// frames received, startAttach the exec-start and exec-attach ones.
	execRun     bool
	runs        atomic.Int32
	startAttach atomic.Int32

	handshakes atomic.Int32
	cancels    atomic.Int32

	wg    sync.WaitGroup
	mu    sync.Mutex
	conns map[*wire.Conn]bool
}

func startFake(t testing.TB, path string) *fakeWorker { return startFakeRun(t, path, false) }

// startFakeRun is startFake with wire.FeatureExecRun announced or not.
func startFakeRun(t testing.TB, path string, execRun bool) *fakeWorker {
	t.Helper()
	f := &fakeWorker{t: t, path: path, conns: map[*wire.Conn]bool{}, execRun: execRun}
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
	return f
}

// serveConn serves c in the background.
func (f *fakeWorker) serveConn(c *wire.Conn) {
	f.mu.Lock()
	f.conns[c] = true
	f.mu.Unlock()
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		f.serve(c)
	}()
}

// dropConns closes every open connection, like a worker crash.
func (f *fakeWorker) dropConns() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for c := range f.conns {
		c.Close()
	}
}

// stop closes the listener and every connection and waits for all of the
// fake's goroutines.
func (f *fakeWorker) stop() {
	if f.l != nil {
		f.l.Close()
	}
	f.dropConns()
	f.wg.Wait()
}

func (f *fakeWorker) serve(c *wire.Conn) {
	var wg sync.WaitGroup
	closed := make(chan struct{})
	defer func() {
		c.Close()
		close(closed)
		wg.Wait()
		f.mu.Lock()
		delete(f.conns, c)
		f.mu.Unlock()
	}()
	if f.hello != nil {
		if _, _, err := c.Recv(); err != nil {
			return
		}
		c.Send(f.hello)
		return
	}
	var features []string
	if f.execRun {
		features = append(features, wire.FeatureExecRun)
	}
	if err := wire.ServerHello(c, "fake/1", features...); err != nil {
		return
	}
	f.handshakes.Add(1)
	var mu sync.Mutex
	starts := map[string]*wire.ExecStart{}
	cancel := map[string]chan struct{}{}
	// attach runs an attached session; false drops the connection.
	attach := func(id string, files []*os.File, accepted bool) bool {
		mu.Lock()
		start, cancelled := starts[id], cancel[id]
		mu.Unlock()
		if start == nil {
			closeFiles(files)
			c.Send(&wire.Error{ID: id, Code: wire.CodeUnknownSession, Message: "no such session"})
			return true
		}
		switch start.Argv[0] {
		case "instant": // accepted, started and ended at once
			closeFiles(files)
			zero := 0
			if accepted {
				c.Send(&wire.ExecAccepted{ID: id})
			}
			c.Send(&wire.ExecStarted{ID: id})
			c.Send(&wire.ExecExit{ID: id, Code: &zero})
			return true
		case "noanswer": // never accepted: never started
			closeFiles(files)
			return true
		case "dropattach": // crash between attach and start
			closeFiles(files)
			return false
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.run(c, start, files, cancelled, closed)
		}()
		return true
	}
	for {
		m, files, err := c.Recv()
		if err != nil {
			var pe *wire.ProtocolError
			if errors.As(err, &pe) {
				c.Send(pe.Frame())
			}
			return
		}
		switch m := m.(type) {
		case *wire.Ping:
			if !f.noPong.Load() {
				c.Send(&wire.Pong{ID: m.ID})
			}
		case *wire.ExecStart:
			f.startAttach.Add(1)
			switch m.Argv[0] {
			case "reject":
				c.Send(&wire.ExecRejected{ID: m.ID, Code: wire.CodeBadArgv, Message: "rejected by the fake"})
				continue
			case "noanswer", "instant":
			default:
				c.Send(&wire.ExecAccepted{ID: m.ID})
			}
			mu.Lock()
			starts[m.ID] = m
			cancel[m.ID] = make(chan struct{})
			mu.Unlock()
		case *wire.ExecCancel:
			f.cancels.Add(1)
			mu.Lock()
			if ch := cancel[m.ID]; ch != nil {
				close(ch)
				delete(cancel, m.ID)
			}
			mu.Unlock()
		case *wire.ExecAttach:
			f.startAttach.Add(1)
			if !attach(m.ID, files, true) {
				return
			}
		case *wire.ExecRun:
			f.runs.Add(1)
			if m.Argv[0] == "reject" {
				closeFiles(files)
				c.Send(&wire.ExecRejected{ID: m.ID, Code: wire.CodeBadArgv, Message: "rejected by the fake"})
				continue
			}
			mu.Lock()
			starts[m.ID] = (*wire.ExecStart)(m)
			cancel[m.ID] = make(chan struct{})
			mu.Unlock()
			if !attach(m.ID, files, false) {
				return
			}
		case *wire.NetDial:
			if m.Port == 0 {
				c.Send(&wire.Error{ID: m.ID, Code: wire.CodeDialFailed, Message: "connection refused"})
				continue
			}
			fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				f.t.Error(err)
				return
			}
			mine, theirs := os.NewFile(uintptr(fds[0]), "echo"), os.NewFile(uintptr(fds[1]), "dialed")
			c.Send(&wire.NetDialed{ID: m.ID}, theirs)
			theirs.Close()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer mine.Close()
				io.Copy(mine, mine)
			}()
		default:
			closeFiles(files)
		}
	}
}

func exitCode(c *wire.Conn, id string, code int) {
	c.Send(&wire.ExecExit{ID: id, Code: &code})
}

func (f *fakeWorker) run(c *wire.Conn, start *wire.ExecStart, files []*os.File, cancelled, closed <-chan struct{}) {
	defer closeFiles(files)
	stdin, stdout, stderr := files[0], files[1], files[2]
	id := start.ID
	if start.Argv[0] == "notstarted" {
		closeFiles(files)
		c.Send(&wire.ExecExit{ID: id, NotStarted: true, Message: "exec: no such file"})
		return
	}
	if start.Argv[0] == "nostart" { // hold the streams until cancelled
		select {
		case <-cancelled:
			closeFiles(files)
			c.Send(&wire.ExecExit{ID: id, Signal: "SIGKILL"})
		case <-closed:
		}
		return
	}
	c.Send(&wire.ExecStarted{ID: id})
	switch start.Argv[0] {
	case "cat":
		data, err := io.ReadAll(stdin)
		if err != nil {
			f.t.Errorf("fake: read stdin: %v", err)
		}
		stdout.Write(append([]byte("out:"), data...))
		stderr.Write([]byte("err"))
		closeFiles(files)
		code := 0
		if len(start.Argv) > 1 {
			code, _ = strconv.Atoi(start.Argv[1])
		}
		exitCode(c, id, code)
	case "signal":
		closeFiles(files)
		c.Send(&wire.ExecExit{ID: id, Signal: "SIGTERM"})
	case "sleep":
		select {
		case <-cancelled:
			closeFiles(files)
			c.Send(&wire.ExecExit{ID: id, Signal: "SIGKILL"})
		case <-closed:
		}
	case "hang":
		<-closed
	default:
		closeFiles(files)
		exitCode(c, id, 0)
	}
}
