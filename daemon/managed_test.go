package daemon

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/corral-sandbox/corral/internal/testenv"
	"github.com/corral-sandbox/corral/internal/testworker"
	"github.com/corral-sandbox/corral/machine"
	"github.com/corral-sandbox/corral/projects"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/store"
	"github.com/corral-sandbox/corral/worker"
)

// newManagedEnv starts a real worker in this process (serving a real
// socket, projects under STATE/projects) and a daemon that reaches it.
func newManagedEnv(t *testing.T) *env {
	t.Helper()
	e, _ := newManagedEnvWorker(t)
	return e
}

// newManagedEnvWorker is newManagedEnv, also returning the worker.
func newManagedEnvWorker(t *testing.T) (*env, *testworker.Worker) {
	t.Helper()
	return newManagedEnvOpts(t, testworker.Options{})
}

// newManagedEnvOpts is newManagedEnvWorker with the worker's options.
func newManagedEnvOpts(t *testing.T, opts testworker.Options) (*env, *testworker.Worker) {
	t.Helper()
	requireRoot(t)
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(projects.WorkspacesDir(dir), 0o711); err != nil {
		t.Fatal(err)
	}
	// Started first, so it stops after the daemon's cleanup.
	opts.ProjectsRoot = projects.WorkspacesDir(dir)
	opts.Limits = worker.Limits{Memory: 256 << 20, Pids: 128}
	opts.Logger = testLogger(t)
	w := testworker.Start(t, opts)
	sock := w.Socket
	return newEnv(t, envOpts{dir: dir, transport: machine.SocketTransport{Path: sock}}), w
}

func TestManagedCommand(t *testing.T) {
	e := newManagedEnv(t)
	alice, tok := e.account("alice")
	p := e.managedProject("box", alice)
	if err := os.WriteFile(filepath.Join(p.Root, "hello.txt"), []byte("from the host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	status, body := e.do(context.Background(), "POST", commandsPath(p.ID), tok, cmdBody("sh", "-c", "pwd; cat hello.txt; exit 4"))
	if status != 200 || !strings.Contains(string(body), `"stdout":"/workspace\nfrom the host\n"`) || !strings.Contains(string(body), `"code":4`) {
		t.Fatalf("%d %s", status, body)
	}
	if v := metricValue(t, e, "corral_worker_connected"); v != 1 {
		t.Errorf("worker_connected %v", v)
	}
	// The optional user: guest root, and one the machine lacks (a start
	// error: nothing ran).
	asUser := func(user string) map[string]any {
		b := cmdBody("id", "-u")
		b["user"] = user
		return b
	}
	status, body = e.do(context.Background(), "POST", commandsPath(p.ID), tok, asUser("root"))
	if status != 200 || !strings.Contains(string(body), `"stdout":"0\n"`) {
		t.Fatalf("user root: %d %s", status, body)
	}
	status, body = e.do(context.Background(), "POST", commandsPath(p.ID), tok, asUser("nosuchuser"))
	if kind, msg, _, _ := apiError(t, body); status != 422 || kind != string(sandbox.KindStart) || !strings.Contains(msg, "nosuchuser") {
		t.Fatalf("user nosuchuser: %d %s", status, body)
	}
}

// TestManagedSession runs a raw session in a real machine.
func TestManagedSession(t *testing.T) {
	e := newManagedEnv(t)
	alice, tok := e.account("alice")
	p := e.managedProject("box", alice)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, _, err := e.dialSession(ctx, tok, p.ID, "sh", "-c", "tr a-z A-Z; echo bye >&2")
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	if err := c.Write(ctx, websocket.MessageBinary, append([]byte{StreamStdin}, "shout\n"...)); err != nil {
		t.Fatal(err)
	}
	if err := c.Write(ctx, websocket.MessageText, []byte(`{"type":"eof"}`)); err != nil {
		t.Fatal(err)
	}
	tr := readSession(ctx, c)
	if tr.stdout.String() != "SHOUT\n" || tr.stderr.String() != "bye\n" {
		t.Errorf("stdout %q stderr %q", tr.stdout.String(), tr.stderr.String())
	}
	if last := tr.last(); last["type"] != "exit" || last["code"] != float64(0) {
		t.Errorf("control %v", tr.control)
	}
	testenv.WaitFor(t, 5*time.Second, "the lease to be released", func() bool { return e.liveLeases() == 0 })
}

// TestSitesRoundTrip serves a directory with python3's http.server inside
// a machine (started as a raw session) and reaches it through
// /sites/{name}/.
func TestSitesRoundTrip(t *testing.T) {
	e := newManagedEnv(t)
	alice, tok := e.account("alice")
	_, stranger := e.account("mallory")
	p := e.managedProject("box", alice)
	if err := os.WriteFile(filepath.Join(p.Root, "index.html"), []byte("<h1>corral site</h1>\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(p.Root, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(p.Root, "sub", "a.txt"), []byte("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, _, err := e.dialSession(ctx, tok, p.ID, "python3", "-m", "http.server", "8000", "--bind", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.CloseNow()
	go func() { _ = readSession(ctx, srv) }() // keep its output flowing

	if status, body := e.do(ctx, "PUT", fmt.Sprintf("/v1/projects/%d/sites/app", p.ID), tok, map[string]int{"port": 8000}); status != 200 {
		t.Fatalf("publish: %d %s", status, body)
	}
	var status int
	var body []byte
	deadline := time.Now().Add(15 * time.Second)
	for {
		status, body = e.do(ctx, "GET", "/sites/app/index.html", tok, nil)
		if status != http.StatusBadGateway || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if status != 200 || string(body) != "<h1>corral site</h1>\n" {
		t.Fatalf("site: %d %s", status, body)
	}
	// A directory listing, below the prefix; the bare prefix redirects.
	status, body = e.do(ctx, "GET", "/sites/app/sub/", tok, nil)
	if status != 200 || !strings.Contains(string(body), "a.txt") {
		t.Errorf("listing: %d %s", status, body)
	}
	status, body = e.do(ctx, "GET", "/sites/app", tok, nil)
	if status != 200 || string(body) != "<h1>corral site</h1>\n" {
		t.Errorf("bare prefix (redirected): %d %s", status, body)
	}
	if status, _ := e.do(ctx, "GET", "/sites/app/index.html", stranger, nil); status != 403 {
		t.Errorf("stranger: %d", status)
	}
	// Nothing listens on another port: 502.
	if status, body := e.do(ctx, "PUT", fmt.Sprintf("/v1/projects/%d/sites/dead", p.ID), tok, map[string]int{"port": 8001}); status != 200 {
		t.Fatalf("publish: %d %s", status, body)
	}
	status, body = e.do(ctx, "GET", "/sites/dead/", tok, nil)
	if status != http.StatusBadGateway {
		t.Errorf("dead site: %d %s", status, body)
	}

	// A WebSocket upgrade through the gateway, to a minimal echo server
	// that also says whether it saw an Authorization header.
	ws, _, err := e.dialSession(ctx, tok, p.ID, "python3", "-c", wsEchoServer)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	go func() { _ = readSession(ctx, ws) }()
	if status, body := e.do(ctx, "PUT", fmt.Sprintf("/v1/projects/%d/sites/ws", p.ID), tok, map[string]int{"port": 8002}); status != 200 {
		t.Fatalf("publish: %d %s", status, body)
	}
	var conn *websocket.Conn
	deadline = time.Now().Add(15 * time.Second)
	for {
		conn, _, err = websocket.Dial(ctx, "ws://corral/sites/ws/socket", &websocket.DialOptions{
			HTTPClient: e.http,
			HTTPHeader: http.Header{"Authorization": {"Bearer " + tok}},
		})
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("WebSocket through the gateway: %v", err)
	}
	defer conn.CloseNow()
	if err := conn.Write(ctx, websocket.MessageText, []byte("hi")); err != nil {
		t.Fatal(err)
	}
	_, msg, err := conn.Read(ctx)
	if err != nil || string(msg) != "echo: hi path=/socket auth=no" {
		t.Fatalf("echo: %q %v", msg, err)
	}

	srv.Close(websocket.StatusNormalClosure, "done")
	ws.Close(websocket.StatusNormalClosure, "done")
	testenv.WaitFor(t, 5*time.Second, "the servers' leases to be released", func() bool { return e.liveLeases() == 0 })
}

// wsEchoServer answers one WebSocket upgrade on port 8002 and echoes one
// short text message with the request path and whether the request
// carried an Authorization header.
const wsEchoServer = `
import base64, hashlib, socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8002))
s.listen(4)
while True:
    c, _ = s.accept()
    f = c.makefile("rb")
    path = f.readline().decode().split(" ")[1]
    key, auth = "", "no"
    while True:
        line = f.readline().decode()
        if line in ("\r\n", ""):
            break
        k, _, v = line.partition(":")
        if k.strip().lower() == "sec-websocket-key":
            key = v.strip()
        if k.strip().lower() == "authorization":
            auth = "yes"
    if not key:
        c.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
        c.close()
        continue
    acc = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
    c.sendall(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n" % acc).encode())
    b0, b1 = f.read(2)
    n = b1 & 127
    mask = f.read(4)
    data = bytes(x ^ mask[i % 4] for i, x in enumerate(f.read(n)))
    out = b"echo: " + data + (" path=%s auth=%s" % (path, auth)).encode()
    c.sendall(bytes([0x81, len(out)]) + out)
    f.read(1)
    c.close()
`

// An OOM kill in a managed machine is reported as such: over HTTP, in
// the journal and in the metrics; a plain result stays byte-identical.
func TestManagedOOMKilled(t *testing.T) {
	e := newManagedEnv(t)
	alice, tok := e.account("alice")
	p := e.managedProject("box", alice)
	status, body := e.do(context.Background(), "POST", commandsPath(p.ID), tok, cmdBody("python3", "-c", "a = bytearray(2 << 30)"))
	if status != 200 || !strings.Contains(string(body), `"code":null,"signal":"SIGKILL","oomKilled":true}`) {
		t.Fatalf("%d %s", status, body)
	}
	status, body = e.do(context.Background(), "POST", commandsPath(p.ID), tok, cmdBody("sh", "-c", "kill -9 $$"))
	if status != 200 || strings.Contains(string(body), "oomKilled") || !strings.Contains(string(body), `"signal":"SIGKILL"}`) {
		t.Fatalf("%d %s", status, body)
	}
	if v := metricValue(t, e, "corral_commands_oom_killed_total"); v != 1 {
		t.Errorf("corral_commands_oom_killed_total %v", v)
	}
	list, err := e.st.ListJournal(context.Background(), store.JournalFilter{Project: p.ID})
	if err != nil || len(list) != 2 || list[0].End.OOMKilled || !list[1].End.OOMKilled || list[1].End.Signal != "SIGKILL" {
		t.Fatalf("journal %+v, %v", list, err)
	}
}

// Killing a machine's init makes its running command fail with
// "transport" at once (not when its timeout expires).
func TestManagedMachineDeathIsTransport(t *testing.T) {
	e, w := newManagedEnvWorker(t)
	alice, tok := e.account("alice")
	p := e.managedProject("box", alice)
	type answer struct {
		status int
		body   []byte
	}
	done := make(chan answer, 1)
	go func() {
		status, body := e.do(context.Background(), "POST", commandsPath(p.ID), tok,
			`{"command":{"type":"argv","file":"sleep","args":["100"]},"timeoutMs":60000}`)
		done <- answer{status, body}
	}()
	var init int
	deadline := time.Now().Add(10 * time.Second)
	// Started: its sleep runs in the machine's cgroup.
	for init == 0 && time.Now().Before(deadline) {
		for _, m := range w.Machines() {
			b, _ := os.ReadFile(filepath.Join(m.Cgroups[0], "cgroup.procs"))
			for _, pid := range strings.Fields(string(b)) {
				if comm, _ := os.ReadFile("/proc/" + pid + "/comm"); string(comm) == "sleep\n" {
					init = m.InitPID
				}
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	if init == 0 {
		t.Fatal("no machine running the command")
	}
	killed := time.Now()
	if err := syscall.Kill(init, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	a := <-done
	t.Logf("answered %v after the kill", time.Since(killed))
	if a.status != http.StatusBadGateway || !strings.Contains(string(a.body), `"kind":"transport"`) {
		t.Fatalf("%d %s", a.status, a.body)
	}
}

// A worker that cannot start machines makes /healthz answer 503 with the
// reason (it said ok while every managed command failed).
func TestHealthzReportsMachineStartFailure(t *testing.T) {
	e, _ := newManagedEnvOpts(t, testworker.Options{SelfExe: "/bin/false"})
	alice, tok := e.account("alice")
	p := e.managedProject("box", alice)
	if status, body := e.do(context.Background(), "GET", "/healthz", "", nil); status != 200 {
		t.Fatalf("healthz before: %d %s", status, body)
	}
	if status, body := e.do(context.Background(), "POST", commandsPath(p.ID), tok, cmdBody("true")); status == 200 {
		t.Fatalf("command with a broken worker: %d %s", status, body)
	}
	status, body := e.do(context.Background(), "GET", "/healthz", "", nil)
	if status != http.StatusServiceUnavailable || !strings.Contains(string(body), "failed to start a machine") {
		t.Fatalf("healthz after: %d %s", status, body)
	}
}

// TestDeletedProjectsFreeTheirIDRanges replays issue 24's attack 2 through
// the API: create, run, delete, more times than the worker has id ranges.
// The daemon's delete reaches the worker, which frees the project's range
// (worker's TestDeletedProjectsFreeTheirIDRanges checks the home goes too).
func TestDeletedProjectsFreeTheirIDRanges(t *testing.T) {
	e, _ := newManagedEnvOpts(t, testworker.Options{MaxProjects: 2})
	alice, tok := e.account("alice")
	ctx := context.Background()
	for i := range 5 {
		p := e.managedProject(fmt.Sprintf("box%d", i), alice)
		status, body := e.do(ctx, "POST", commandsPath(p.ID), tok, cmdBody("true"))
		if status != 200 || !strings.Contains(string(body), `"code":0`) {
			t.Fatalf("project %d: %d %s", i, status, body)
		}
		if status, body := e.do(ctx, "DELETE", fmt.Sprintf("/v1/projects/%d", p.ID), tok, nil); status != 204 {
			t.Fatalf("delete project %d: %d %s", i, status, body)
		}
	}
}
