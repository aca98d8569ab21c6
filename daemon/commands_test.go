package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/client"
	"github.com/corral-sandbox/corral/internal/testenv"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/sandbox/sandboxtest"
	"github.com/corral-sandbox/corral/store"
)

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: host commands are confined with Landlock by corral's helper, managed ones need the worker")
	}
}

// TestCommandStatuses drives every status of the commands endpoint that a
// host project can produce with real requests, real processes and the real
// provider.
func TestCommandStatuses(t *testing.T) {
	e := newEnv(t, envOpts{app: AppOptions{MaxBody: 64 << 10}})
	alice, tok := e.account("alice")
	_, stranger := e.account("mallory")
	p := e.hostProject("web", alice)
	path := commandsPath(p.ID)
	ctx := context.Background()

	withTimeout := func(b map[string]any, ms int) map[string]any { b["timeoutMs"] = ms; return b }
	withLimit := func(b map[string]any, l map[string]int) map[string]any { b["outputLimit"] = l; return b }

	tests := []struct {
		name   string
		path   string
		token  string
		body   any
		status int
		kind   string
		check  func(t *testing.T, body []byte)
	}{
		{name: "exit 0", path: path, token: tok, body: cmdBody("echo", "hello"), status: 200, check: func(t *testing.T, b []byte) {
			var r sandbox.CommandResult
			if err := json.Unmarshal(b, &r); err != nil || r.Stdout != "hello\n" || r.Code == nil || *r.Code != 0 {
				t.Errorf("result %s", b)
			}
			if !strings.Contains(string(b), `"signal":null`) {
				t.Errorf("signal not null: %s", b)
			}
		}},
		{name: "nonzero exit is a result", path: path, token: tok, body: cmdBody("sh", "-c", "echo out; echo err >&2; exit 3"), status: 200, check: func(t *testing.T, b []byte) {
			var r sandbox.CommandResult
			if err := json.Unmarshal(b, &r); err != nil || r.Code == nil || *r.Code != 3 || r.Stdout != "out\n" || r.Stderr != "err\n" {
				t.Errorf("result %s", b)
			}
		}},
		{name: "signal is a result", path: path, token: tok, body: cmdBody("sh", "-c", "kill -TERM $$"), status: 200, check: func(t *testing.T, b []byte) {
			if !strings.Contains(string(b), `"signal":"SIGTERM"`) || !strings.Contains(string(b), `"code":null`) {
				t.Errorf("result %s", b)
			}
		}},
		{name: "anonymous", path: path, body: cmdBody("true"), status: 401, kind: KindUnauthorized},
		{name: "unknown token", path: path, token: "corral_nope", body: cmdBody("true"), status: 401, kind: KindUnauthorized},
		{name: "non-member", path: path, token: stranger, body: cmdBody("true"), status: 403, kind: KindForbidden},
		{name: "unknown project", path: commandsPath(999), token: tok, body: cmdBody("true"), status: 403, kind: KindForbidden},
		{name: "bad project id", path: "/v1/projects/x/commands", token: tok, body: cmdBody("true"), status: 400, kind: KindInvalid},
		{name: "unknown field", path: path, token: tok, body: `{"command":{"type":"argv","file":"true"},"bogus":1}`, status: 400, kind: KindInvalid},
		{name: "unknown nested field", path: path, token: tok, body: `{"command":{"type":"argv","file":"true","shell":true}}`, status: 400, kind: KindInvalid},
		{name: "trailing data", path: path, token: tok, body: `{"command":{"type":"argv","file":"true"}} {}`, status: 400, kind: KindInvalid},
		{name: "not json", path: path, token: tok, body: `command=true`, status: 400, kind: KindInvalid},
		{name: "body too large", path: path, token: tok, body: `{"cwd":"` + strings.Repeat("a", 128<<10) + `"}`, status: 413, kind: KindRequestTooLarge},
		{name: "shell command type", path: path, token: tok, body: `{"command":{"type":"shell","file":"true"}}`, status: 400, kind: string(sandbox.KindPrepare)},
		{name: "bad lease kind", path: path, token: tok, body: map[string]any{"command": map[string]any{"type": "argv", "file": "true"}, "leaseKind": "root"}, status: 400, kind: string(sandbox.KindPrepare)},
		{name: "negative timeout", path: path, token: tok, body: withTimeout(cmdBody("true"), -1), status: 400, kind: KindInvalid},
		{name: "timeout over the cap", path: path, token: tok, body: withTimeout(cmdBody("true"), int(2*time.Hour/time.Millisecond)), status: 400, kind: KindInvalid},
		{name: "combined with per-stream limit", path: path, token: tok, body: withLimit(cmdBody("true"), map[string]int{"combined": 10, "stdout": 10}), status: 400, kind: string(sandbox.KindPrepare)},
		{name: "cwd outside the root (prepare refused)", path: path, token: tok, body: map[string]any{"command": map[string]any{"type": "argv", "file": "true"}, "cwd": "/etc"}, status: 400, kind: string(sandbox.KindPrepare)},
		{name: "a user in a host project (prepare refused)", path: path, token: tok, body: map[string]any{"command": map[string]any{"type": "argv", "file": "true"}, "user": "root"}, status: 400, kind: string(sandbox.KindPrepare)},
		{name: "program missing (start)", path: path, token: tok, body: cmdBody("/nonexistent/program"), status: 422, kind: string(sandbox.KindStart)},
		{name: "timeout", path: path, token: tok, body: withTimeout(cmdBody("sh", "-c", "echo partial; exec sleep 10"), 300), status: 504, kind: string(sandbox.KindTimeout), check: func(t *testing.T, b []byte) {
			if _, _, out, _ := apiError(t, b); out != "partial\n" {
				t.Errorf("partial stdout %q", out)
			}
		}},
		{name: "overflow", path: path, token: tok, body: withLimit(cmdBody("sh", "-c", "head -c 100000 /dev/zero | tr '\\0' x; sleep 10"), map[string]int{"stdout": 100}), status: 413, kind: string(sandbox.KindOverflow), check: func(t *testing.T, b []byte) {
			if _, _, out, _ := apiError(t, b); out != strings.Repeat("x", 100) {
				t.Errorf("partial stdout has %d bytes", len(out))
			}
		}},
	}
	requireRoot(t)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, body := e.do(ctx, "POST", tc.path, tc.token, tc.body)
			if status != tc.status {
				t.Fatalf("status %d, want %d: %s", status, tc.status, body)
			}
			if tc.kind != "" {
				if kind, _, _, _ := apiError(t, body); kind != tc.kind {
					t.Errorf("kind %q, want %q: %s", kind, tc.kind, body)
				}
			}
			if tc.check != nil {
				tc.check(t, body)
			}
		})
	}
	if n := e.liveLeases(); n != 0 {
		t.Errorf("%d live leases after every command settled", n)
	}
}

// TestAuthBeforeProvider proves with a counting provider that 401 and 403
// are decided before any provider is contacted.
func TestAuthBeforeProvider(t *testing.T) {
	fake := &sandboxtest.Provider{Dir: t.TempDir()}
	e := newEnv(t, envOpts{fake: fake})
	alice, tok := e.account("alice")
	_, stranger := e.account("mallory")
	p := e.hostProject("web", alice)
	ctx := context.Background()

	for _, tc := range []struct {
		token  string
		status int
	}{{"", 401}, {"corral_forged", 401}, {"Basic abc", 401}, {stranger, 403}} {
		status, body := e.do(ctx, "POST", commandsPath(p.ID), tc.token, cmdBody("true"))
		if status != tc.status {
			t.Errorf("token %q: status %d, want %d: %s", tc.token, status, tc.status, body)
		}
	}
	// Sessions too.
	status, body := e.do(ctx, "GET", fmt.Sprintf("/v1/projects/%d/sessions?argv=true", p.ID), stranger, nil)
	if status != 403 {
		t.Errorf("session by a stranger: %d %s", status, body)
	}
	if n := fake.Calls(); n != 0 {
		t.Fatalf("the provider was contacted %d times before authorization", n)
	}
	status, body = e.do(ctx, "POST", commandsPath(p.ID), tok, cmdBody("true"))
	if status != 200 {
		t.Fatalf("member: %d %s", status, body)
	}
	if n := fake.Calls(); n != 1 {
		t.Fatalf("provider calls = %d after one authorized command", n)
	}
}

// TestTransportAndCleanupStatuses uses the fake provider's leases to make
// a heartbeat fail (502 transport) and a release fail (500 cleanup).
func TestTransportAndCleanupStatuses(t *testing.T) {
	fail := errors.New("lease store unreachable")
	var mode string
	fake := &sandboxtest.Provider{Dir: t.TempDir(), OnLease: func(l *sandboxtest.Lease) {
		switch mode {
		case "heartbeat":
			l.HeartbeatErr.Store(&fail)
		case "release":
			l.ReleaseErr.Store(&fail)
		}
	}}
	e := newEnv(t, envOpts{fake: fake, control: sandbox.ControlOptions{HeartbeatInterval: 20 * time.Millisecond}})
	alice, tok := e.account("alice")
	p := e.hostProject("web", alice)
	ctx := context.Background()

	mode = "heartbeat"
	status, body := e.do(ctx, "POST", commandsPath(p.ID), tok, cmdBody("sh", "-c", "echo before; exec sleep 10"))
	if status != http.StatusBadGateway {
		t.Fatalf("heartbeat failure: %d %s", status, body)
	}
	if kind, _, _, _ := apiError(t, body); kind != string(sandbox.KindTransport) {
		t.Errorf("kind %q", kind)
	}
	mode = "release"
	status, body = e.do(ctx, "POST", commandsPath(p.ID), tok, cmdBody("echo", "done"))
	if status != http.StatusInternalServerError {
		t.Fatalf("release failure: %d %s", status, body)
	}
	kind, _, out, _ := apiError(t, body)
	if kind != string(sandbox.KindCleanup) || out != "done\n" {
		t.Errorf("cleanup error: %s", body)
	}
}

// TestSandboxUnavailable: with the sandbox plugin disabled, commands answer
// 503 (after authorization).
func TestSandboxUnavailable(t *testing.T) {
	e := newEnv(t, envOpts{disabled: []string{"sandbox"}})
	alice, tok := e.account("alice")
	p := e.hostProject("web", alice)
	status, body := e.do(context.Background(), "POST", commandsPath(p.ID), tok, cmdBody("true"))
	if status != http.StatusServiceUnavailable {
		t.Fatalf("%d %s", status, body)
	}
	if kind, _, _, _ := apiError(t, body); kind != KindUnavailable {
		t.Errorf("kind %q", kind)
	}
}

// TestManagedWithoutTransport: a managed project in a daemon without a
// privileged transport answers 503 "no privileged transport in this
// process".
func TestManagedWithoutTransport(t *testing.T) {
	e := newEnv(t, envOpts{})
	alice, tok := e.account("alice")
	p := e.managedProject("box", alice)
	status, body := e.do(context.Background(), "POST", commandsPath(p.ID), tok, cmdBody("true"))
	if status != http.StatusServiceUnavailable {
		t.Fatalf("%d %s", status, body)
	}
	if _, msg, _, _ := apiError(t, body); !strings.Contains(msg, "no privileged transport in this process") {
		t.Errorf("message %q", msg)
	}
}

// TestClientDisconnectCancels: a client that goes away aborts its command;
// nothing is left running, the lease is released, and the abort is
// recorded as 499.
func TestClientDisconnectCancels(t *testing.T) {
	requireRoot(t)
	e := newEnv(t, envOpts{})
	alice, tok := e.account("alice")
	p := e.hostProject("web", alice)
	marker := fmt.Sprintf("corral-disconnect-%d", time.Now().UnixNano())

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := e.client(tok).RunCommand(ctx, p.ID, client.CommandRequest{
			Command:   sandbox.Command{Type: "argv", File: "python3", Args: []string{"-c", "import time; time.sleep(30)", marker}},
			TimeoutMs: 60000,
		})
		done <- err
	}()
	testenv.WaitFor(t, 5*time.Second, "the command to start", func() bool { return len(processesWith(marker)) > 0 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("client error %v", err)
	}
	sandboxtest.AssertNoProcesses(t, marker)
	testenv.WaitFor(t, 5*time.Second, "the lease to be released", func() bool { return e.liveLeases() == 0 })
	testenv.WaitFor(t, 5*time.Second, "a 499 to be recorded", func() bool {
		return metricValue(t, e, `corral_http_requests_total{code="499",route="POST /v1/projects/{id}/commands"}`) == 1
	})
	if v := metricValue(t, e, `corral_commands_total{outcome="abort"}`); v != 1 {
		t.Errorf("abort count %v", v)
	}
	entries, err := e.st.ListJournal(context.Background(), store.JournalFilter{Project: p.ID})
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].End.ErrorKind != string(sandbox.KindAbort) {
		t.Errorf("journal %+v", entries)
	}
}

// processesWith lists processes whose command line contains token.
func processesWith(token string) []string {
	var found []string
	ents, _ := os.ReadDir("/proc")
	for _, d := range ents {
		b, err := os.ReadFile("/proc/" + d.Name() + "/cmdline")
		if err == nil && strings.Contains(string(b), token) {
			found = append(found, d.Name())
		}
	}
	return found
}

// TestOutsidersCannotTellProjectsApart: to a non-member, a project that
// exists answers exactly as one that does not.
func TestOutsidersCannotTellProjectsApart(t *testing.T) {
	fake := &sandboxtest.Provider{Dir: t.TempDir(), Kind: sandbox.ProjectManaged}
	e := newEnv(t, envOpts{fake: fake})
	alice, _ := e.account("alice")
	_, stranger := e.account("mallory")
	p := e.managedProject("box", alice)
	ctx := context.Background()
	missing := p.ID + 1000
	for _, route := range []string{"", "/members", "/sites", "/git/status"} {
		s1, b1 := e.do(ctx, "GET", fmt.Sprintf("/v1/projects/%d%s", p.ID, route), stranger, nil)
		s2, b2 := e.do(ctx, "GET", fmt.Sprintf("/v1/projects/%d%s", missing, route), stranger, nil)
		b2 = bytes.ReplaceAll(b2, []byte(strconv.FormatInt(missing, 10)), []byte(strconv.FormatInt(p.ID, 10)))
		if s1 != http.StatusForbidden || s1 != s2 || !bytes.Equal(b1, b2) {
			t.Errorf("%q: existing %d %s, missing %d %s", route, s1, b1, s2, b2)
		}
	}
}
