package sandbox_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/sandbox/sandboxtest"
)

var kinds = []sandbox.ProjectKind{sandbox.ProjectHost, sandbox.ProjectManaged}

// readAll reads a stream to its end on a goroutine of its own.
func readAll(r io.Reader) <-chan string {
	c := make(chan string, 1)
	go func() {
		var b bytes.Buffer
		_, _ = io.Copy(&b, r)
		c <- b.String()
	}()
	return c
}

func wantSessionKind(t *testing.T, err error, kind sandbox.ErrorKind) *sandbox.CommandError {
	t.Helper()
	var ce *sandbox.CommandError
	if !errors.As(err, &ce) || ce.Kind != kind {
		t.Fatalf("err = %v, want a %s CommandError", err, kind)
	}
	if ce.Cleanup != nil {
		t.Errorf("cleanup failed: %v", ce.Cleanup)
	}
	return ce
}

// TestSessionExit: streams both ways, the exit code, the lease released
// without a cancel.
func TestSessionExit(t *testing.T) {
	for _, kind := range kinds {
		t.Run(string(kind), func(t *testing.T) {
			p := &sandboxtest.Provider{Kind: kind}
			ctl := sandbox.NewControl(p, sandbox.ControlOptions{HeartbeatInterval: 10 * time.Millisecond})
			s, err := ctl.Open(context.Background(), input(kind, "sh", "-c", "cat; echo err >&2; sleep 0.1; exit 7"), &actor, nil)
			if err != nil {
				t.Fatal(err)
			}
			out, errOut := readAll(s.Stdout), readAll(s.Stderr)
			if _, err := io.WriteString(s.Stdin, "hello\n"); err != nil {
				t.Fatal(err)
			}
			s.Stdin.Close()
			exit, err := s.Wait()
			if err != nil || exit.Code == nil || *exit.Code != 7 {
				t.Fatalf("Wait = %+v, %v", exit, err)
			}
			if o, e := <-out, <-errOut; o != "hello\n" || e != "err\n" {
				t.Errorf("stdout %q stderr %q", o, e)
			}
			l := p.LastLease()
			if !l.Released() || p.Cancels() != 0 || l.Heartbeats.Load() == 0 {
				t.Errorf("released %v cancels %d heartbeats %d", l.Released(), p.Cancels(), l.Heartbeats.Load())
			}
			if s.LeaseID() != l.ID() {
				t.Errorf("LeaseID %s, lease %s", s.LeaseID(), l.ID())
			}
			if err := s.Close(context.Background()); err != nil {
				t.Errorf("Close after exit: %v", err)
			}
			if p.Cancels() != 0 || l.Releases.Load() != 1 {
				t.Errorf("Close after the exit cancelled %d, released %d times", p.Cancels(), l.Releases.Load())
			}
		})
	}
}

// TestSessionCallerGoesAway is the attack: a caller that stops reading in
// the middle of a flood of output and goes away (Close) leaves nothing
// running — not the command, not a grandchild — and no lease.
func TestSessionCallerGoesAway(t *testing.T) {
	for _, kind := range kinds {
		t.Run(string(kind), func(t *testing.T) {
			p := &sandboxtest.Provider{Kind: kind}
			ctl := sandbox.NewControl(p, sandbox.ControlOptions{})
			token := sandboxtest.SleepToken()
			s, err := ctl.Open(context.Background(), input(kind, "sh", "-c", "sleep "+token+" & while :; do echo flood; done"), &actor, nil)
			if err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 100)
			if _, err := io.ReadFull(s.Stdout, buf); err != nil {
				t.Fatal(err)
			}
			if len(processes(token)) == 0 {
				t.Fatal("the grandchild is not running")
			}
			// Nobody reads any more: the command blocks on a full pipe.
			if err := s.Close(context.Background()); err != nil {
				t.Fatalf("Close: %v", err)
			}
			sandboxtest.AssertNoProcesses(t, token)
			l := p.LastLease()
			if !l.Released() || p.Cancels() != 1 {
				t.Errorf("released %v cancels %d", l.Released(), p.Cancels())
			}
			wantSessionKind(t, second(s.Wait()), sandbox.KindAbort)
		})
	}
}

func second[T any](_ T, err error) error { return err }

// TestSessionCloseTwiceAndDuringWait: Close while Wait blocks settles the
// session as an abort; every Close returns the same; the tree is
// cancelled once and the lease released once.
func TestSessionCloseTwiceAndDuringWait(t *testing.T) {
	for _, kind := range kinds {
		t.Run(string(kind), func(t *testing.T) {
			p := &sandboxtest.Provider{Kind: kind}
			ctl := sandbox.NewControl(p, sandbox.ControlOptions{})
			s, err := ctl.Open(context.Background(), input(kind, "sleep", "100"), &actor, nil)
			if err != nil {
				t.Fatal(err)
			}
			waited := make(chan error, 2)
			for range 2 {
				go func() { waited <- second(s.Wait()) }()
			}
			var wg sync.WaitGroup
			closed := make([]error, 3)
			for i := range closed {
				wg.Add(1)
				go func() { defer wg.Done(); closed[i] = s.Close(context.Background()) }()
			}
			wg.Wait()
			for i, err := range closed {
				if err != nil {
					t.Errorf("Close %d: %v", i, err)
				}
			}
			for range 2 {
				wantSessionKind(t, <-waited, sandbox.KindAbort)
			}
			if err := s.Close(context.Background()); err != nil {
				t.Errorf("a later Close: %v", err)
			}
			if l := p.LastLease(); l.Releases.Load() != 1 || p.Cancels() != 1 {
				t.Errorf("releases %d cancels %d", l.Releases.Load(), p.Cancels())
			}
			if _, err := s.Stdin.Write([]byte("x")); err == nil {
				t.Error("stdin still writable after Close")
			}
		})
	}
}

// TestSessionHeartbeatFailure: a failed heartbeat cancels the command and
// Wait reports transport, wrapping ErrHeartbeat and the lease's error.
func TestSessionHeartbeatFailure(t *testing.T) {
	for _, kind := range kinds {
		t.Run(string(kind), func(t *testing.T) {
			gone := errors.New("lease store gone")
			p := &sandboxtest.Provider{Kind: kind}
			ctl := sandbox.NewControl(p, sandbox.ControlOptions{HeartbeatInterval: 10 * time.Millisecond})
			token := sandboxtest.SleepToken()
			s, err := ctl.Open(context.Background(), input(kind, "sh", "-c", "sleep "+token+"; true"), &actor, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close(context.Background())
			go io.Copy(io.Discard, s.Stdout)
			go io.Copy(io.Discard, s.Stderr)
			p.LastLease().HeartbeatErr.Store(&gone)
			ce := wantSessionKind(t, second(s.Wait()), sandbox.KindTransport)
			if !errors.Is(ce, sandbox.ErrHeartbeat) || !errors.Is(ce, gone) || !strings.Contains(ce.Message, "lease heartbeat failed") {
				t.Errorf("error %v", ce)
			}
			sandboxtest.AssertNoProcesses(t, token)
			if l := p.LastLease(); l.Releases.Load() != 1 || p.Cancels() != 1 {
				t.Errorf("releases %d cancels %d", l.Releases.Load(), p.Cancels())
			}
		})
	}
}

// TestSessionLifetimeAndAbort: the lifetime ends a session as a timeout,
// ctx's cancellation as an abort; both cancel the tree.
func TestSessionLifetimeAndAbort(t *testing.T) {
	for _, kind := range kinds {
		t.Run(string(kind), func(t *testing.T) {
			p := &sandboxtest.Provider{Kind: kind}
			ctl := sandbox.NewControl(p, sandbox.ControlOptions{})
			s, err := ctl.Open(context.Background(), input(kind, "sleep", "100"), &actor, &sandbox.SessionOptions{Lifetime: 100 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			wantSessionKind(t, second(s.Wait()), sandbox.KindTimeout)

			ctx, cancel := context.WithCancel(context.Background())
			s, err = ctl.Open(ctx, input(kind, "sleep", "100"), &actor, nil)
			if err != nil {
				t.Fatal(err)
			}
			cancel()
			wantSessionKind(t, second(s.Wait()), sandbox.KindAbort)
			if p.Cancels() != 2 {
				t.Errorf("cancels %d", p.Cancels())
			}
			for _, l := range p.Leases() {
				if !l.Released() {
					t.Errorf("lease %s not released", l.ID())
				}
			}
		})
	}
}

// TestOpenRefusals: bad input never reaches the provider; a start failure
// cancels and releases; the session budget is a session's, given back when
// it ends.
func TestOpenRefusals(t *testing.T) {
	p := &sandboxtest.Provider{Kind: sandbox.ProjectHost}
	lim := sandbox.NewLimiter(sandbox.Budget{}, sandbox.Budget{Sessions: 1})
	ctl := sandbox.NewControl(p, sandbox.ControlOptions{Admitter: lim})
	ctx := context.Background()
	bad := input(sandbox.ProjectHost, "true")
	bad.Env = map[string]string{"1X": "y"}
	for name, tc := range map[string]struct {
		in   sandbox.ExecInput
		opts *sandbox.SessionOptions
	}{
		"env name":      {bad, nil},
		"lifetime":      {input(sandbox.ProjectHost, "true"), &sandbox.SessionOptions{Lifetime: -1}},
		"empty tty":     {input(sandbox.ProjectHost, "true"), &sandbox.SessionOptions{TTY: &sandbox.TTYSize{}}},
		"no lease kind": {sandbox.ExecInput{Command: sandbox.Command{Type: "argv", File: "true"}, Project: sandbox.ProjectRef{Kind: sandbox.ProjectHost, ProjectID: 1}}, nil},
	} {
		if _, err := ctl.Open(ctx, tc.in, &actor, tc.opts); sandbox.KindOf(err) != sandbox.KindPrepare {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := ctl.Open(ctx, input(sandbox.ProjectHost, "true"), nil, nil); !errors.Is(err, sandbox.ErrNoActor) {
		t.Errorf("no actor: %v", err)
	}
	if p.Calls() != 0 {
		t.Fatalf("refusals reached the provider %d times", p.Calls())
	}
	_, err := ctl.Open(ctx, input(sandbox.ProjectHost, "/no/such/program"), &actor, nil)
	wantSessionKind(t, err, sandbox.KindStart)
	if l := p.LastLease(); !l.Released() || p.Cancels() != 1 {
		t.Errorf("start failure: released %v cancels %d", l.Released(), p.Cancels())
	}

	s, err := ctl.Open(ctx, input(sandbox.ProjectHost, "sleep", "100"), &actor, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ctl.Open(ctx, input(sandbox.ProjectHost, "true"), &actor, nil); !errors.Is(err, sandbox.ErrBusy) || sandbox.KindOf(err) != sandbox.KindPrepare {
		t.Errorf("a second session over the budget: %v", err)
	}
	if _, acct := lim.Usage(actor.AccountUserID); acct.Sessions != 1 || acct.Commands != 0 {
		t.Errorf("usage %+v", acct)
	}
	s.Close(ctx)
	if _, acct := lim.Usage(actor.AccountUserID); acct != (sandbox.Usage{}) {
		t.Errorf("usage after Close %+v", acct)
	}
}

// TestHostTerminalSession: a host session on a terminal: all output on
// Stdout, the size, a resize, the exit status.
func TestHostTerminalSession(t *testing.T) {
	p := &sandboxtest.Provider{Kind: sandbox.ProjectHost}
	ctl := sandbox.NewControl(p, sandbox.ControlOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := ctl.Open(ctx, input(sandbox.ProjectHost, "sh", "-c", "tty; echo to-stderr >&2; stty size; read x; stty size; exit 6"), &actor,
		&sandbox.SessionOptions{TTY: &sandbox.TTYSize{Rows: 30, Cols: 100}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	errOut := readAll(s.Stderr)
	var got bytes.Buffer
	await := func(want string) {
		t.Helper()
		buf := make([]byte, 4096)
		for !strings.Contains(got.String(), want) {
			n, err := s.Stdout.Read(buf)
			got.Write(buf[:n])
			if err != nil {
				t.Fatalf("waiting for %q in %q: %v", want, got.String(), err)
			}
		}
	}
	await("30 100")
	if !strings.Contains(got.String(), "/dev/pts/") || !strings.Contains(got.String(), "to-stderr") {
		t.Fatalf("terminal output %q", got.String())
	}
	if err := s.Resize(40, 120); err != nil {
		t.Fatal(err)
	}
	io.WriteString(s.Stdin, "go\r")
	await("40 120")
	go io.Copy(io.Discard, s.Stdout)
	exit, err := s.Wait()
	if err != nil || exit.Code == nil || *exit.Code != 6 {
		t.Fatalf("Wait = %+v, %v", exit, err)
	}
	if e := <-errOut; e != "" {
		t.Errorf("stderr of a terminal session: %q", e)
	}
	if err := s.Resize(10, 10); err == nil {
		t.Error("Resize after the end succeeded")
	}
}

// processes lists live processes whose command line contains token.
func processes(token string) []string {
	var found []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && strings.Contains(string(b), token) {
			found = append(found, e.Name())
		}
	}
	return found
}

// TestSessionSignal: a signal reaches the command (which handles it) and
// its tree; the exit reports it as a result, not an error.
func TestSessionSignal(t *testing.T) {
	p := &sandboxtest.Provider{Kind: sandbox.ProjectHost}
	ctl := sandbox.NewControl(p, sandbox.ControlOptions{})
	s, err := ctl.Open(context.Background(), input(sandbox.ProjectHost, "sh", "-c", "trap 'echo got-term; exit 9' TERM; echo ready; while :; do sleep 0.01; done"), &actor, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	buf := make([]byte, 6)
	if _, err := io.ReadFull(s.Stdout, buf); err != nil || string(buf) != "ready\n" {
		t.Fatalf("read %q, %v", buf, err)
	}
	go io.Copy(io.Discard, s.Stderr)
	rest := readAll(s.Stdout)
	if err := s.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	exit, err := s.Wait()
	if err != nil || exit.Code == nil || *exit.Code != 9 {
		t.Fatalf("Wait = %+v, %v", exit, err)
	}
	if got := <-rest; got != "got-term\n" {
		t.Errorf("output after the signal %q", got)
	}
	if p.Cancels() != 0 {
		t.Errorf("a signalled command that exited was cancelled")
	}
	if err := s.Signal(syscall.SIGTERM); err == nil {
		t.Error("Signal after the end succeeded")
	}
}
