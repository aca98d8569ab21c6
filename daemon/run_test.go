package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/corral-sandbox/corral/api"
	"github.com/corral-sandbox/corral/client"
	"github.com/corral-sandbox/corral/internal/testenv"
	"github.com/corral-sandbox/corral/internal/testworker"
	"github.com/corral-sandbox/corral/projects"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/sandbox/sandboxtest"
	"github.com/corral-sandbox/corral/store"
)

// runDaemon runs Run in the background and returns the socket path once
// it listens; the returned stop ends it and returns Run's error.
func runDaemon(t *testing.T, cfg Config) (string, func() error) {
	t.Helper()
	ready := make(chan string, 1)
	cfg.Ready = func(s string) { ready <- s }
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg) }()
	select {
	case s := <-ready:
		stopped := false
		var err error
		stop := func() error {
			if !stopped {
				stopped = true
				cancel()
				err = <-done
			}
			return err
		}
		t.Cleanup(func() { _ = stop() })
		return s, stop
	case err := <-done:
		cancel()
		t.Fatalf("Run: %v", err)
	case <-time.After(20 * time.Second):
		cancel()
		t.Fatal("the daemon did not start listening")
	}
	return "", nil
}

// seed creates an account with a token, a host project and a managed
// project in the state directory's database, as the CLI does.
func seed(t *testing.T, state string) (tok string, host, managed store.Project) {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(state, "corral.db"), store.Options{Migrate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	a, err := st.CreateAccount(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	tok, _, err = st.CreateToken(ctx, a.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	ps := &projects.Projects{Store: st, StateDir: state}
	root := filepath.Join(t.TempDir(), "host") // outside the state directory
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if host, err = ps.Create(ctx, projects.ProjectSpec{Name: "web", Kind: store.ProjectHost, Root: root, Owner: a.ID}); err != nil {
		t.Fatal(err)
	}
	if managed, err = ps.Create(ctx, projects.ProjectSpec{Name: "box", Kind: store.ProjectManaged, Owner: a.ID}); err != nil {
		t.Fatal(err)
	}
	return tok, host, managed
}

func echo(c *client.Client, id int64) (*sandbox.CommandResult, error) {
	return c.RunCommand(context.Background(), id, client.CommandRequest{Command: sandbox.Command{Type: "argv", File: "echo", Args: []string{"ok"}}})
}

// TestRunWithoutWorker: a daemon with no privileged transport serves host
// projects, answers 503 for managed ones, listens on a 0660 socket and
// shuts down cleanly.
func TestRunWithoutWorker(t *testing.T) {
	requireRoot(t)
	state, err := os.MkdirTemp("", "cr")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(state)
	if err := os.MkdirAll(state, 0o711); err != nil {
		t.Fatal(err)
	}
	tok, host, managed := seed(t, state)
	sock, stop := runDaemon(t, Config{StateDir: state})
	if st, err := os.Stat(sock); err != nil || st.Mode().Perm() != SocketMode {
		t.Errorf("socket %s: %v %v", sock, st.Mode(), err)
	}
	c, err := client.New(sock, tok)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := echo(c, host.ID); err != nil || res.Stdout != "ok\n" {
		t.Fatalf("host command: %v %v", res, err)
	}
	_, err = echo(c, managed.ID)
	var ae *client.Error
	if !errors.As(err, &ae) || ae.Status != 503 || ae.Message == "" {
		t.Fatalf("managed command without a worker: %v", err)
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left behind: %v", err)
	}
}

// TestRunSupervisesWorker: as root without --worker-socket the daemon
// starts the worker, restarts it when it dies (the gateway reconnects by
// itself), and stops it on shutdown.
func TestRunSupervisesWorker(t *testing.T) {
	requireRoot(t)
	state, err := os.MkdirTemp("", "cs")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(state)
	tok, _, managed := seed(t, state)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testworker.RemoveCgroups(fmt.Sprintf("corral-daemon-sup-%d", os.Getpid())) })
	sock, stop := runDaemon(t, Config{StateDir: state, SuperviseWorker: true, WorkerExe: exe, WorkerLog: testWriter{t}})
	c, err := client.New(sock, tok)
	if err != nil {
		t.Fatal(err)
	}
	run := func() {
		t.Helper()
		// The worker may still be starting: a few 503s are expected.
		deadline := time.Now().Add(15 * time.Second)
		for {
			res, err := echo(c, managed.ID)
			if err == nil && res.Stdout == "ok\n" {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("managed command: %v %v", res, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	run()
	workerSock := filepath.Join(state, "worker.sock")
	pids := processesWith(workerSock)
	if len(pids) != 1 {
		t.Fatalf("worker processes %v", pids)
	}
	var pid int
	if _, err := fmtSscan(pids[0], &pid); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "a new worker", func() bool {
		ps := processesWith(workerSock)
		return len(ps) == 1 && ps[0] != pids[0]
	})
	run()
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	sandboxtest.AssertNoProcesses(t, workerSock)
}

func fmtSscan(s string, v *int) (int, error) { return fmt.Sscan(s, v) }

// TestPlatformFlow is the "done when": through the daemon alone (a
// supervised real worker behind it), a platform creates an account, a
// token and a project, runs a command, opens a session and reaches a site.
func TestPlatformFlow(t *testing.T) {
	requireRoot(t)
	state, err := os.MkdirTemp("", "cp")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(state)
	// The platform's own account is made once with the CLI's store access.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := store.Open(ctx, filepath.Join(state, "corral.db"), store.Options{Migrate: true})
	if err != nil {
		t.Fatal(err)
	}
	pa, err := st.CreateAccount(ctx, "platform")
	if err != nil {
		t.Fatal(err)
	}
	ptok, _, err := st.CreateToken(ctx, pa.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testworker.RemoveCgroups(fmt.Sprintf("corral-daemon-sup-%d", os.Getpid())) })
	sock, _ := runDaemon(t, Config{StateDir: state, SuperviseWorker: true, WorkerExe: exe, WorkerLog: testWriter{t}, Admins: []string{"platform"}})
	platform, err := client.New(sock, ptok)
	if err != nil {
		t.Fatal(err)
	}
	if err := platform.Do(ctx, "POST", "/v1/accounts", map[string]string{"name": "dev"}, nil); err != nil {
		t.Fatal(err)
	}
	var tj api.Token
	if err := platform.Do(ctx, "POST", "/v1/accounts/dev/tokens", map[string]string{"name": "agent"}, &tj); err != nil {
		t.Fatal(err)
	}
	proj, err := platform.CreateProject(ctx, client.ProjectRequest{Name: "site"})
	if err != nil {
		t.Fatal(err)
	}
	if err := platform.AddMember(ctx, proj.ID, "dev", false); err != nil {
		t.Fatal(err)
	}
	dev, err := client.New(sock, tj.Token)
	if err != nil {
		t.Fatal(err)
	}
	// A command (retried while the worker starts).
	var res *sandbox.CommandResult
	deadline := time.Now().Add(15 * time.Second)
	for {
		res, err = dev.RunCommand(ctx, proj.ID, client.CommandRequest{Command: sandbox.Command{Type: "argv", File: "sh", Args: []string{"-c", "echo '<p>hi</p>' > index.html && whoami"}}})
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil || res.Stdout == "" || *res.Code != 0 {
		t.Fatalf("command: %+v %v", res, err)
	}
	// A session serving the workspace.
	conn, _, err := websocket.Dial(ctx, "ws://corral/v1/projects/"+strconv.FormatInt(proj.ID, 10)+"/sessions?argv=python3&argv=-m&argv=http.server&argv=8000&argv=--bind&argv=127.0.0.1",
		&websocket.DialOptions{HTTPClient: dev.HTTPClient(), HTTPHeader: dev.Header()})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	typ, msg, err := conn.Read(ctx)
	if err != nil || typ != websocket.MessageText || !strings.Contains(string(msg), `"started"`) {
		t.Fatalf("session: %s %v", msg, err)
	}
	go func() {
		for {
			if _, _, err := conn.Read(ctx); err != nil {
				return
			}
		}
	}()
	// A site.
	if err := dev.PublishSite(ctx, proj.ID, "hello", 8000); err != nil {
		t.Fatal(err)
	}
	var body string
	deadline = time.Now().Add(15 * time.Second)
	for {
		req, _ := http.NewRequestWithContext(ctx, "GET", dev.URL("/sites/hello/"), nil)
		req.Header = dev.Header()
		resp, err := dev.HTTPClient().Do(req)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				body = string(b)
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("site did not answer: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if body != "<p>hi</p>\n" {
		t.Errorf("site body %q", body)
	}
	conn.Close(websocket.StatusNormalClosure, "done")
}
