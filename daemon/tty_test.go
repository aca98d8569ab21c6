package daemon

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/corral-sandbox/corral/internal/testenv"
	"github.com/corral-sandbox/corral/sandbox"
)

// dialTTY opens a terminal session of argv (rows × cols) in project id.
func (e *env) dialTTY(ctx context.Context, token string, id int64, rows, cols int, argv ...string) (*websocket.Conn, error) {
	q := url.Values{"argv": argv, "tty": {"1"}, "rows": {fmt.Sprint(rows)}, "cols": {fmt.Sprint(cols)}}
	h := http.Header{"Authorization": {"Bearer " + token}}
	c, _, err := websocket.Dial(ctx, fmt.Sprintf("ws://corral/v1/projects/%d/sessions?%s", id, q.Encode()), &websocket.DialOptions{
		HTTPClient: e.http, HTTPHeader: h,
	})
	return c, err
}

// awaitTTY reads terminal output until it contains want; it returns what
// it read.
func awaitTTY(ctx context.Context, t *testing.T, c *websocket.Conn, want string) string {
	t.Helper()
	var got strings.Builder
	for !strings.Contains(got.String(), want) {
		typ, data, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("waiting for %q in %q: %v", want, got.String(), err)
		}
		if typ == websocket.MessageBinary && len(data) > 0 {
			if data[0] != StreamStdout {
				t.Fatalf("terminal output on stream %d: %q", data[0], data[1:])
			}
			got.Write(data[1:])
		}
	}
	return got.String()
}

// ttyScript checks a terminal session end to end: a terminal on 0, 1, 2,
// the initial size, a resize message followed, the exit status.
func ttyScript(ctx context.Context, t *testing.T, e *env, tok string, id int64, ttyPrefix string) {
	t.Helper()
	c, err := e.dialTTY(ctx, tok, id, 30, 100, "sh", "-c", `tty; test -t 0 && test -t 2 && echo is-tty; stty size; read x; stty size; exit 6`)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	got := awaitTTY(ctx, t, c, "30 100")
	if !strings.Contains(got, ttyPrefix) || !strings.Contains(got, "is-tty") {
		t.Fatalf("terminal output %q: want a %sN terminal", got, ttyPrefix)
	}
	if err := c.Write(ctx, websocket.MessageText, []byte(`{"type":"resize","rows":40,"cols":120}`)); err != nil {
		t.Fatal(err)
	}
	if err := c.Write(ctx, websocket.MessageBinary, append([]byte{StreamStdin}, "go\r"...)); err != nil {
		t.Fatal(err)
	}
	awaitTTY(ctx, t, c, "40 120")
	tr := readSession(ctx, c)
	if last := tr.last(); last["type"] != "exit" || last["code"] != float64(6) {
		t.Errorf("control %v", tr.control)
	}
	testenv.WaitFor(t, 5*time.Second, "the lease to be released", func() bool { return e.liveLeases() == 0 })
}

// TestManagedTTYSession: a terminal session in a real machine, on the
// machine's /dev/pts.
func TestManagedTTYSession(t *testing.T) {
	e := newManagedEnv(t)
	alice, tok := e.account("alice")
	p := e.managedProject("box", alice)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ttyScript(ctx, t, e, tok, p.ID, "/dev/pts/")
}

// TestHostTTYSession: a host project's terminal session, on a host pty.
func TestHostTTYSession(t *testing.T) {
	requireRoot(t)
	e := newEnv(t, envOpts{control: sandbox.ControlOptions{HeartbeatInterval: 20 * time.Millisecond}})
	alice, tok := e.account("alice")
	p := e.hostProject("web", alice)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ttyScript(ctx, t, e, tok, p.ID, "/dev/pts/")
}

// TestTTYSessionRefusals: bad terminal parameters are refused before the
// upgrade.
func TestTTYSessionRefusals(t *testing.T) {
	e := newEnv(t, envOpts{})
	alice, tok := e.account("alice")
	p := e.hostProject("web", alice)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, q := range []string{"tty=2", "tty=1&rows=0", "tty=1&cols=70000", "tty=1&rows=x"} {
		_, resp, err := websocket.Dial(ctx, fmt.Sprintf("ws://corral/v1/projects/%d/sessions?argv=sh&%s", p.ID, q), &websocket.DialOptions{
			HTTPClient: e.http, HTTPHeader: http.Header{"Authorization": {"Bearer " + tok}},
		})
		if err == nil || resp == nil || resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: %v, %v; want 400", q, resp, err)
		}
	}
}
