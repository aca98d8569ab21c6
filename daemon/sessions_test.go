package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/corral-sandbox/corral/internal/testenv"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/sandbox/sandboxtest"
)

// dialSession opens a raw session of argv in project id.
func (e *env) dialSession(ctx context.Context, token string, id int64, argv ...string) (*websocket.Conn, *http.Response, error) {
	q := url.Values{"argv": argv}
	h := http.Header{}
	if token != "" {
		h.Set("Authorization", "Bearer "+token)
	}
	return websocket.Dial(ctx, fmt.Sprintf("ws://corral/v1/projects/%d/sessions?%s", id, q.Encode()), &websocket.DialOptions{
		HTTPClient: e.http,
		HTTPHeader: h,
	})
}

// sessionTranscript reads a session until it closes: stdout, stderr and
// the control messages.
type sessionTranscript struct {
	stdout, stderr strings.Builder
	control        []map[string]any
	closeErr       error
}

func readSession(ctx context.Context, c *websocket.Conn) *sessionTranscript {
	tr := &sessionTranscript{}
	for {
		typ, data, err := c.Read(ctx)
		if err != nil {
			tr.closeErr = err
			return tr
		}
		switch {
		case typ == websocket.MessageText:
			var m map[string]any
			_ = json.Unmarshal(data, &m)
			tr.control = append(tr.control, m)
		case len(data) > 0 && data[0] == StreamStdout:
			tr.stdout.Write(data[1:])
		case len(data) > 0 && data[0] == StreamStderr:
			tr.stderr.Write(data[1:])
		}
	}
}

func (tr *sessionTranscript) last() map[string]any {
	if len(tr.control) == 0 {
		return nil
	}
	return tr.control[len(tr.control)-1]
}

// TestSessionStreams runs a session through the managed contract (the
// fake provider's ManagedPrepared): stdin in, stdout and stderr out, the
// exit, the heartbeats, the lease released.
func TestSessionStreams(t *testing.T) {
	fake := &sandboxtest.Provider{Dir: t.TempDir(), Kind: sandbox.ProjectManaged}
	e := newEnv(t, envOpts{fake: fake, control: sandbox.ControlOptions{HeartbeatInterval: 20 * time.Millisecond}})
	alice, tok := e.account("alice")
	p := e.managedProject("box", alice)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	c, _, err := e.dialSession(ctx, tok, p.ID, "sh", "-c", "cat; echo done >&2; sleep 0.2; exit 7")
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	for _, chunk := range []string{"hello ", "world\n"} {
		if err := c.Write(ctx, websocket.MessageBinary, append([]byte{StreamStdin}, chunk...)); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Write(ctx, websocket.MessageText, []byte(`{"type":"eof"}`)); err != nil {
		t.Fatal(err)
	}
	tr := readSession(ctx, c)
	if tr.stdout.String() != "hello world\n" || tr.stderr.String() != "done\n" {
		t.Errorf("stdout %q stderr %q", tr.stdout.String(), tr.stderr.String())
	}
	if len(tr.control) != 2 || tr.control[0]["type"] != "started" || tr.control[0]["leaseId"] == "" {
		t.Fatalf("control messages %v", tr.control)
	}
	if last := tr.last(); last["type"] != "exit" || last["code"] != float64(7) || last["signal"] != nil {
		t.Errorf("exit message %v", last)
	}
	if websocket.CloseStatus(tr.closeErr) != websocket.StatusNormalClosure {
		t.Errorf("close %v", tr.closeErr)
	}
	l := fake.LastLease()
	testenv.WaitFor(t, 5*time.Second, "the lease to be released", l.Released)
	if l.Heartbeats.Load() == 0 {
		t.Error("the lease was never heartbeated while the socket lived")
	}
	if fake.Cancels() != 0 {
		t.Error("a session that exited was cancelled")
	}
	testenv.WaitFor(t, 5*time.Second, "the session gauge to drop", func() bool { return metricValue(t, e, "corral_sessions_active") == 0 })
	if v := metricValue(t, e, "corral_sessions_total"); v != 1 {
		t.Errorf("sessions_total %v", v)
	}
}

// TestSessionCloseCancels: the client closing the socket cancels the
// command (nothing left running) and releases the lease.
func TestSessionCloseCancels(t *testing.T) {
	fake := &sandboxtest.Provider{Dir: t.TempDir(), Kind: sandbox.ProjectManaged}
	e := newEnv(t, envOpts{fake: fake})
	alice, tok := e.account("alice")
	p := e.managedProject("box", alice)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	marker := fmt.Sprintf("corral-session-%d", time.Now().UnixNano())
	c, _, err := e.dialSession(ctx, tok, p.ID, "python3", "-c", "import time; print('up', flush=True); time.sleep(30)", marker)
	if err != nil {
		t.Fatal(err)
	}
	// Wait for output, so the command certainly runs.
	awaitOutput(ctx, t, c, "up\n")
	c.Close(websocket.StatusNormalClosure, "bye")
	sandboxtest.AssertNoProcesses(t, marker)
	l := fake.LastLease()
	testenv.WaitFor(t, 5*time.Second, "the lease to be released", l.Released)
	if fake.Cancels() == 0 {
		t.Error("the command was not cancelled")
	}
}

// TestSessionBackpressure: a client that does not read holds the command
// back instead of making the daemon buffer its output.
func TestSessionBackpressure(t *testing.T) {
	fake := &sandboxtest.Provider{Dir: t.TempDir(), Kind: sandbox.ProjectManaged}
	e := newEnv(t, envOpts{fake: fake})
	alice, tok := e.account("alice")
	p := e.managedProject("box", alice)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// The command writes as fast as it can for a second from its first
	// completed write (on a loaded host its start may take longer), then
	// records how much it wrote in a file (its stdout is blocked by then).
	out := t.TempDir() + "/written"
	script := fmt.Sprintf(`
import os, sys, time, signal
n = 0
def done(*a):
    open(%q, "w").write(str(n)); sys.exit(0)
signal.signal(signal.SIGALRM, done)
buf = b"x" * 65536
n += os.write(1, buf)
signal.alarm(1)
while True:
    n += os.write(1, buf)
`, out)
	c, _, err := e.dialSession(ctx, tok, p.ID, "python3", "-c", script)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	// Read nothing for two seconds.
	time.Sleep(1500 * time.Millisecond)
	testenv.WaitFor(t, 5*time.Second, "the writer to report", func() bool { _, err := readFile(out); return err == nil })
	data, _ := readFile(out)
	var n int
	fmt.Sscan(data, &n)
	// Pipes, socket buffers and one message in flight hold a few MiB at
	// most; an unbounded daemon buffer would take gigabytes in a second.
	if n <= 0 || n > 32<<20 {
		t.Fatalf("the command wrote %d bytes while nobody read", n)
	}
	t.Logf("written while the client did not read: %d bytes", n)
	tr := readSession(ctx, c)
	// The write the alarm interrupted may have gone out in part.
	if got := tr.stdout.Len(); got < n || got > n+65536 {
		t.Errorf("received %d bytes, the command wrote %d (+ at most one interrupted write)", got, n)
	}
}

// TestSessionRefusals: errors before the upgrade are JSON errors.
func TestSessionRefusals(t *testing.T) {
	fake := &sandboxtest.Provider{Dir: t.TempDir()}
	e := newEnv(t, envOpts{fake: fake})
	alice, tok := e.account("alice")
	host := e.hostProject("web", alice)
	box := e.managedProject("box", alice)
	ctx := context.Background()
	for _, tc := range []struct {
		name, path, token string
		status            int
	}{
		{"anonymous", fmt.Sprintf("/v1/projects/%d/sessions?argv=true", box.ID), "", 401},
		{"no argv", fmt.Sprintf("/v1/projects/%d/sessions", box.ID), tok, 400},
		{"host project without upgrade", fmt.Sprintf("/v1/projects/%d/sessions?argv=true", host.ID), tok, 400},
		{"no upgrade", fmt.Sprintf("/v1/projects/%d/sessions?argv=true", box.ID), tok, 400},
	} {
		status, body := e.do(ctx, "GET", tc.path, tc.token, nil)
		if status != tc.status {
			t.Errorf("%s: %d %s", tc.name, status, body)
		}
		apiError(t, body)
	}
	if fake.Calls() != 0 {
		t.Errorf("provider called %d times", fake.Calls())
	}
	_, resp, err := e.dialSession(ctx, "", box.ID, "true")
	if err == nil || resp == nil || resp.StatusCode != 401 {
		t.Errorf("anonymous dial: %v %v", resp, err)
	}
}

func readFile(name string) (string, error) {
	b, err := os.ReadFile(name)
	return string(b), err
}

// TestHostSession runs raw sessions in a host project with the real
// provider: confined by corral's helper, started by the daemon.
func TestHostSession(t *testing.T) {
	requireRoot(t)
	e := newEnv(t, envOpts{control: sandbox.ControlOptions{HeartbeatInterval: 20 * time.Millisecond}})
	alice, tok := e.account("alice")
	p := e.hostProject("web", alice)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	c, _, err := e.dialSession(ctx, tok, p.ID, "sh", "-c", "cat; echo err >&2; exit 5")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Write(ctx, websocket.MessageBinary, append([]byte{StreamStdin}, "ping\n"...)); err != nil {
		t.Fatal(err)
	}
	if err := c.Write(ctx, websocket.MessageText, []byte(`{"type":"eof"}`)); err != nil {
		t.Fatal(err)
	}
	tr := readSession(ctx, c)
	if tr.stdout.String() != "ping\n" || tr.stderr.String() != "err\n" {
		t.Errorf("stdout %q stderr %q", tr.stdout.String(), tr.stderr.String())
	}
	if last := tr.last(); last["type"] != "exit" || last["code"] != float64(5) {
		t.Errorf("control %v", tr.control)
	}
	testenv.WaitFor(t, 5*time.Second, "the lease to be released", func() bool { return e.liveLeases() == 0 })

	// A program that cannot be started: an error message, then a close.
	c, _, err = e.dialSession(ctx, tok, p.ID, "/no/such/program")
	if err != nil {
		t.Fatal(err)
	}
	tr = readSession(ctx, c)
	if last := tr.last(); last["type"] != "error" || last["kind"] != "start" {
		t.Errorf("start failure: %v", tr.control)
	}
	testenv.WaitFor(t, 5*time.Second, "the lease to be released", func() bool { return e.liveLeases() == 0 })

	// Closing the socket cancels the command.
	marker := fmt.Sprintf("corral-host-session-%d", time.Now().UnixNano())
	c, _, err = e.dialSession(ctx, tok, p.ID, "python3", "-c", "import time; print('up', flush=True); time.sleep(30)", marker)
	if err != nil {
		t.Fatal(err)
	}
	awaitOutput(ctx, t, c, "up\n")
	c.Close(websocket.StatusNormalClosure, "bye")
	sandboxtest.AssertNoProcesses(t, marker)
	testenv.WaitFor(t, 5*time.Second, "the lease to be released", func() bool { return e.liveLeases() == 0 })
}

// awaitOutput reads the session's messages until a stdout or stderr frame
// carries exactly want, so that the command certainly runs.
func awaitOutput(ctx context.Context, t *testing.T, c *websocket.Conn, want string) {
	t.Helper()
	for {
		typ, data, err := c.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if typ == websocket.MessageBinary && string(data[1:]) == want {
			return
		}
	}
}
