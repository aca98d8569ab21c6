package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"

	"github.com/corral-sandbox/corral/internal/testenv"
	"github.com/corral-sandbox/corral/internal/testworker"
	"github.com/corral-sandbox/corral/plugins/lsp"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/sandbox/sandboxtest"
	"github.com/corral-sandbox/corral/store"
)

func lspPath(id int64, server string) string {
	return fmt.Sprintf("/v1/projects/%d/lsp/%s", id, server)
}

// upgradeStatus sends a WebSocket upgrade request (or a plain GET when
// upgrade is false) and returns the status and body of a refusal.
func (e *env) upgradeStatus(ctx context.Context, path, token string, upgrade bool) (int, []byte) {
	e.t.Helper()
	req, err := http.NewRequestWithContext(ctx, "GET", "http://corral"+path, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	if upgrade {
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", "websocket")
		req.Header.Set("Sec-WebSocket-Version", "13")
		req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := e.http.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	var body [4096]byte
	n, _ := resp.Body.Read(body[:])
	return resp.StatusCode, body[:n]
}

// TestLSPRefusals: the statuses of the route before any upgrade.
func TestLSPRefusals(t *testing.T) {
	ctx := context.Background()
	t.Run("auth before the provider", func(t *testing.T) {
		fake := &sandboxtest.Provider{}
		e := newEnv(t, envOpts{fake: fake})
		alice, tok := e.account("alice")
		_, stranger := e.account("mallory")
		p := e.hostProject("box", alice)
		for _, tt := range []struct {
			token string
			want  int
			kind  string
		}{
			{"", 401, KindUnauthorized},
			{"nope", 401, KindUnauthorized},
			{stranger, 403, KindForbidden},
			// The fake setup loads no lsp plugin: absent is 503.
			{tok, 503, KindUnavailable},
		} {
			status, body := e.upgradeStatus(ctx, lspPath(p.ID, "gopls"), tt.token, true)
			if kind, _, _, _ := apiError(t, body); status != tt.want || kind != tt.kind {
				t.Errorf("token %q: %d %s", tt.token, status, body)
			}
		}
		if status, _ := e.upgradeStatus(ctx, lspPath(999, "gopls"), tok, true); status != 403 {
			t.Errorf("unknown project: %d", status)
		}
		if n := fake.Calls(); n != 0 {
			t.Errorf("the provider was called %d times", n)
		}
	})
	t.Run("builtins without a transport", func(t *testing.T) {
		e := newEnv(t, envOpts{})
		alice, tok := e.account("alice")
		m := e.managedProject("box", alice)
		h := e.hostProject("host", alice)
		for _, tt := range []struct {
			name    string
			path    string
			upgrade bool
			want    int
			msg     string
		}{
			{"no upgrade", lspPath(m.ID, "gopls"), false, 400, "WebSocket upgrade"},
			{"unknown server", lspPath(m.ID, "rust-analyzer"), true, 404, `no language server "rust-analyzer" (configured: gopls)`},
			{"host project", lspPath(h.ID, "gopls"), true, 400, "only in managed projects"},
			{"no transport", lspPath(m.ID, "gopls"), true, 503, "privileged transport"},
		} {
			status, body := e.upgradeStatus(ctx, tt.path, tok, tt.upgrade)
			if _, msg, _, _ := apiError(t, body); status != tt.want || !strings.Contains(msg, tt.msg) {
				t.Errorf("%s: %d %s", tt.name, status, body)
			}
		}
		if n := e.liveLeases(); n != 0 {
			t.Errorf("%d live leases", n)
		}
	})
	t.Run("sandbox disabled", func(t *testing.T) {
		e := newEnv(t, envOpts{disabled: []string{"sandbox"}})
		alice, tok := e.account("alice")
		m := e.managedProject("box", alice)
		status, body := e.upgradeStatus(ctx, lspPath(m.ID, "gopls"), tok, true)
		if kind, _, _, _ := apiError(t, body); status != 503 || kind != KindUnavailable {
			t.Errorf("%d %s", status, body)
		}
	})
}

// requireGopls skips unless gopls and the Go toolchain are where a
// machine finds them (the host's / is visible read-only inside machines;
// the lsp plugin's default command line looks in /usr/local/go/bin and
// the provider's PATH).
func requireGopls(t *testing.T) {
	t.Helper()
	found := false
	for _, d := range []string{"/usr/local/bin", "/usr/bin", "/bin"} {
		if _, err := os.Stat(filepath.Join(d, "gopls")); err == nil {
			found = true
		}
	}
	if !found {
		t.Skip("gopls is not installed in /usr/local/bin: GOBIN=/usr/local/bin go install golang.org/x/tools/gopls@v0.23.0")
	}
	if _, err := os.Stat("/usr/local/go/bin/go"); err != nil {
		t.Skip("the Go toolchain is not in /usr/local/go, where the lsp plugin's default gopls command line looks")
	}
}

// lspClient is a minimal LSP client over the daemon's WebSocket. It
// answers the server's own requests with a null result.
type lspClient struct {
	t    *testing.T
	conn *websocket.Conn
	seq  int
}

func (e *env) dialLSP(ctx context.Context, token string, id int64, server string) *lspClient {
	e.t.Helper()
	c, _, err := websocket.Dial(ctx, "ws://corral"+lspPath(id, server), &websocket.DialOptions{
		HTTPClient: e.http,
		HTTPHeader: http.Header{"Authorization": {"Bearer " + token}},
	})
	if err != nil {
		e.t.Fatalf("dial %s: %v", server, err)
	}
	c.SetReadLimit(64 << 20)
	e.t.Cleanup(func() { c.CloseNow() })
	return &lspClient{t: e.t, conn: c}
}

func (c *lspClient) send(ctx context.Context, v any) {
	c.t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		c.t.Fatal(err)
	}
	if err := c.conn.Write(ctx, websocket.MessageText, b); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

func (c *lspClient) notify(ctx context.Context, method string, params any) {
	c.t.Helper()
	c.send(ctx, map[string]any{"jsonrpc": "2.0", "method": method, "params": params})
}

// call sends a request and returns its result, answering the server's
// requests and skipping its notifications meanwhile.
func (c *lspClient) call(ctx context.Context, method string, params any) json.RawMessage {
	c.t.Helper()
	c.seq++
	id := c.seq
	c.send(ctx, map[string]any{"jsonrpc": "2.0", "id": id, "method": method, "params": params})
	for {
		typ, data, err := c.conn.Read(ctx)
		if err != nil {
			c.t.Fatalf("%s: read: %v", method, err)
		}
		if typ != websocket.MessageText {
			c.t.Fatalf("%s: a binary message from the daemon", method)
		}
		var m struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
			Result json.RawMessage `json:"result"`
			Error  json.RawMessage `json:"error"`
		}
		if err := json.Unmarshal(data, &m); err != nil {
			c.t.Fatalf("%s: message %q: %v", method, data, err)
		}
		switch {
		case m.Method != "" && m.ID != nil:
			c.send(ctx, map[string]any{"jsonrpc": "2.0", "id": m.ID, "result": nil})
		case m.Method != "":
			// A notification (logs, diagnostics, progress).
		case string(m.ID) == fmt.Sprint(id):
			if m.Error != nil {
				c.t.Fatalf("%s: error %s", method, m.Error)
			}
			return m.Result
		}
	}
}

// closeStatus reads until the socket closes and returns its close frame.
func (c *lspClient) closeStatus(ctx context.Context) (websocket.StatusCode, string) {
	c.t.Helper()
	for {
		_, _, err := c.conn.Read(ctx)
		if err == nil {
			continue
		}
		var ce websocket.CloseError
		if !errors.As(err, &ce) {
			c.t.Fatalf("the socket ended without a close frame: %v", err)
		}
		return ce.Code, ce.Reason
	}
}

// goplsMain imports nothing: the test machine's memory limit (256 MiB)
// is too tight for gopls to type-check fmt's dependencies.
const goplsMain = `package main

// greet says hello to name.
func greet(name string) string {
	return "hello, " + name
}

func main() {
	println(greet("corral"))
}
`

// TestLSPGoplsHover drives real gopls in a real machine through the
// daemon: initialize, initialized, didOpen, hover, shutdown, exit.
func TestLSPGoplsHover(t *testing.T) {
	requireGopls(t)
	e := newManagedEnv(t)
	alice, tok := e.account("alice")
	p := e.managedProject("box", alice)
	if err := os.WriteFile(filepath.Join(p.Root, "go.mod"), []byte("module example.com/hello\n\ngo 1.21\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(p.Root, "main.go"), []byte(goplsMain), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	c := e.dialLSP(ctx, tok, p.ID, "gopls")

	const root = "file:///workspace"
	var init struct {
		Capabilities struct {
			HoverProvider any `json:"hoverProvider"`
		} `json:"capabilities"`
		ServerInfo struct {
			Name string `json:"name"`
		} `json:"serverInfo"`
	}
	res := c.call(ctx, "initialize", map[string]any{
		"processId":        nil,
		"rootUri":          root,
		"capabilities":     map[string]any{"textDocument": map[string]any{"hover": map[string]any{"contentFormat": []string{"plaintext"}}}},
		"workspaceFolders": []map[string]any{{"uri": root, "name": "workspace"}},
	})
	if err := json.Unmarshal(res, &init); err != nil || init.Capabilities.HoverProvider == nil {
		t.Fatalf("initialize: %s (%v)", res, err)
	}
	t.Logf("server %q", init.ServerInfo.Name)
	c.notify(ctx, "initialized", map[string]any{})
	uri := root + "/main.go"
	c.notify(ctx, "textDocument/didOpen", map[string]any{"textDocument": map[string]any{
		"uri": uri, "languageId": "go", "version": 1, "text": goplsMain,
	}})
	// Hover over greet in main: line 8 (0-based), "	println(greet(".
	line := strings.Split(goplsMain, "\n")[8]
	pos := map[string]any{"line": 8, "character": strings.Index(line, "greet") + 1}
	var hover struct {
		Contents struct {
			Value string `json:"value"`
		} `json:"contents"`
	}
	res = c.call(ctx, "textDocument/hover", map[string]any{"textDocument": map[string]any{"uri": uri}, "position": pos})
	if err := json.Unmarshal(res, &hover); err != nil {
		t.Fatalf("hover: %s (%v)", res, err)
	}
	if !strings.Contains(hover.Contents.Value, "func greet(name string) string") || !strings.Contains(hover.Contents.Value, "greet says hello to name.") {
		t.Fatalf("hover: %s", res)
	}
	// Orderly shutdown: the server exits 0 and the daemon closes 1000.
	c.call(ctx, "shutdown", nil)
	c.notify(ctx, "exit", nil)
	code, reason := c.closeStatus(ctx)
	if code != websocket.StatusNormalClosure || !strings.HasPrefix(reason, "exited: the server exited with code 0") {
		t.Errorf("close %d %q", code, reason)
	}
	testenv.WaitFor(t, 5*time.Second, "the lease to be released", func() bool { return e.liveLeases() == 0 })
}

// machineProcesses lists the live processes named comm in the machines of
// this test binary's workers (found by their cgroup, which testworker
// names after the test process).
func machineProcesses(comm string) []string {
	marker := testworker.CgroupPrefix()
	var found []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		dir := filepath.Join("/proc", e.Name())
		c, err := os.ReadFile(filepath.Join(dir, "comm"))
		if err != nil || strings.TrimSpace(string(c)) != comm {
			continue
		}
		cg, _ := os.ReadFile(filepath.Join(dir, "cgroup"))
		st, _ := os.ReadFile(filepath.Join(dir, "stat"))
		if i := strings.LastIndexByte(string(st), ')'); i > 0 && i+2 < len(st) && st[i+2] == 'Z' {
			continue
		}
		if strings.Contains(string(cg), marker) {
			found = append(found, e.Name())
		}
	}
	return found
}

// TestLSPHeartbeatFailure: the session's lease is released behind its
// back (as another process would); the plugin's next heartbeat fails, the
// server is torn down and the socket closes 1011 with the reason.
func TestLSPHeartbeatFailure(t *testing.T) {
	requireGopls(t)
	e := newManagedEnv(t)
	alice, tok := e.account("alice")
	p := e.managedProject("box", alice)
	if err := os.WriteFile(filepath.Join(p.Root, "go.mod"), []byte("module example.com/hello\n\ngo 1.21\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	c := e.dialLSP(ctx, tok, p.ID, "gopls")
	c.call(ctx, "initialize", map[string]any{"processId": nil, "rootUri": "file:///workspace", "capabilities": map[string]any{}})
	if len(machineProcesses("gopls")) == 0 {
		t.Fatal("no gopls process in the machine")
	}
	leases, err := e.st.ListLeases(ctx, store.LeaseFilter{Project: p.ID, State: store.LeaseLive})
	if err != nil || len(leases) != 1 || leases[0].Kind != "lsp" {
		t.Fatalf("leases %+v (%v)", leases, err)
	}
	if _, err := e.st.ReleaseLease(ctx, leases[0].ID, time.Now()); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	code, reason := c.closeStatus(ctx)
	if code != websocket.StatusInternalError || !strings.HasPrefix(reason, "heartbeat: lease heartbeat failed") {
		t.Errorf("close %d %q", code, reason)
	}
	t.Logf("closed %v after the release", time.Since(start))
	// The close frame is sent after teardown: the server is gone.
	if left := machineProcesses("gopls"); len(left) != 0 {
		t.Errorf("gopls still running: %v", left)
	}
}

// TestLSPClientProtocol: what the client sends must be JSON-RPC text
// messages; anything else closes the session with the reason, and the
// server is torn down.
func TestLSPClientProtocol(t *testing.T) {
	requireGopls(t)
	e := newManagedEnv(t)
	alice, tok := e.account("alice")
	p := e.managedProject("box", alice)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	for _, tt := range []struct {
		name   string
		typ    websocket.MessageType
		msg    string
		code   websocket.StatusCode
		reason string
	}{
		{"not json", websocket.MessageText, "Content-Length: 2\r\n\r\n{}", websocket.StatusInvalidFramePayloadData, "clientProtocol: invalid message from the client"},
		{"array", websocket.MessageText, `[{"jsonrpc":"2.0","id":1,"method":"initialize"}]`, websocket.StatusInvalidFramePayloadData, "clientProtocol: "},
		{"binary", websocket.MessageBinary, `{"jsonrpc":"2.0","id":1,"method":"initialize"}`, websocket.StatusUnsupportedData, "binary messages are not LSP messages"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := e.dialLSP(ctx, tok, p.ID, "gopls")
			if err := c.conn.Write(ctx, tt.typ, []byte(tt.msg)); err != nil {
				t.Fatal(err)
			}
			code, reason := c.closeStatus(ctx)
			if code != tt.code || !strings.HasPrefix(reason, tt.reason) {
				t.Errorf("close %d %q", code, reason)
			}
			testenv.WaitFor(t, 5*time.Second, "the lease to be released", func() bool { return e.liveLeases() == 0 })
			testenv.WaitFor(t, 5*time.Second, "gopls to end", func() bool { return len(machineProcesses("gopls")) == 0 })
		})
	}
}

// TestLSPCloseStatus: how each end of a session maps onto a close frame
// (the reasons that need a misbehaving server are driven for real in
// plugins/lsp's tests).
func TestLSPCloseStatus(t *testing.T) {
	zero, three := 0, 3
	long := strings.Repeat("é", 100)
	for _, tt := range []struct {
		err    error
		code   websocket.StatusCode
		reason string
	}{
		{&lsp.CloseError{Reason: lsp.ReasonExited, Message: "the server exited with code 0", Exit: &sandbox.Exit{Code: &zero}}, 1000, "exited: the server exited with code 0"},
		{&lsp.CloseError{Reason: lsp.ReasonExited, Message: "the server exited with code 3", Exit: &sandbox.Exit{Code: &three}}, 1011, "exited: the server exited with code 3"},
		{&lsp.CloseError{Reason: lsp.ReasonExited, Message: "the server closed its output without exiting"}, 1011, "exited: the server closed its output without exiting"},
		{&lsp.CloseError{Reason: lsp.ReasonServerProtocol, Message: "lsp: bad message framing: missing Content-Length", Err: lsp.ErrFraming}, 1011, "serverProtocol: lsp: bad message framing: missing Content-Length"},
		{&lsp.CloseError{Reason: lsp.ReasonClientProtocol, Message: "m", Err: lsp.ErrNotJSON}, 1007, "clientProtocol: m"},
		{&lsp.CloseError{Reason: lsp.ReasonClientProtocol, Message: "m", Err: lsp.ErrTooLarge}, 1009, "clientProtocol: m"},
		{&lsp.CloseError{Reason: lsp.ReasonHeartbeat, Message: "lease heartbeat failed: x"}, 1011, "heartbeat: lease heartbeat failed: x"},
		{&lsp.CloseError{Reason: lsp.ReasonTransport, Message: "t"}, 1011, "transport: t"},
		{&lsp.CloseError{Reason: lsp.ReasonClosed, Message: "closed by the client"}, 1000, "closed: closed by the client"},
		{errors.New("other"), 1011, "session ended"},
	} {
		code, reason := lspCloseStatus(tt.err)
		if code != tt.code || reason != tt.reason {
			t.Errorf("%v: %d %q, want %d %q", tt.err, code, reason, tt.code, tt.reason)
		}
	}
	_, reason := lspCloseStatus(&lsp.CloseError{Reason: lsp.ReasonTransport, Message: long})
	if len(reason) > 123 || !utf8.ValidString(reason) || !strings.HasPrefix(reason, "transport: éé") {
		t.Errorf("long reason: %d bytes %q", len(reason), reason)
	}
}
