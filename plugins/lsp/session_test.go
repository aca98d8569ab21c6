package lsp_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/pdeath"

	"go.uber.org/goleak"

	"github.com/corral-sandbox/corral/core"
	"github.com/corral-sandbox/corral/plugin"
	"github.com/corral-sandbox/corral/plugins/lsp"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/sandbox/sandboxtest"
)

func TestMain(m *testing.M) {
	if len(os.Args) > 2 && os.Args[1] == "lsp-fake-server" {
		os.Exit(fakeServer(os.Args[2]))
	}
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction(pdeath.SpawnerFunc))
}

// fakeServer is a language server for the tests, run by re-executing the
// test binary: "lsp-fake-server MODE TOKEN" (the token only marks the
// process, for AssertNoProcesses).
//
//	echo       answers every request {"id":I,"method":M} with
//	           {"id":I,"result":{"echo":M,"params":P}}; "exit" exits 0,
//	           "crash" exits 3, "bye" answers and exits 0 at once; every
//	           message is also written to stderr.
//	badlength  writes a header with an invalid Content-Length, then waits.
//	nolength   writes a header without Content-Length, then waits.
//	huge       announces a message over the limit, then waits.
//	notjson    writes a well-framed body that is not JSON, then waits.
//	closeout   closes its stdout, then waits.
func fakeServer(mode string) int {
	out := os.Stdout
	wait := func() int {
		_, _ = io.Copy(io.Discard, os.Stdin)
		time.Sleep(time.Hour)
		return 0
	}
	switch mode {
	case "badlength":
		fmt.Fprint(out, "Content-Length: twelve\r\n\r\n{}")
		return wait()
	case "nolength":
		fmt.Fprint(out, "Content-Type: application/json\r\n\r\n{}")
		return wait()
	case "huge":
		fmt.Fprint(out, "Content-Length: 999999999\r\n\r\n")
		return wait()
	case "notjson":
		fmt.Fprint(out, "Content-Length: 5\r\n\r\nhello")
		return wait()
	case "closeout":
		out.Close()
		return wait()
	}
	r := lsp.NewReader(bufio.NewReader(os.Stdin), 0)
	for {
		m, err := r.ReadMessage()
		if err != nil {
			fmt.Fprintln(os.Stderr, "fake server:", err)
			return 2
		}
		fmt.Fprintf(os.Stderr, "got %s\n", m)
		var req struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
			Params json.RawMessage `json:"params"`
		}
		if err := json.Unmarshal(m, &req); err != nil {
			return 2
		}
		switch req.Method {
		case "exit":
			return 0
		case "crash":
			return 3
		}
		if req.ID != nil {
			resp, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": req.ID, "result": map[string]any{"echo": req.Method, "params": req.Params}})
			if err := lsp.WriteMessage(out, resp); err != nil {
				return 2
			}
		}
		if req.Method == "bye" {
			return 0
		}
	}
}

// fixture is a real core with a fake managed sandbox (local processes)
// and the lsp plugin, whose servers are this test binary in some mode.
type fixture struct {
	core    *core.Core
	sandbox *sandboxtest.Provider
	ctl     *lsp.Control
	token   string
	project sandbox.ProjectRef
	actor   sandbox.Actor
}

func newFixture(t *testing.T, opts lsp.Options, disabled ...string) *fixture {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{
		sandbox: &sandboxtest.Provider{Kind: sandbox.ProjectManaged},
		token:   fmt.Sprintf("lsp-token-%d-%d", os.Getpid(), time.Now().UnixNano()),
		project: sandbox.ProjectRef{Kind: sandbox.ProjectManaged, ProjectID: 7},
		actor:   sandbox.Actor{AccountUserID: 3},
	}
	if opts.Servers == nil {
		opts.Servers = map[string][]string{}
		for _, mode := range []string{"echo", "badlength", "nolength", "huge", "notjson", "closeout"} {
			opts.Servers[mode] = []string{self, "lsp-fake-server", mode, f.token}
		}
	}
	if opts.Cwd == "" {
		opts.Cwd = t.TempDir()
	}
	if opts.Logger == nil {
		opts.Logger = testLogger(t)
	}
	dir := t.TempDir()
	c, err := core.Build(context.Background(), core.Options{
		StorePath: filepath.Join(dir, "corral.db"),
		Migrate:   true,
		Logger:    opts.Logger,
		// The sandbox control owns the session lifecycle: a short
		// heartbeat for the tests that watch it.
		Control: sandbox.ControlOptions{HeartbeatInterval: 10 * time.Millisecond},
		Plugins: []core.PluginFactory{
			core.Plugin(func(core.Deps) plugin.Registration {
				return plugin.Registration{
					Manifest: plugin.Manifest{Name: "sandbox", Provides: []plugin.Domain{plugin.DomainSandbox}},
					Register: func(c *plugin.Context) error { return c.Provide(plugin.DomainSandbox, f.sandbox) },
				}
			}),
			core.Plugin(func(core.Deps) plugin.Registration { return lsp.Registration(opts) }),
		},
		PluginConfig: plugin.Config{Disabled: disabled},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	f.core = c
	f.ctl, err = plugin.ResolveCoreAs[*lsp.Control](c.Registry(), plugin.DomainLSP)
	if err != nil && len(disabled) == 0 {
		t.Fatal(err)
	}
	return f
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func (f *fixture) open(t *testing.T, server string) *lsp.Session {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := f.ctl.Open(ctx, f.actor, f.project, server)
	if err != nil {
		t.Fatalf("Open %s: %v", server, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// waitDone waits for the session to end and returns its *CloseError.
func waitDone(t *testing.T, s *lsp.Session) *lsp.CloseError {
	t.Helper()
	select {
	case <-s.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the session did not end")
	}
	var ce *lsp.CloseError
	if err := s.Err(); !errors.As(err, &ce) || !errors.Is(err, lsp.ErrClosed) {
		t.Fatalf("Err() = %v, want a *CloseError", err)
	}
	return ce
}

func read(t *testing.T, s *lsp.Session) map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := s.ReadMessage(ctx)
	if err != nil {
		t.Fatalf("ReadMessage: %v", err)
	}
	var v map[string]any
	if err := json.Unmarshal(m, &v); err != nil {
		t.Fatalf("message %q: %v", m, err)
	}
	return v
}

func TestSessionRoundTrip(t *testing.T) {
	f := newFixture(t, lsp.Options{})
	s := f.open(t, "echo")
	if calls := f.sandbox.Calls(); calls != 1 {
		t.Fatalf("preparations: %d", calls)
	}
	l := f.sandbox.LastLease()
	if l.Kind() != sandbox.LeaseLSP || l.ID() != s.LeaseID() || l.AccountUserID() != 3 {
		t.Errorf("lease %s kind %s account %d", l.ID(), l.Kind(), l.AccountUserID())
	}
	for i := 1; i <= 3; i++ {
		if err := s.Send([]byte(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"m%d","params":{"x":"é"}}`, i, i))); err != nil {
			t.Fatal(err)
		}
	}
	for i := 1; i <= 3; i++ {
		v := read(t, s)
		res, _ := v["result"].(map[string]any)
		if v["id"] != float64(i) || res["echo"] != fmt.Sprintf("m%d", i) {
			t.Fatalf("reply %d: %v", i, v)
		}
	}
	// The lease is heartbeated while the session lives.
	deadline := time.Now().Add(5 * time.Second)
	for l.Heartbeats.Load() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("heartbeats: %d", l.Heartbeats.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if ce := waitDone(t, s); ce.Reason != lsp.ReasonClosed {
		t.Errorf("reason %s: %s", ce.Reason, ce.Message)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if !l.Released() || f.sandbox.Cancels() != 1 {
		t.Errorf("released %v cancels %d", l.Released(), f.sandbox.Cancels())
	}
	if _, err := s.ReadMessage(context.Background()); !errors.Is(err, lsp.ErrClosed) {
		t.Errorf("ReadMessage after Close: %v", err)
	}
	if err := s.Send([]byte(`{}`)); !errors.Is(err, lsp.ErrClosed) {
		t.Errorf("Send after Close: %v", err)
	}
	sandboxtest.AssertNoProcesses(t, f.token)
}

// TestSessionExit: a reply written just before the server exits is
// delivered, then the exit ends the session without a cancel.
func TestSessionExit(t *testing.T) {
	f := newFixture(t, lsp.Options{})
	s := f.open(t, "echo")
	if err := s.Send([]byte(`{"jsonrpc":"2.0","id":"last","method":"bye"}`)); err != nil {
		t.Fatal(err)
	}
	if v := read(t, s); v["id"] != "last" {
		t.Fatalf("reply %v", v)
	}
	ce := waitDone(t, s)
	if ce.Reason != lsp.ReasonExited || ce.Exit == nil || ce.Exit.Code == nil || *ce.Exit.Code != 0 {
		t.Fatalf("reason %s %q exit %+v", ce.Reason, ce.Message, ce.Exit)
	}
	if f.sandbox.Cancels() != 0 || !f.sandbox.LastLease().Released() {
		t.Errorf("cancels %d released %v", f.sandbox.Cancels(), f.sandbox.LastLease().Released())
	}

	s = f.open(t, "echo")
	if err := s.Send([]byte(`{"jsonrpc":"2.0","method":"crash"}`)); err != nil {
		t.Fatal(err)
	}
	ce = waitDone(t, s)
	if ce.Reason != lsp.ReasonExited || ce.Exit == nil || ce.Exit.Code == nil || *ce.Exit.Code != 3 || !strings.Contains(ce.Message, "code 3") {
		t.Fatalf("reason %s %q exit %+v", ce.Reason, ce.Message, ce.Exit)
	}
	sandboxtest.AssertNoProcesses(t, f.token)
}

// TestSessionServerProtocol: malformed output from the server ends the
// session with a clear reason and tears the (still running) server down.
func TestSessionServerProtocol(t *testing.T) {
	f := newFixture(t, lsp.Options{MaxMessage: 1 << 20, Drain: 200 * time.Millisecond})
	for _, tt := range []struct {
		server, reason string
		want           error
	}{
		{"badlength", "invalid Content-Length", lsp.ErrFraming},
		{"nolength", "missing Content-Length", lsp.ErrFraming},
		{"huge", "exceeds the 1048576-byte limit", lsp.ErrTooLarge},
		{"notjson", "not a JSON object", lsp.ErrNotJSON},
	} {
		t.Run(tt.server, func(t *testing.T) {
			cancels := f.sandbox.Cancels()
			s := f.open(t, tt.server)
			ce := waitDone(t, s)
			if ce.Reason != lsp.ReasonServerProtocol || !errors.Is(ce, tt.want) || !strings.Contains(ce.Message, tt.reason) {
				t.Fatalf("reason %s %q (%v)", ce.Reason, ce.Message, ce.Err)
			}
			if f.sandbox.Cancels() != cancels+1 || !f.sandbox.LastLease().Released() {
				t.Errorf("cancels %d released %v", f.sandbox.Cancels()-cancels, f.sandbox.LastLease().Released())
			}
			sandboxtest.AssertNoProcesses(t, f.token)
		})
	}
	t.Run("closeout", func(t *testing.T) {
		s := f.open(t, "closeout")
		ce := waitDone(t, s)
		if ce.Reason != lsp.ReasonExited || !strings.Contains(ce.Message, "closed its output") {
			t.Fatalf("reason %s %q", ce.Reason, ce.Message)
		}
		sandboxtest.AssertNoProcesses(t, f.token)
	})
}

// TestSessionClientProtocol: a message from the client that is not a JSON
// object ends the session.
func TestSessionClientProtocol(t *testing.T) {
	f := newFixture(t, lsp.Options{MaxMessage: 64})
	for _, tt := range []struct {
		name, msg string
		want      error
	}{
		{"not json", `Content-Length: 2`, lsp.ErrNotJSON},
		{"array", `[{"id":1}]`, lsp.ErrNotJSON},
		{"too large", `{"a":"` + strings.Repeat("x", 100) + `"}`, lsp.ErrTooLarge},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := f.open(t, "echo")
			err := s.Send([]byte(tt.msg))
			var ce *lsp.CloseError
			if !errors.As(err, &ce) || ce.Reason != lsp.ReasonClientProtocol || !errors.Is(err, tt.want) {
				t.Fatalf("Send: %v", err)
			}
			if got := waitDone(t, s); got != ce {
				t.Errorf("Err() %v, Send returned %v", got, ce)
			}
			sandboxtest.AssertNoProcesses(t, f.token)
		})
	}
}

// TestSessionHeartbeatFailure: a failed heartbeat tears the server down:
// cancelled, lease released, no process left.
func TestSessionHeartbeatFailure(t *testing.T) {
	f := newFixture(t, lsp.Options{})
	s := f.open(t, "echo")
	if err := s.Send([]byte(`{"jsonrpc":"2.0","id":1,"method":"ping"}`)); err != nil {
		t.Fatal(err)
	}
	read(t, s)
	if len(processesWith(f.token)) == 0 {
		t.Fatal("the server is not running")
	}
	l := f.sandbox.LastLease()
	gone := errors.New("lease store gone")
	l.HeartbeatErr.Store(&gone)
	ce := waitDone(t, s)
	if ce.Reason != lsp.ReasonHeartbeat || !errors.Is(ce, gone) || !strings.Contains(ce.Message, "lease heartbeat failed") {
		t.Fatalf("reason %s %q", ce.Reason, ce.Message)
	}
	if f.sandbox.Cancels() != 1 || l.Releases.Load() != 1 {
		t.Errorf("cancels %d releases %d", f.sandbox.Cancels(), l.Releases.Load())
	}
	sandboxtest.AssertNoProcesses(t, f.token)
	if err := s.Send([]byte(`{}`)); !errors.Is(err, lsp.ErrClosed) {
		t.Errorf("Send after the end: %v", err)
	}
}

func TestOpenRefusals(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, lsp.Options{})
	if _, err := f.ctl.Open(ctx, f.actor, f.project, "nope"); !errors.Is(err, lsp.ErrUnknownServer) {
		t.Errorf("unknown server: %v", err)
	}
	host := sandbox.ProjectRef{Kind: sandbox.ProjectHost, ProjectID: 7}
	if _, err := f.ctl.Open(ctx, f.actor, host, "echo"); !errors.Is(err, lsp.ErrUnsupportedProject) {
		t.Errorf("host project: %v", err)
	}
	if _, err := f.ctl.Open(ctx, sandbox.Actor{}, f.project, "echo"); !errors.Is(err, sandbox.ErrNoActor) {
		t.Errorf("no actor: %v", err)
	}
	if n := f.sandbox.Calls(); n != 0 {
		t.Errorf("refusals reached the provider %d times", n)
	}

	// A provider that prepares a host execution for the managed project:
	// core's target check refuses it and releases the lease.
	f.sandbox.Kind = sandbox.ProjectHost
	_, err := f.ctl.Open(ctx, f.actor, f.project, "echo")
	var cmdErr *sandbox.CommandError
	if !errors.As(err, &cmdErr) || cmdErr.Kind != sandbox.KindPrepare || !f.sandbox.LastLease().Released() {
		t.Errorf("host target: %v", err)
	}
	f.sandbox.Kind = sandbox.ProjectManaged

	// A refused preparation.
	f.sandbox.Refuse = fmt.Errorf("no: %w", sandbox.ErrDenied)
	if _, err := f.ctl.Open(ctx, f.actor, f.project, "echo"); !errors.Is(err, sandbox.ErrDenied) {
		t.Errorf("refused: %v", err)
	}
	f.sandbox.Refuse = nil

	// A program that cannot start: cancelled and released.
	self, _ := os.Executable()
	g := newFixture(t, lsp.Options{Servers: map[string][]string{"missing": {filepath.Join(filepath.Dir(self), "no-such-server")}}})
	if _, err := g.ctl.Open(ctx, g.actor, g.project, "missing"); !errors.Is(err, sandbox.ErrNotStarted) {
		t.Errorf("missing program: %v", err)
	}
	if l := g.sandbox.LastLease(); l == nil || !l.Released() || g.sandbox.Cancels() != 1 {
		t.Errorf("missing program: lease %v cancels %d", l, g.sandbox.Cancels())
	}
}

func TestAbsentSandbox(t *testing.T) {
	f := newFixture(t, lsp.Options{}, "sandbox")
	_, err := plugin.ResolveCoreAs[*lsp.Control](f.core.Registry(), plugin.DomainLSP)
	if !errors.Is(err, plugin.ErrAbsent) {
		t.Fatalf("lsp without a sandbox: %v", err)
	}
}

func TestRegistrationRefusesBadServers(t *testing.T) {
	for name, servers := range map[string]map[string][]string{
		"bad name":   {"a/b": {"x"}},
		"empty name": {"": {"x"}},
		"empty argv": {"x": {}},
		"empty file": {"x": {""}},
		"nul":        {"x": {"x", "a\x00b"}},
	} {
		t.Run(name, func(t *testing.T) {
			r := plugin.New(plugin.Options{Logger: testLogger(t)})
			if err := r.RegisterDomain(plugin.DomainLSP, func(any) error { return nil }, plugin.DomainOptions{}); err != nil {
				t.Fatal(err)
			}
			if err := r.RegisterDomain(plugin.DomainSandbox, func(any) error { return nil }, plugin.DomainOptions{}); err != nil {
				t.Fatal(err)
			}
			st := r.Load(context.Background(), []plugin.Registration{lsp.Registration(lsp.Options{Servers: servers})}, plugin.Config{})
			if st[0].State != plugin.StateFailed {
				t.Errorf("state %s", st[0].State)
			}
		})
	}
}

func TestDefaultServers(t *testing.T) {
	d := lsp.DefaultServers()
	if len(d) != 1 || !strings.HasSuffix(strings.Join(d["gopls"], " "), "gopls serve") {
		t.Errorf("defaults %v", d)
	}
	d["gopls"][0] = "changed"
	if lsp.DefaultServers()["gopls"][0] == "changed" {
		t.Error("DefaultServers shares its slices")
	}
}

// processesWith lists live processes whose command line contains token.
func processesWith(token string) []string {
	var found []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), token) {
			found = append(found, e.Name())
		}
	}
	return found
}
