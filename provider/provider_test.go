package provider

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/pdeath"

	"github.com/corral-sandbox/corral/confine"
	"github.com/corral-sandbox/corral/lease"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/sandbox/sandboxtest"
	"github.com/corral-sandbox/corral/store"
	"github.com/corral-sandbox/corral/worker"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) {
	// The test binary is the confinement helper of the provider under test
	// (Options.SelfExe defaults to os.Executable()).
	confine.MaybeRun()
	worker.MaybeRunInit() // the machines of the tests with a real worker
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction(pdeath.SpawnerFunc))
}

// fixture is a store with one host project, one member and the provider.
type fixture struct {
	st        store.Store
	leases    *lease.Manager
	p         *Provider
	ctrl      *sandbox.Control
	root      string // the project root (host path)
	actorRoot string // an extra root of the actor
	actor     sandbox.Actor
	project   sandbox.ProjectRef
}

type fixtureOpts struct {
	trusted bool
	env     []string
}

func newFixture(tb testing.TB, fo fixtureOpts) *fixture {
	tb.Helper()
	ctx := context.Background()
	dir := tb.TempDir()
	// As root, commands run as the project's user, who must reach the
	// roots: the test's temporary directory is 0700.
	if err := os.Chmod(filepath.Dir(dir), 0o711); err != nil {
		tb.Fatal(err)
	}
	st, err := store.Open(ctx, filepath.Join(dir, "corral.db"), store.Options{Migrate: true})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { st.Close() })
	root := filepath.Join(dir, "project")
	actorRoot := filepath.Join(dir, "actor-root")
	for _, d := range []string{root, actorRoot} {
		if err := os.Mkdir(d, 0o755); err != nil {
			tb.Fatal(err)
		}
	}
	acct, err := st.CreateAccount(ctx, "alice")
	if err != nil {
		tb.Fatal(err)
	}
	proj, err := st.CreateProject(ctx, store.NewProject{Kind: store.ProjectHost, Name: "host-project", Root: root})
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := st.AddMember(ctx, store.Member{Project: proj.ID, Account: acct.ID, Role: store.RoleOwner, Trusted: fo.trusted}); err != nil {
		tb.Fatal(err)
	}
	mgr := lease.NewManager(st, lease.Options{HeartbeatWindow: -1})
	p, err := New(Options{Store: st, Leases: mgr, Env: fo.env, HostIDs: HostIDs{Registry: filepath.Join(dir, "id-ranges.json")}})
	if err != nil {
		tb.Fatal(err)
	}
	return &fixture{
		st: st, leases: mgr, p: p,
		ctrl:      sandbox.NewControl(p, sandbox.ControlOptions{HeartbeatInterval: 50 * time.Millisecond}),
		root:      root,
		actorRoot: actorRoot,
		actor:     sandbox.Actor{AccountUserID: acct.ID, Roots: []string{actorRoot}},
		project:   sandbox.ProjectRef{Kind: sandbox.ProjectHost, ProjectID: proj.ID},
	}
}

func requireLandlock(tb testing.TB) {
	tb.Helper()
	if _, err := confine.Available(); err != nil {
		tb.Skipf("confined host commands need Landlock: %v", err)
	}
}

func (f *fixture) input(cwd string, argv ...string) sandbox.ExecInput {
	return sandbox.ExecInput{
		Command:   sandbox.Command{Type: sandbox.CommandTypeArgv, File: argv[0], Args: argv[1:]},
		Cwd:       cwd,
		LeaseKind: sandbox.LeaseTerminal,
		Project:   f.project,
	}
}

func (f *fixture) run(t *testing.T, cwd string, argv ...string) (*sandbox.CommandResult, error) {
	t.Helper()
	a := f.actor
	return f.ctrl.RunCommand(context.Background(), f.input(cwd, argv...), &a, nil)
}

// leases returns every lease of the project, in any state.
func (f *fixture) leaseRows(t testing.TB, state store.LeaseState) []store.Lease {
	t.Helper()
	rows, err := f.st.ListLeases(context.Background(), store.LeaseFilter{Project: f.project.ProjectID, State: state})
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

func (f *fixture) target() sandboxtest.Target {
	return sandboxtest.Target{
		Control:     f.ctrl,
		Actor:       f.actor,
		Project:     f.project,
		HostCwd:     f.root,
		HostPath:    f.root,
		DisplayPath: DisplayRoot,
		LiveLeases:  func(t *testing.T) int { return len(f.leaseRows(t, store.LeaseLive)) },
		Terminal:    true,
	}
}

func TestConformance(t *testing.T) {
	t.Run("Confined", func(t *testing.T) {
		requireLandlock(t)
		sandboxtest.Run(t, newFixture(t, fixtureOpts{}).target())
	})
	t.Run("Direct", func(t *testing.T) {
		sandboxtest.Run(t, newFixture(t, fixtureOpts{trusted: true}).target())
	})
}

func TestModeFollowsTrust(t *testing.T) {
	for _, tc := range []struct {
		trusted bool
		mode    sandbox.LocalMode
	}{{false, sandbox.LocalConfined}, {true, sandbox.LocalDirect}} {
		t.Run(string(tc.mode), func(t *testing.T) {
			if !tc.trusted {
				requireLandlock(t)
			}
			f := newFixture(t, fixtureOpts{trusted: tc.trusted})
			a := f.actor
			prep, err := f.ctrl.PrepareExecution(context.Background(), f.input("", "true"), &a)
			if err != nil {
				t.Fatal(err)
			}
			lp := prep.(*LocalPrepared)
			defer lp.Lease.Release(context.Background())
			if lp.Mode != tc.mode {
				t.Fatalf("mode = %s, want %s", lp.Mode, tc.mode)
			}
			if lp.Launch.ExecStatus != (tc.mode == sandbox.LocalConfined) {
				t.Errorf("ExecStatus = %v in %s mode", lp.Launch.ExecStatus, tc.mode)
			}
			if tc.mode == sandbox.LocalDirect && lp.Launch.Path != "/usr/bin/true" && lp.Launch.Path != "/bin/true" {
				t.Errorf("direct launch path = %q, want the resolved true", lp.Launch.Path)
			}
			if tc.mode == sandbox.LocalConfined && (len(lp.Launch.Args) < 2 || lp.Launch.Args[1] != confine.Arg) {
				t.Errorf("confined launch args = %q, want the helper", lp.Launch.Args)
			}
			c := lp.Launch.Confine
			switch {
			case tc.mode == sandbox.LocalDirect && c != nil:
				t.Errorf("direct launch carries a confinement %+v", c)
			case tc.mode == sandbox.LocalConfined && c == nil:
				t.Errorf("confined launch carries no confinement")
			case tc.mode == sandbox.LocalConfined:
				if c.Path != "/usr/bin/true" && c.Path != "/bin/true" {
					t.Errorf("confinement path = %q, want the resolved true", c.Path)
				}
				if !slices.Equal(c.Args, []string{"true"}) || !slices.Equal(c.Writable, []string{f.root, f.actorRoot}) {
					t.Errorf("confinement = %+v, want argv [true] writable [%s %s]", c, f.root, f.actorRoot)
				}
			}
		})
	}
}

// LocalPrepared is a shorthand for the type assertion above.
type LocalPrepared = sandbox.LocalPrepared

func TestConfinedWrites(t *testing.T) {
	requireLandlock(t)
	f := newFixture(t, fixtureOpts{})
	outside := fmt.Sprintf("/tmp/outside-%d-%d", os.Getpid(), time.Now().UnixNano())
	t.Cleanup(func() { os.Remove(outside) })

	res, err := f.run(t, "", "sh", "-c", "echo x > "+outside)
	if err != nil {
		t.Fatal(err)
	}
	if res.Code == nil || *res.Code == 0 {
		t.Errorf("writing %s: result %+v, want a nonzero exit", outside, res)
	}
	if !strings.Contains(res.Stderr, "Permission denied") {
		t.Errorf("stderr = %q, want a permission error", res.Stderr)
	}
	if _, err := os.Stat(outside); err == nil {
		t.Fatalf("%s was created by a confined command", outside)
	}

	// Writing to the standard streams through their /dev names, and to
	// /dev/null with truncation, is not a write to disk and works.
	res, err = f.run(t, "", "sh", "-c", "echo o > /dev/stdout; echo e > /dev/stderr; echo n > /dev/null")
	if err != nil || *res.Code != 0 || res.Stdout != "o\n" || res.Stderr != "e\n" {
		t.Fatalf("writing to /dev/stdout, /dev/stderr, /dev/null: %+v, %v", res, err)
	}

	inActor := filepath.Join(f.actorRoot, "a")
	res, err = f.run(t, "", "sh", "-c", "echo in > in-root && echo actor > "+inActor)
	if err != nil || *res.Code != 0 {
		t.Fatalf("writing in the roots: %+v, %v", res, err)
	}
	for _, p := range []string{filepath.Join(f.root, "in-root"), inActor} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s was not written: %v", p, err)
		}
	}
}

// TestConfinedHelperLaunch starts a confined Launch as a process, as a
// consumer other than RunCommand does (the helper's invocation): it is
// confined like the commands RunCommand forks from a restricted thread.
func TestConfinedHelperLaunch(t *testing.T) {
	requireLandlock(t)
	f := newFixture(t, fixtureOpts{})
	outside := filepath.Join(t.TempDir(), "outside")
	a := f.actor
	prep, err := f.ctrl.PrepareExecution(context.Background(), f.input("", "sh", "-c", "echo in > in-helper; echo x > "+outside), &a)
	if err != nil {
		t.Fatal(err)
	}
	lp := prep.(*LocalPrepared)
	defer lp.Lease.Release(context.Background())
	l := lp.Launch
	cmd := &exec.Cmd{Path: l.Path, Args: l.Args, Env: l.Env, Dir: l.Dir}
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "Permission denied") {
		t.Errorf("helper launch writing outside the roots: err %v, output %q; want a permission error", err, out)
	}
	if _, err := os.Stat(outside); err == nil {
		t.Errorf("%s was created through the helper", outside)
	}
	if _, err := os.Stat(filepath.Join(f.root, "in-helper")); err != nil {
		t.Errorf("the helper's command could not write in the project root: %v", err)
	}
}

func TestDirectIsUnconfined(t *testing.T) {
	f := newFixture(t, fixtureOpts{trusted: true})
	outside := filepath.Join(t.TempDir(), "outside")
	res, err := f.run(t, "", "sh", "-c", "echo x > "+outside)
	if err != nil || *res.Code != 0 {
		t.Fatalf("trusted write outside the roots: %+v, %v", res, err)
	}
	if _, err := os.Stat(outside); err != nil {
		t.Fatalf("trusted (direct) command could not write outside the roots: %v", err)
	}
}

func TestWorkingDirectory(t *testing.T) {
	requireLandlock(t)
	f := newFixture(t, fixtureOpts{})
	elsewhere := t.TempDir()
	for _, d := range []string{"sub", "sub/deeper"} {
		if err := os.Mkdir(filepath.Join(f.root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	must(t, os.Symlink(elsewhere, filepath.Join(f.root, "link-out")))
	must(t, os.Symlink("/tmp", filepath.Join(f.root, "link-tmp")))
	must(t, os.Symlink(filepath.Join(f.root, "sub"), filepath.Join(f.root, "link-in")))
	must(t, os.Symlink(f.root, filepath.Join(elsewhere, "to-root")))
	must(t, os.WriteFile(filepath.Join(f.root, "file"), nil, 0o644))

	ok := []struct{ name, cwd, display string }{
		{"Empty", "", "/workspace"},
		{"Relative", "sub/deeper", "/workspace/sub/deeper"},
		{"DotDotInside", "sub/../sub", "/workspace/sub"},
		{"Absolute", filepath.Join(f.root, "sub"), "/workspace/sub"},
		{"SymlinkInside", "link-in", "/workspace/sub"},
		{"SymlinkFromOutsideToRoot", filepath.Join(elsewhere, "to-root"), "/workspace"},
		{"ActorRoot", f.actorRoot, f.actorRoot},
	}
	for _, tc := range ok {
		t.Run(tc.name, func(t *testing.T) {
			var display string
			a := f.actor
			res, err := f.ctrl.RunCommand(context.Background(), f.input(tc.cwd, "pwd", "-P"), &a,
				&sandbox.RunOptions{OnStart: func(si sandbox.StartInfo) error { display = si.DisplayCwd; return nil }})
			if err != nil {
				t.Fatal(err)
			}
			if display != tc.display || res.Stdout != tc.display+"\n" {
				t.Errorf("cwd %q: display %q, pwd %q; want %q", tc.cwd, display, res.Stdout, tc.display)
			}
		})
	}

	refused := []struct{ name, cwd string }{
		{"DotDot", ".."},
		{"DotDotAbsolute", f.root + "/../"},
		{"DotDotDeep", "sub/../../.."},
		{"SymlinkOut", "link-out"},
		{"SymlinkToTmp", "link-tmp"},
		{"Outside", elsewhere},
		{"Root", "/"},
		{"Missing", "no-such-dir"},
		{"File", "file"},
	}
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			before := len(f.leaseRows(t, ""))
			_, err := f.run(t, tc.cwd, "true")
			if sandbox.KindOf(err) != sandbox.KindPrepare {
				t.Fatalf("cwd %q: error %v, want a prepare error", tc.cwd, err)
			}
			if after := len(f.leaseRows(t, "")); after != before {
				t.Errorf("a refused preparation minted %d lease(s)", after-before)
			}
		})
	}
	t.Run("OutsideWrapsErrOutsideRoots", func(t *testing.T) {
		_, err := f.run(t, "link-out", "true")
		if !errors.Is(err, ErrOutsideRoots) {
			t.Fatalf("error %v does not wrap ErrOutsideRoots", err)
		}
	})
}

func TestBadActorRootRefused(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	for name, roots := range map[string][]string{
		"Relative": {"relative"},
		"Missing":  {filepath.Join(t.TempDir(), "missing")},
	} {
		t.Run(name, func(t *testing.T) {
			a := f.actor
			a.Roots = roots
			_, err := f.ctrl.RunCommand(context.Background(), f.input("", "true"), &a, nil)
			if sandbox.KindOf(err) != sandbox.KindPrepare {
				t.Fatalf("actor roots %q: error %v, want a prepare error", roots, err)
			}
		})
	}
	if n := len(f.leaseRows(t, "")); n != 0 {
		t.Errorf("%d leases minted by refused preparations", n)
	}
}

func TestTenancy(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, fixtureOpts{})
	stranger, err := f.st.CreateAccount(ctx, "mallory")
	if err != nil {
		t.Fatal(err)
	}

	t.Run("NonMemberDenied", func(t *testing.T) {
		a := sandbox.Actor{AccountUserID: stranger.ID, Roots: []string{f.root}}
		_, err := f.ctrl.RunCommand(ctx, f.input("", "true"), &a, nil)
		if sandbox.KindOf(err) != sandbox.KindPrepare || !errors.Is(err, sandbox.ErrDenied) {
			t.Fatalf("error %v, want a prepare error wrapping ErrDenied", err)
		}
		// Tenancy comes first: a non-member learns nothing about paths or
		// the project's kind.
		for _, in := range []sandbox.ExecInput{f.input("../..", "true"), f.input("no-such-dir", "true")} {
			_, err = f.ctrl.RunCommand(ctx, in, &a, nil)
			if !errors.Is(err, sandbox.ErrDenied) || strings.Contains(err.Error(), in.Cwd) {
				t.Errorf("cwd %q: error %v, want only ErrDenied", in.Cwd, err)
			}
		}
		in := f.input("", "true")
		in.Project.Kind = sandbox.ProjectManaged
		if _, err = f.ctrl.RunCommand(ctx, in, &a, nil); !errors.Is(err, sandbox.ErrDenied) {
			t.Errorf("kind mismatch for a non-member: error %v, want ErrDenied", err)
		}
		if n := len(f.leaseRows(t, "")); n != 0 {
			t.Fatalf("%d lease(s) minted for a non-member", n)
		}
	})

	t.Run("MissingProject", func(t *testing.T) {
		in := f.input("", "true")
		in.Project.ProjectID = 999
		a := f.actor
		_, err := f.ctrl.RunCommand(ctx, in, &a, nil)
		if sandbox.KindOf(err) != sandbox.KindPrepare || !errors.Is(err, sandbox.ErrNotFound) {
			t.Fatalf("error %v, want a prepare error wrapping ErrNotFound", err)
		}
	})

	t.Run("KindMismatch", func(t *testing.T) {
		in := f.input("", "true")
		in.Project.Kind = sandbox.ProjectManaged
		a := f.actor
		_, err := f.ctrl.RunCommand(ctx, in, &a, nil)
		if sandbox.KindOf(err) != sandbox.KindPrepare || !strings.Contains(err.Error(), "is a host project") {
			t.Fatalf("error %v, want a prepare error naming the kind", err)
		}
		if n := len(f.leaseRows(t, "")); n != 0 {
			t.Fatalf("%d lease(s) minted on a kind mismatch", n)
		}
	})
}

func TestLandlockUnavailableRefusesConfined(t *testing.T) {
	ctx := context.Background()
	noLandlock := func() (int, error) { return 0, fmt.Errorf("simulated: %w", confine.ErrUnavailable) }

	f := newFixture(t, fixtureOpts{})
	f.p.available = noLandlock
	_, err := f.run(t, "", "true")
	if sandbox.KindOf(err) != sandbox.KindPrepare || !strings.Contains(err.Error(), "landlock unavailable: refusing to run unconfined") ||
		!errors.Is(err, confine.ErrUnavailable) {
		t.Fatalf("error %v, want a prepare refusal for missing landlock", err)
	}
	if n := len(f.leaseRows(t, "")); n != 0 {
		t.Fatalf("%d lease(s) minted", n)
	}

	// A trusted member does not need confinement.
	tf := newFixture(t, fixtureOpts{trusted: true})
	tf.p.available = noLandlock
	a := tf.actor
	res, err := tf.ctrl.RunCommand(ctx, tf.input("", "true"), &a, nil)
	if err != nil || *res.Code != 0 {
		t.Fatalf("trusted member without landlock: %+v, %v", res, err)
	}
}

func TestMinimalEnvironment(t *testing.T) {
	t.Setenv("CORRAL_TEST_SECRET", "hunter2-secret-value")
	for _, trusted := range []bool{false, true} {
		t.Run(fmt.Sprintf("trusted=%v", trusted), func(t *testing.T) {
			if !trusted {
				requireLandlock(t)
			}
			f := newFixture(t, fixtureOpts{trusted: trusted, env: []string{"EXTRA=1", "LANG=en_US.UTF-8"}})
			res, err := f.run(t, "", "env")
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for _, line := range strings.Split(strings.TrimSpace(res.Stdout), "\n") {
				k, v, _ := strings.Cut(line, "=")
				got[k] = v
			}
			want := map[string]string{
				"PATH": DefaultPath, "HOME": DisplayRoot, "LANG": "en_US.UTF-8", "TERM": "dumb", "EXTRA": "1",
			}
			for k, v := range want {
				if got[k] != v {
					t.Errorf("%s = %q, want %q", k, got[k], v)
				}
			}
			for k := range got {
				if _, ok := want[k]; !ok && k != "PWD" {
					t.Errorf("unexpected variable %s=%s in the command's environment", k, got[k])
				}
			}
			if strings.Contains(res.Stdout, "hunter2") || strings.Contains(res.Stdout, "CORRAL_TEST_SECRET") {
				t.Errorf("the daemon's environment leaked: %q", res.Stdout)
			}
		})
	}
}

func TestNothingOutlivesTheCommand(t *testing.T) {
	for _, trusted := range []bool{false, true} {
		t.Run(fmt.Sprintf("trusted=%v", trusted), func(t *testing.T) {
			if !trusted {
				requireLandlock(t)
			}
			f := newFixture(t, fixtureOpts{trusted: trusted})
			// A unique duration marks the background sleep.
			tok := fmt.Sprintf("100.%d%06d", os.Getpid()%1000, time.Now().UnixNano()%1000000)
			start := time.Now()
			res, err := f.run(t, "", "sh", "-c", "sleep "+tok+" & echo started")
			if err != nil || res.Stdout != "started\n" {
				t.Fatalf("%+v, %v", res, err)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("the command took %v: the background child held it", d)
			}
			sandboxtest.AssertNoProcesses(t, "sleep "+tok)
		})
	}
}

func TestLeaseLifecycle(t *testing.T) {
	requireLandlock(t)
	f := newFixture(t, fixtureOpts{})
	ctx := context.Background()
	gate := filepath.Join(f.root, "gate")
	var leaseID atomic.Value
	var during []store.Lease
	checked := make(chan struct{})
	go func() {
		defer close(checked)
		// Wait for the command to be running, look at the store, let it end.
		deadline := time.Now().Add(5 * time.Second)
		for leaseID.Load() == nil && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		// Wait for a heartbeat (every 50 ms) to be recorded, however loaded
		// the host is; the assertions below say what was seen.
		for {
			during, _ = f.st.ListLeases(ctx, store.LeaseFilter{Project: f.project.ProjectID, State: store.LeaseLive})
			if len(during) == 1 && during[0].HeartbeatAt.After(during[0].Created) || time.Now().After(deadline) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		os.WriteFile(gate, nil, 0o644)
	}()
	a := f.actor
	in := f.input("", "sh", "-c", "while [ ! -e gate ]; do sleep 0.01; done; echo through")
	in.LeaseKind = sandbox.LeaseEditor
	res, err := f.ctrl.RunCommand(ctx, in, &a, &sandbox.RunOptions{
		OnStart: func(si sandbox.StartInfo) error { leaseID.Store(si.LeaseID); return nil },
	})
	<-checked
	if err != nil || res.Stdout != "through\n" {
		t.Fatalf("%+v, %v", res, err)
	}
	id, _ := leaseID.Load().(string)
	if len(during) != 1 || during[0].ID != id {
		t.Fatalf("live leases during the command = %+v, want exactly lease %s", during, id)
	}
	l := during[0]
	if l.Account != f.actor.AccountUserID || l.Kind != string(sandbox.LeaseEditor) || l.Domain != DefaultDomain {
		t.Errorf("lease = %+v, want account %d kind editor domain %s", l, f.actor.AccountUserID, DefaultDomain)
	}
	if !l.HeartbeatAt.After(l.Created) {
		t.Errorf("lease was not heartbeated during the command: created %v heartbeat %v", l.Created, l.HeartbeatAt)
	}
	after, err := f.st.GetLease(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if after.State != store.LeaseReleased {
		t.Fatalf("lease state after the command = %s, want released", after.State)
	}
}

func TestNoDescriptorLeak(t *testing.T) {
	f := newFixture(t, fixtureOpts{trusted: true})
	cf := f
	if _, err := confine.Available(); err == nil {
		cf = newFixture(t, fixtureOpts{})
	}
	workload := func() {
		for _, fx := range []*fixture{f, cf} {
			fx.run(t, "", "sh", "-c", "echo out; echo err >&2")
			fx.run(t, "", "/nonexistent/program")
			fx.run(t, "..", "true")
			a := fx.actor
			fx.ctrl.RunCommand(context.Background(), fx.input("", "sleep", "10"), &a, &sandbox.RunOptions{Timeout: 50 * time.Millisecond})
		}
	}
	// A confined command's forking thread holds a pidfd until it sees the
	// command's exit, which it may see just after RunCommand returned: the
	// counts are taken once they settle.
	workload() // warm up: the store opens its connections lazily, confine its spare init
	before := countFDs(t)
	for i, stable := 0, 0; i < 200 && stable < 5; i++ {
		time.Sleep(10 * time.Millisecond)
		n := countFDs(t)
		if n == before {
			stable++
			continue
		}
		before, stable = n, 0
	}
	listFDs := func() string {
		ents, _ := os.ReadDir("/proc/self/fd")
		var b strings.Builder
		for _, e := range ents {
			l, _ := os.Readlink("/proc/self/fd/" + e.Name())
			fmt.Fprintf(&b, "%s=%s ", e.Name(), l)
		}
		return b.String()
	}
	was := listFDs()
	workload()
	after := countFDs(t)
	for deadline := time.Now().Add(2 * time.Second); after != before && time.Now().Before(deadline); after = countFDs(t) {
		time.Sleep(5 * time.Millisecond)
	}
	if after != before {
		t.Fatalf("open descriptors: %d before, %d after\nbefore: %s\nafter: %s", before, after, was, listFDs())
	}
}

func countFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

func TestSanitizer(t *testing.T) {
	s := sanitizer([]string{"/srv/p", "/data/real/p"})
	for in, want := range map[string]string{
		"/srv/p":                 "/workspace",
		"at /srv/p/x: error":     "at /workspace/x: error",
		"/srv/p2 and /srv/p-old": "/srv/p2 and /srv/p-old",
		"/data/real/p/a /srv/p":  "/workspace/a /workspace",
		"'/srv/p'":               "'/workspace'",
		"no paths":               "no paths",
	} {
		if got := s(in); got != want {
			t.Errorf("sanitize(%q) = %q, want %q", in, got, want)
		}
	}
	// Nested roots: the longer one is replaced whole.
	nested := sanitizer([]string{"/a", "/a/b"})
	if got := nested("/a/b/c"); got != "/workspace/c" {
		t.Errorf("nested = %q, want /workspace/c", got)
	}
}

func TestLookPath(t *testing.T) {
	dir := t.TempDir()
	must(t, os.WriteFile(filepath.Join(dir, "prog"), []byte("#!/bin/sh\n"), 0o755))
	must(t, os.WriteFile(filepath.Join(dir, "noexec"), nil, 0o644))
	for _, tc := range []struct{ file, cwd, path, want string }{
		{"prog", "/", dir, filepath.Join(dir, "prog")},
		{"prog", dir, "/usr/bin", "/usr/bin/prog"},                   // never the cwd
		{"noexec", "/", dir + ":/bin", filepath.Join(dir, "noexec")}, // nothing executable: the first candidate
		{"./prog", dir, "", filepath.Join(dir, "prog")},
		{"/abs/x", dir, "", "/abs/x"},
		{"prog", dir, "", "/nonexistent/prog"},
		{"prog", dir, ".:" + dir, filepath.Join(dir, "prog")},
	} {
		if got := lookPath(tc.file, tc.cwd, tc.path); got != tc.want {
			t.Errorf("lookPath(%q, %q, %q) = %q, want %q", tc.file, tc.cwd, tc.path, got, tc.want)
		}
	}
}

func TestNewValidates(t *testing.T) {
	if _, err := New(Options{}); err == nil {
		t.Error("New without a store succeeded")
	}
	f := newFixture(t, fixtureOpts{})
	if _, err := New(Options{Store: f.st, Leases: f.leases, Env: []string{"NOEQUALS"}}); err == nil {
		t.Error("New with a malformed Env entry succeeded")
	}
	p, err := New(Options{Store: f.st, Leases: f.leases})
	if err != nil {
		t.Fatal(err)
	}
	self, _ := os.Executable()
	if p.self != self || p.domain != DefaultDomain {
		t.Errorf("defaults: self %q domain %q", p.self, p.domain)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestRealDir: a directory reached through symlinks resolves to its
// symlink-free path, with and without /proc; files and missing paths fail.
func TestRealDir(t *testing.T) {
	base, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(base, "a", "b")
	if err := os.MkdirAll(target, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(base, "a"), filepath.Join(base, "link")); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(base, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for name, resolve := range map[string]func(string) (string, error){"realDir": realDir, "evalDir": evalDir} {
		got, err := resolve(filepath.Join(base, "link", "b", "..", "b"))
		if err != nil || got != target {
			t.Errorf("%s(link/b/../b) = %q, %v; want %q", name, got, err, target)
		}
		if _, err := resolve(file); err == nil || !strings.Contains(err.Error(), "not a directory") {
			t.Errorf("%s(file) = %v, want not a directory", name, err)
		}
		if _, err := resolve(filepath.Join(base, "missing")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s(missing) = %v, want not exist", name, err)
		}
	}
}

// TestHostStreamsBlocking: a host command's standard output and error are
// pipes in blocking mode (a program that gets a nonblocking stream fails
// with EAGAIN when it fills), confined and direct, and its input is
// /dev/null; core reads its own ends through the poller.
func TestHostStreamsBlocking(t *testing.T) {
	for _, trusted := range []bool{false, true} {
		if !trusted {
			requireLandlock(t)
		}
		f := newFixture(t, fixtureOpts{trusted: trusted})
		res, err := f.run(t, "", "sh", "-c", "cat /proc/self/fdinfo/1 /proc/self/fdinfo/2; stat -L -c %F /proc/self/fd/1 /proc/self/fd/2; readlink /proc/self/fd/0; cat; echo end")
		if err != nil || res.Code == nil || *res.Code != 0 {
			t.Fatalf("trusted %v: %+v, %v", trusted, res, err)
		}
		flags := 0
		for _, line := range strings.Split(res.Stdout, "\n") {
			v, ok := strings.CutPrefix(line, "flags:")
			if !ok {
				continue
			}
			flags++
			var fl int
			if _, err := fmt.Sscanf(strings.TrimSpace(v), "%o", &fl); err != nil {
				t.Fatalf("trusted %v: flags %q: %v", trusted, v, err)
			}
			if fl&unix.O_NONBLOCK != 0 {
				t.Errorf("trusted %v: a stream is nonblocking (flags %o):\n%s", trusted, fl, res.Stdout)
			}
		}
		// Its input is /dev/null (read to EOF at once), shared by the
		// commands that read none; a second command gets it too.
		if !strings.HasSuffix(res.Stdout, "/dev/null\nend\n") {
			t.Errorf("trusted %v: input is not /dev/null at EOF:\n%s", trusted, res.Stdout)
		}
		if again, err := f.run(t, "", "sh", "-c", "readlink /proc/self/fd/0; cat; echo end"); err != nil || again.Stdout != "/dev/null\nend\n" {
			t.Errorf("trusted %v: second command's input: %+v, %v", trusted, again, err)
		}
		if flags != 2 || strings.Count(res.Stdout, "fifo") != 2 {
			t.Fatalf("trusted %v: want two pipes' flags, got:\n%s", trusted, res.Stdout)
		}
	}
}
