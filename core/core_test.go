package core_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/pdeath"

	"go.uber.org/goleak"

	"github.com/corral-sandbox/corral/confine"
	"github.com/corral-sandbox/corral/core"
	"github.com/corral-sandbox/corral/internal/testworker"
	"github.com/corral-sandbox/corral/lease"
	"github.com/corral-sandbox/corral/machine"
	"github.com/corral-sandbox/corral/plugin"
	sitesplugin "github.com/corral-sandbox/corral/plugins/sites"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/sandbox/sandboxtest"
	"github.com/corral-sandbox/corral/store"
	"github.com/corral-sandbox/corral/worker"
)

func TestMain(m *testing.M) {
	confine.MaybeRun()
	worker.MaybeRunInit()
	testworker.MaybeRunChild()
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction(pdeath.SpawnerFunc))
}

// env is a built core with one account that is a member of a host project
// and, when a worker is given, of a managed project.
type env struct {
	core    *core.Core
	actor   sandbox.Actor
	host    store.Project
	managed store.Project
}

// workerHandle is a test worker: in-process or a child process.
type workerHandle interface {
	Workspace(t testing.TB, name string) string
}

func socketOf(w workerHandle) string {
	switch w := w.(type) {
	case *testworker.Worker:
		return w.Socket
	case *testworker.Process:
		return w.Socket
	}
	return ""
}

func build(t *testing.T, opts core.Options, w workerHandle) *env { return buildTB(t, opts, w) }

func buildB(b *testing.B, w workerHandle) *env { return buildTB(b, core.Options{}, w) }

func buildTB(t testing.TB, opts core.Options, w workerHandle) *env {
	t.Helper()
	ctx := context.Background()
	if opts.StorePath == "" && opts.Store == nil {
		opts.StorePath = filepath.Join(t.TempDir(), "corral.db")
		opts.Migrate = true
	}
	if w != nil {
		opts.PrivilegedTransport = machine.SocketTransport{Path: socketOf(w)}
	}
	if opts.Logger == nil && !testing.Verbose() {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	c, err := core.Build(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	st := c.Store()
	acct, err := st.CreateAccount(ctx, "alice")
	must(t, err)
	e := &env{core: c, actor: sandbox.Actor{AccountUserID: acct.ID}}
	e.host, err = st.CreateProject(ctx, store.NewProject{Kind: store.ProjectHost, Name: "h", Root: t.TempDir()})
	must(t, err)
	_, err = st.AddMember(ctx, store.Member{Project: e.host.ID, Account: acct.ID, Role: store.RoleOwner})
	must(t, err)
	ws := t.TempDir()
	if w != nil {
		ws = w.Workspace(t, "m")
	}
	e.managed, err = st.CreateProject(ctx, store.NewProject{Kind: store.ProjectManaged, Name: "m", Root: ws})
	must(t, err)
	_, err = st.AddMember(ctx, store.Member{Project: e.managed.ID, Account: acct.ID, Role: store.RoleOwner})
	must(t, err)
	return e
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func (e *env) ref(p store.Project) sandbox.ProjectRef {
	return sandbox.ProjectRef{Kind: sandbox.ProjectKind(p.Kind), ProjectID: p.ID}
}

func (e *env) input(p store.Project, argv ...string) sandbox.ExecInput {
	return sandbox.ExecInput{
		Command:   sandbox.Command{Type: "argv", File: argv[0], Args: argv[1:]},
		LeaseKind: sandbox.LeaseTerminal,
		Project:   e.ref(p),
	}
}

func (e *env) liveLeases(t *testing.T) int {
	n, err := e.core.Leases().LiveCount(context.Background())
	must(t, err)
	return n
}

// TestManagedConformance runs the provider conformance suite against
// managed projects through a real worker over a real socket.
func TestManagedConformance(t *testing.T) {
	w := testworker.Start(t, testworker.Options{})
	e := build(t, core.Options{}, w)
	ctl, err := e.core.Sandbox()
	must(t, err)
	sandboxtest.Run(t, sandboxtest.Target{
		Control: ctl, Actor: e.actor, Project: e.ref(e.managed),
		HostCwd: e.managed.Root, HostPath: e.managed.Root, DisplayPath: "/workspace",
		LiveLeases: e.liveLeases, Terminal: true,
	})
}

// TestNoTransport: without a privileged transport, managed commands fail
// at once with ErrNoPrivilegedTransport and host commands still run.
func TestNoTransport(t *testing.T) {
	e := build(t, core.Options{}, nil)
	ctl, err := e.core.Sandbox()
	must(t, err)
	ctx := context.Background()
	_, err = ctl.RunCommand(ctx, e.input(e.managed, "true"), &e.actor, nil)
	if !errors.Is(err, machine.ErrNoPrivilegedTransport) || sandbox.KindOf(err) != sandbox.KindPrepare {
		t.Fatalf("managed without transport: %v", err)
	}
	if !strings.Contains(err.Error(), "no privileged transport in this process") {
		t.Errorf("message %q", err)
	}
	if _, err := e.core.Gateway().Dial(ctx, wireProject(e.managed), 80); !errors.Is(err, machine.ErrNoPrivilegedTransport) {
		t.Errorf("Dial without transport: %v", err)
	}
	res, err := ctl.RunCommand(ctx, e.input(e.host, "echo", "host"), &e.actor, nil)
	if err != nil || res.Stdout != "host\n" {
		t.Fatalf("host command: %+v %v", res, err)
	}
	if n := e.liveLeases(t); n != 0 {
		t.Errorf("%d live leases", n)
	}
}

// TestSandboxAbsentIsUnavailable: with the sandbox plugin disabled, the
// control resolves as absent and callers get ErrUnavailable.
func TestSandboxAbsentIsUnavailable(t *testing.T) {
	e := build(t, core.Options{PluginConfig: plugin.Config{Disabled: []string{"sandbox"}}}, nil)
	if _, err := e.core.Sandbox(); !errors.Is(err, sandbox.ErrUnavailable) {
		t.Fatalf("Sandbox() = %v, want ErrUnavailable", err)
	}
	a, err := e.core.Artifacts()
	if err == nil {
		// sandboxArtifacts requires sandbox: absent too.
		_, err = a.ReadFile(context.Background(), core.ArtifactRequest{Actor: e.actor, Project: e.ref(e.host), Path: "/workspace/x", LeaseKind: sandbox.LeaseGitHub}, 10)
	}
	if err == nil {
		t.Fatal("artifacts usable without a sandbox")
	}
}

// TestProviderCannotSubstituteRunner: whatever a plugin provides for the
// sandbox domain, resolvers get core's Control.
func TestProviderCannotSubstituteRunner(t *testing.T) {
	fake := &sandboxtest.Provider{Kind: sandbox.ProjectHost}
	reg := func(core.Deps) plugin.Registration {
		return plugin.Registration{
			Manifest: plugin.Manifest{Name: "fake", Version: "1", Provides: []plugin.Domain{plugin.DomainSandbox}},
			Register: func(c *plugin.Context) error { return c.Provide(plugin.DomainSandbox, fake) },
		}
	}
	e := build(t, core.Options{Plugins: []core.PluginFactory{core.Plugin(reg)}}, nil)
	ctl, err := e.core.Sandbox()
	must(t, err)
	res, err := ctl.RunCommand(context.Background(), e.input(e.host, "echo", "x"), &e.actor, nil)
	if err != nil || res.Stdout != "x\n" {
		t.Fatal(res, err)
	}
	if fake.Calls() != 1 || fake.LastLease().Releases.Load() != 1 {
		t.Fatalf("core's RunCommand did not drive the fake provider: calls %d", fake.Calls())
	}
}

// TestPluginCannotResolveArtifacts: sandboxArtifacts is core's alone.
func TestPluginCannotResolveArtifacts(t *testing.T) {
	var resolveErrs []error
	spy := func(core.Deps) plugin.Registration {
		return plugin.Registration{
			Manifest: plugin.Manifest{Name: "spy", Version: "1", Consumes: []plugin.Domain{plugin.DomainSandbox}},
			Register: func(c *plugin.Context) error {
				for _, name := range []plugin.Domain{"sandboxArtifacts", "SandboxArtifacts", "sandbox_artifacts", "sandboxartifacts"} {
					_, err := c.Consumer().Resolve(name)
					resolveErrs = append(resolveErrs, err)
				}
				return nil
			},
		}
	}
	e := build(t, core.Options{Plugins: append(core.Builtins(), core.Plugin(spy))}, nil)
	for i, err := range resolveErrs {
		if err == nil {
			t.Errorf("spelling %d resolved sandboxArtifacts", i)
		}
	}
	// Declaring it is refused outright.
	decl := func(core.Deps) plugin.Registration {
		return plugin.Registration{
			Manifest: plugin.Manifest{Name: "decl", Version: "1", Consumes: []plugin.Domain{plugin.DomainSandboxArtifacts}},
			Register: func(*plugin.Context) error { return nil },
		}
	}
	e2 := build(t, core.Options{Plugins: append(core.Builtins(), core.Plugin(decl))}, nil)
	if st, _ := e2.core.Registry().Status("decl"); st.State != plugin.StateFailed {
		t.Errorf("plugin declaring sandboxArtifacts: state %s", st.State)
	}
	if _, err := e.core.Artifacts(); err != nil {
		t.Errorf("core cannot resolve its own artifacts control: %v", err)
	}
}

// TestJournal: every command leaves a row stamped with the owner's domain,
// its lease, redacted argv, limits and outcome.
func TestJournal(t *testing.T) {
	e := build(t, core.Options{}, nil)
	ctl, err := e.core.Sandbox()
	must(t, err)
	ctx := context.Background()
	_, err = ctl.RunCommand(ctx, e.input(e.host, "sh", "-c", "echo hi; exit 3", "https://bob:hunter2@example.invalid/x", "--token", "t0ps3cret"), &e.actor,
		&sandbox.RunOptions{OutputLimit: sandbox.OutputLimit{Combined: 4096}})
	must(t, err)
	_, err = ctl.RunCommand(ctx, e.input(e.host, "sleep", "5"), &e.actor, &sandbox.RunOptions{Timeout: 50 * time.Millisecond})
	if sandbox.KindOf(err) != sandbox.KindTimeout {
		t.Fatal(err)
	}
	rows, err := e.core.Store().ListJournal(ctx, store.JournalFilter{Project: e.host.ID})
	must(t, err)
	if len(rows) != 2 {
		t.Fatalf("%d journal rows, want 2", len(rows))
	}
	timeout, exit := rows[0], rows[1]
	if exit.Domain != "sandbox" || exit.Account != e.actor.AccountUserID || exit.Lease == "" || exit.LeaseKind != "terminal" {
		t.Errorf("row = %+v", exit.JournalCommand)
	}
	argv := strings.Join(exit.Argv, " ")
	if strings.Contains(argv, "hunter2") || strings.Contains(argv, "t0ps3cret") || !strings.Contains(argv, "[REDACTED]") {
		t.Errorf("argv not redacted: %q", argv)
	}
	if exit.Limits.Combined != 4096 || exit.End.Outcome != store.OutcomeExit || *exit.End.Code != 3 || exit.End.StdoutBytes != 3 {
		t.Errorf("exit row = %+v %+v", exit.Limits, exit.End)
	}
	if timeout.End.Outcome != store.OutcomeError || timeout.End.ErrorKind != "timeout" || timeout.Ended.IsZero() {
		t.Errorf("timeout row = %+v", timeout.End)
	}
}

// TestRunnerCoreNeverMigrates: a core built with Migrate false refuses a
// schema it does not know, runs no plugin services and publishes no Sites
// control even with the Sites plugin in its list (fails when that is tied
// to the runner's plugin list instead).
func TestRunnerCoreNeverMigrates(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "corral.db")
	if _, err := core.Build(ctx, core.Options{StorePath: path}); !errors.Is(err, store.ErrSchemaMismatch) {
		t.Fatalf("un-migrated store: %v", err)
	}
	if _, err := os.Stat(path); err == nil {
		t.Fatal("a non-migrating core created the database")
	}
	c, err := core.Build(ctx, core.Options{StorePath: path, Migrate: true})
	must(t, err)
	if c.Services() == nil {
		t.Error("a migrating core has no service manager")
	}
	if _, err := plugin.ResolveCoreAs[sitesplugin.Control](c.Registry(), plugin.DomainSites); err != nil {
		t.Errorf("a migrating core with the built-in plugins has no Sites control: %v", err)
	}
	c.Close()
	// The same plugin list (the built-ins, Sites among them) without
	// Migrate: no Sites control, which is the daemon's alone.
	r, err := core.Build(ctx, core.Options{StorePath: path})
	must(t, err)
	if r.Services() != nil {
		t.Error("a runner core has a plugin-service manager")
	}
	if ctl, err := plugin.ResolveCoreAs[sitesplugin.Control](r.Registry(), plugin.DomainSites); err == nil {
		t.Errorf("a core built with Migrate false resolves a Sites control: %T", ctl)
	}
	r.Close()
	// A newer schema is refused.
	db, err := sql.Open("sqlite", path)
	must(t, err)
	_, err = db.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", store.LatestVersion()+1))
	must(t, err)
	db.Close()
	if _, err := core.Build(ctx, core.Options{StorePath: path}); !errors.Is(err, store.ErrSchemaMismatch) {
		t.Fatalf("newer schema: %v", err)
	}
}

// TestArtifacts reads a file out of a managed machine, refuses symlinks,
// oversized files and paths outside the guest roots, and deletes.
func TestArtifacts(t *testing.T) {
	w := testworker.Start(t, testworker.Options{})
	e := build(t, core.Options{}, w)
	a, err := e.core.Artifacts()
	must(t, err)
	ctx := context.Background()
	data := make([]byte, 5<<20+17)
	for i := range data {
		data[i] = byte(i * 7)
	}
	must(t, os.WriteFile(filepath.Join(e.managed.Root, "blob"), data, 0o644))
	must(t, os.Symlink("/etc/hostname", filepath.Join(e.managed.Root, "link")))
	req := func(p string) core.ArtifactRequest {
		return core.ArtifactRequest{Actor: e.actor, Project: e.ref(e.managed), Path: p, LeaseKind: sandbox.LeaseGitHub}
	}
	got, err := a.ReadFile(ctx, req("/workspace/blob"), 8<<20)
	must(t, err)
	if string(got) != string(data) {
		t.Fatalf("read %d bytes, content differs", len(got))
	}
	if _, err := a.ReadFile(ctx, req("/workspace/blob"), 1<<20); !errors.Is(err, core.ErrArtifactTooLarge) {
		t.Errorf("oversized: %v", err)
	}
	if _, err := a.ReadFile(ctx, req("/workspace/link"), 1<<20); !errors.Is(err, core.ErrArtifactNotFile) {
		t.Errorf("symlink: %v", err)
	}
	for _, p := range []string{"/etc/passwd", "workspace/blob", "/workspace/../etc/passwd", "/workspace/a\x00b"} {
		if _, err := a.ReadFile(ctx, req(p), 1<<20); !errors.Is(err, core.ErrArtifactPath) {
			t.Errorf("path %q: %v", p, err)
		}
	}
	must(t, a.Delete(ctx, req("/workspace/blob")))
	if _, err := os.Stat(filepath.Join(e.managed.Root, "blob")); !os.IsNotExist(err) {
		t.Errorf("blob not deleted: %v", err)
	}
	if n := e.liveLeases(t); n != 0 {
		t.Errorf("%d live leases", n)
	}
}

// TestLeaseLostInterruptsCommand: when a command's lease stops being live
// behind its holder's back (released or expired by another process), the
// next keep-alive heartbeat fails and the command is cancelled with a
// transport error.
func TestLeaseLostInterruptsCommand(t *testing.T) {
	e := build(t, core.Options{Control: sandbox.ControlOptions{HeartbeatInterval: 100 * time.Millisecond}}, nil)
	ctl, err := e.core.Sandbox()
	must(t, err)
	ctx := context.Background()
	tok := sandboxtest.SleepToken()
	start := time.Now()
	_, err = ctl.RunCommand(ctx, e.input(e.host, "sleep", tok), &e.actor, &sandbox.RunOptions{
		Timeout: 30 * time.Second,
		OnStart: func(si sandbox.StartInfo) error {
			time.AfterFunc(200*time.Millisecond, func() {
				_, _ = e.core.Store().ReleaseLease(context.Background(), si.LeaseID, time.Now())
			})
			return nil
		},
	})
	if sandbox.KindOf(err) != sandbox.KindTransport {
		t.Fatalf("err = %v, want transport", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("took %v to notice the lost lease", d)
	}
	sandboxtest.AssertNoProcesses(t, "sleep "+tok)
}

// TestJournalBeforeStart: by the time a command starts (OnStart, called
// immediately before), its lease is live in the store and its journal entry
// is there, running, naming that lease: a crash from then on leaves both
// (they are written by one statement). A command refused at preparation
// leaves neither.
func TestJournalBeforeStart(t *testing.T) {
	e := build(t, core.Options{}, nil)
	ctl, err := e.core.Sandbox()
	must(t, err)
	ctx := context.Background()
	st := e.core.Store()
	var seen bool
	_, err = ctl.RunCommand(ctx, e.input(e.host, "true"), &e.actor, &sandbox.RunOptions{OnStart: func(info sandbox.StartInfo) error {
		l, err := st.GetLease(ctx, info.LeaseID)
		if err != nil || l.State != store.LeaseLive {
			t.Errorf("lease at start: %+v, %v", l, err)
		}
		rows, err := st.ListJournal(ctx, store.JournalFilter{Project: e.host.ID})
		if err != nil || len(rows) != 1 || rows[0].Lease != info.LeaseID || rows[0].End.Outcome != "" {
			t.Errorf("journal at start: %+v, %v", rows, err)
		}
		seen = true
		return nil
	}})
	must(t, err)
	if !seen {
		t.Fatal("OnStart was not called")
	}
	rows, err := st.ListJournal(ctx, store.JournalFilter{Project: e.host.ID})
	must(t, err)
	if len(rows) != 1 || rows[0].End.Outcome != store.OutcomeExit || *rows[0].End.Code != 0 {
		t.Fatalf("journal after the exit: %+v", rows)
	}
	stranger, err := st.CreateAccount(ctx, "mallory")
	must(t, err)
	_, err = ctl.RunCommand(ctx, e.input(e.host, "true"), &sandbox.Actor{AccountUserID: stranger.ID}, nil)
	if !errors.Is(err, sandbox.ErrDenied) {
		t.Fatalf("non-member: %v", err)
	}
	if rows, _ := st.ListJournal(ctx, store.JournalFilter{}); len(rows) != 1 {
		t.Fatalf("%d journal rows after a refused command, want 1", len(rows))
	}
}

// TestHeartbeatInterval: three heartbeats per lease TTL, at most the
// default 5 s (the daemon's and the runner's rule, written once).
func TestHeartbeatInterval(t *testing.T) {
	for ttl, want := range map[time.Duration]time.Duration{
		lease.DefaultTTL:       5 * time.Second,
		time.Minute:            5 * time.Second,
		6 * time.Second:        2 * time.Second,
		300 * time.Millisecond: 100 * time.Millisecond,
	} {
		if got := core.HeartbeatInterval(ttl); got != want {
			t.Errorf("HeartbeatInterval(%v) = %v, want %v", ttl, got, want)
		}
	}
}
