package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/pdeath"

	"go.uber.org/goleak"

	"github.com/corral-sandbox/corral/client"
	"github.com/corral-sandbox/corral/confine"
	"github.com/corral-sandbox/corral/core"
	"github.com/corral-sandbox/corral/machine"
	"github.com/corral-sandbox/corral/plugin"
	"github.com/corral-sandbox/corral/projects"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/sandbox/sandboxtest"
	"github.com/corral-sandbox/corral/store"
	"github.com/corral-sandbox/corral/wire"
	"github.com/corral-sandbox/corral/worker"
)

func TestMain(m *testing.M) {
	confine.MaybeRun()
	worker.MaybeRunInit()
	if len(os.Args) > 1 && os.Args[1] == "worker" {
		os.Exit(testWorkerMain(os.Args[2:]))
	}
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction(pdeath.SpawnerFunc))
}

// testWorkerMain serves as `corral worker` for the supervisor tests: the
// daemon re-executes this test binary with the worker's arguments.
func testWorkerMain(args []string) int {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	sock := fs.String("socket", "", "")
	root := fs.String("projects-root", "", "")
	state := fs.String("state", "", "")
	images := fs.String("images", "", "")
	own := fs.Bool("own-workspaces", false, "")
	allowUID := fs.Uint("allow-uid", 0, "")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if err := os.MkdirAll(*state, 0o700); err != nil {
		log.Error("state", "err", err)
		return 1
	}
	w, err := worker.New(worker.Config{
		ProjectsRoot:  *root,
		StateDir:      *state,
		ImagesDir:     *images,
		OwnWorkspaces: *own,
		Limits:        worker.Limits{Memory: 256 << 20, Pids: 128},
		// Named after the test process (the daemon under test is in it),
		// which removes the groups when the supervisor tests end.
		CgroupParent: fmt.Sprintf("corral-daemon-sup-%d", os.Getppid()),
		Logger:       log,
		AllowUID:     uint32(*allowUID),
	})
	if err != nil {
		log.Error("worker", "err", err)
		return 1
	}
	ln, err := wire.Listen(*sock)
	if err != nil {
		log.Error("listen", "err", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	serveErr := w.Serve(ctx, ln)
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.Shutdown(sctx); err != nil || serveErr != nil {
		log.Error("worker stopped", "serve", serveErr, "shutdown", err)
		return 1
	}
	return 0
}

// envOpts configure a test daemon.
type envOpts struct {
	// fake, if non-nil, is registered as the sandbox plugin (with the
	// built-in sites plugin) instead of the real provider.
	fake *sandboxtest.Provider
	// plugins, if not nil, is the core's plugin list (fake wins).
	plugins   []core.PluginFactory
	disabled  []string
	transport machine.PrivilegedTransport
	control   sandbox.ControlOptions
	app       AppOptions
	// dir, if non-empty, is the state directory (made by the caller).
	dir string
}

// env is a real daemon over a real Unix socket, real SQLite.
type env struct {
	t       *testing.T
	dir     string
	sock    string
	core    *core.Core
	app     *App
	st      store.Store
	metrics *Metrics
	http    *http.Client
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(bytes.TrimRight(p, "\n")))
	return len(p), nil
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// fakeSandbox registers p as the sandbox plugin.
func fakeSandbox(p *sandboxtest.Provider) core.PluginFactory {
	return core.Plugin(func(core.Deps) plugin.Registration {
		return plugin.Registration{
			Manifest: plugin.Manifest{Name: "sandbox", Provides: []plugin.Domain{plugin.DomainSandbox}},
			Register: func(c *plugin.Context) error { return c.Provide(plugin.DomainSandbox, p) },
		}
	})
}

func newEnv(t *testing.T, o envOpts) *env {
	t.Helper()
	dir := o.dir
	if dir == "" {
		var err error
		if dir, err = filepath.EvalSymlinks(t.TempDir()); err != nil {
			t.Fatal(err)
		}
	}
	// Socket paths are short: sun_path has 108 bytes.
	sockDir, err := os.MkdirTemp("", "cd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	log := testLogger(t)
	m := NewMetrics()
	copts := o.control
	copts.Observe = m.Observe
	if copts.HeartbeatInterval == 0 {
		copts.HeartbeatInterval = 100 * time.Millisecond
	}
	plugins := o.plugins
	if o.fake != nil {
		plugins = []core.PluginFactory{fakeSandbox(o.fake), core.SitesPlugin}
	}
	c, err := core.Build(context.Background(), core.Options{
		StorePath:           filepath.Join(dir, "corral.db"),
		Migrate:             true,
		PrivilegedTransport: o.transport,
		Logger:              log,
		Control:             copts,
		Plugins:             plugins,
		PluginConfig:        plugin.Config{Disabled: o.disabled},
	})
	if err != nil {
		t.Fatal(err)
	}
	aopts := o.app
	aopts.StateDir = dir
	aopts.Metrics = m
	aopts.Logger = log
	app, err := BuildApp(c, aopts)
	if err != nil {
		c.Close()
		t.Fatal(err)
	}
	sock := filepath.Join(sockDir, "corral.sock")
	ln, err := ListenUnix(sock, SocketMode)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, app, []net.Listener{ln}, log) }()
	e := &env{t: t, dir: dir, sock: sock, core: c, app: app, st: c.Store(), metrics: m}
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}
	e.http = &http.Client{Transport: tr}
	t.Cleanup(func() {
		tr.CloseIdleConnections()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		app.Close()
		if err := c.Close(); err != nil {
			t.Errorf("core Close: %v", err)
		}
	})
	return e
}

// account creates an account and a token for it.
func (e *env) account(name string) (store.Account, string) {
	e.t.Helper()
	ctx := context.Background()
	a, err := e.st.CreateAccount(ctx, name)
	if err != nil {
		e.t.Fatal(err)
	}
	tok, _, err := e.st.CreateToken(ctx, a.ID, "test")
	if err != nil {
		e.t.Fatal(err)
	}
	return a, tok
}

// hostProject creates a host project rooted at a new directory.
func (e *env) hostProject(name string, owner store.Account) store.Project {
	e.t.Helper()
	// Outside the state directory, where no project may be rooted.
	root := filepath.Join(e.t.TempDir(), "host-"+name)
	if err := os.Mkdir(root, 0o755); err != nil {
		e.t.Fatal(err)
	}
	p, err := e.app.Projects().Create(context.Background(), projects.ProjectSpec{Name: name, Kind: store.ProjectHost, Root: root, Owner: owner.ID})
	if err != nil {
		e.t.Fatal(err)
	}
	return p
}

// managedProject creates an empty managed project.
func (e *env) managedProject(name string, owner store.Account) store.Project {
	e.t.Helper()
	p, err := e.app.Projects().Create(context.Background(), projects.ProjectSpec{Name: name, Kind: store.ProjectManaged, Owner: owner.ID})
	if err != nil {
		e.t.Fatal(err)
	}
	return p
}

func (e *env) client(token string) *client.Client {
	e.t.Helper()
	c, err := client.New(e.sock, token)
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// do sends a raw request and returns the status and body.
func (e *env) do(ctx context.Context, method, path, token string, body any) (int, []byte) {
	e.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			e.t.Fatal(err)
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://corral"+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := e.http.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp.StatusCode, data
}

// apiError decodes a pinned error body, failing t if it is not one.
func apiError(t *testing.T, body []byte) (kind, message, stdout, stderr string) {
	t.Helper()
	var v struct {
		Error *struct {
			Kind    *string `json:"kind"`
			Message *string `json:"message"`
			Stdout  *string `json:"stdout"`
			Stderr  *string `json:"stderr"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &v); err != nil || v.Error == nil || v.Error.Kind == nil || v.Error.Message == nil || v.Error.Stdout == nil || v.Error.Stderr == nil {
		t.Fatalf("not a pinned error body: %s (%v)", body, err)
	}
	return *v.Error.Kind, *v.Error.Message, *v.Error.Stdout, *v.Error.Stderr
}

func cmdBody(argv ...string) map[string]any {
	return map[string]any{"command": map[string]any{"type": "argv", "file": argv[0], "args": argv[1:]}}
}

func commandsPath(id int64) string { return fmt.Sprintf("/v1/projects/%d/commands", id) }

// liveLeases returns the number of live leases in the store.
func (e *env) liveLeases() int {
	e.t.Helper()
	n, err := e.st.LiveLeaseCount(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	return n
}
