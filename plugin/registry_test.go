package plugin_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/corral-sandbox/corral/plugin"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/corral-sandbox/corral/internal/pdeath.spawner"))
}

// The test's own domain interfaces (plugin/ knows nothing of sandbox).
type sandboxDomain interface {
	PrepareExecution(project string) (string, error)
	RunCommand(project, argv string) (string, error)
}

type sitesDomain interface {
	Publish(project string) string
}

type lspDomain interface {
	Bridge(lang string) string
}

type artifactsDomain interface {
	ReadArtifact(path string) ([]byte, error)
}

type sandboxCtl struct{ id string }

func (s *sandboxCtl) PrepareExecution(p string) (string, error) { return s.id + ":prep:" + p, nil }
func (s *sandboxCtl) RunCommand(p, a string) (string, error) {
	return s.id + ":run:" + p + ":" + a, nil
}

// prepOnly lacks RunCommand.
type prepOnly struct{}

func (prepOnly) PrepareExecution(string) (string, error) { return "", nil }

// wrongSig has RunCommand with the wrong signature.
type wrongSig struct{ prepOnly }

func (wrongSig) RunCommand(string) string { return "" }

type sitesCtl struct{ id string }

func (s *sitesCtl) Publish(p string) string { return s.id + ":" + p }

type lspCtl struct{ id string }

func (l *lspCtl) Bridge(lang string) string { return l.id + ":" + lang }

type artifactsCtl struct{}

func (artifactsCtl) ReadArtifact(string) ([]byte, error) { return []byte("bundle"), nil }

var errUnavailable = errors.New("test: sandbox unavailable")

// syncBuffer collects log output from concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// newRegistry returns a registry with every known domain declared as core
// would, and the buffer its log goes to.
func newRegistry(t *testing.T, opts plugin.Options) (*plugin.Registry, *syncBuffer) {
	t.Helper()
	logs := &syncBuffer{}
	opts.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	r := plugin.New(opts)
	must(t, r.RegisterDomain(plugin.DomainSandbox, plugin.Implements[sandboxDomain](), plugin.DomainOptions{Absent: errUnavailable}))
	must(t, r.RegisterDomain(plugin.DomainSites, plugin.Implements[sitesDomain](), plugin.DomainOptions{}))
	must(t, r.RegisterDomain(plugin.DomainLSP, plugin.Implements[lspDomain](), plugin.DomainOptions{}))
	must(t, r.RegisterDomain(plugin.DomainEditor, nil, plugin.DomainOptions{}))
	must(t, r.RegisterDomain(plugin.DomainSandboxArtifacts, plugin.Implements[artifactsDomain](), plugin.DomainOptions{CoreOnly: true}))
	return r, logs
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// provider returns a registration that provides one control per domain.
func provider(name string, controls map[plugin.Domain]any, consumes ...plugin.Domain) plugin.Registration {
	var provides []plugin.Domain
	for d := range controls {
		provides = append(provides, d)
	}
	slices.Sort(provides)
	return plugin.Registration{
		Manifest: plugin.Manifest{Name: name, Version: "1.0.0", Provides: provides, Consumes: consumes},
		Register: func(c *plugin.Context) error {
			for _, d := range provides {
				if err := c.Provide(d, controls[d]); err != nil {
					return err
				}
			}
			return nil
		},
	}
}

// consumer returns a registration that only consumes, and the place its
// Consumer handle lands once registered.
func consumer(name string, consumes ...plugin.Domain) (plugin.Registration, **plugin.Consumer) {
	h := new(*plugin.Consumer)
	return plugin.Registration{
		Manifest: plugin.Manifest{Name: name, Consumes: consumes},
		Register: func(c *plugin.Context) error {
			*h = c.Consumer()
			return nil
		},
	}, h
}

func wantState(t *testing.T, r *plugin.Registry, name string, want plugin.State, wantErr error) plugin.PluginStatus {
	t.Helper()
	st, ok := r.Status(name)
	if !ok {
		t.Fatalf("Status(%q): not found", name)
	}
	if st.State != want {
		t.Fatalf("Status(%q).State = %q (%s), want %q", name, st.State, st.Reason, want)
	}
	if wantErr != nil && !errors.Is(st.Err, wantErr) {
		t.Fatalf("Status(%q).Err = %v, want %v", name, st.Err, wantErr)
	}
	if want != plugin.StateLoaded && st.Reason == "" {
		t.Fatalf("Status(%q) has no reason", name)
	}
	return st
}

func wantResolveErr(t *testing.T, c *plugin.Consumer, d plugin.Domain, want error) *plugin.ResolveError {
	t.Helper()
	v, err := c.Resolve(d)
	if !errors.Is(err, want) {
		t.Fatalf("%s: Resolve(%q) = %v, %v; want %v", c.Name(), d, v, err, want)
	}
	if v != nil {
		t.Fatalf("%s: Resolve(%q) returned control %v with an error", c.Name(), d, v)
	}
	var re *plugin.ResolveError
	if !errors.As(err, &re) {
		t.Fatalf("Resolve(%q) error %T is not a *ResolveError", d, err)
	}
	if re.Consumer != c.Name() || re.Domain != d {
		t.Fatalf("ResolveError = %+v, want consumer %q domain %q", re, c.Name(), d)
	}
	return re
}

func TestConsumerWithoutDeclarationIsRefused(t *testing.T) {
	r, _ := newRegistry(t, plugin.Options{})
	undeclared, hu := consumer("undeclared", plugin.DomainLSP)
	declared, hd := consumer("declared", plugin.DomainSites)
	r.Load(context.Background(), []plugin.Registration{
		provider("sites", map[plugin.Domain]any{plugin.DomainSites: &sitesCtl{"s"}}),
		undeclared, declared,
	}, plugin.Config{})

	wantResolveErr(t, *hu, plugin.DomainSites, plugin.ErrNotDeclared)
	// A domain spelled differently from the declaration is not declared.
	wantResolveErr(t, *hd, "Sites", plugin.ErrNotDeclared)

	s, err := plugin.ResolveAs[sitesDomain](*hd, plugin.DomainSites)
	if err != nil {
		t.Fatalf("declared consumer: %v", err)
	}
	if got := s.Publish("p"); got != "s:p" {
		t.Fatalf("Publish = %q", got)
	}
}

func TestConsumerNotAdmittedIsRefused(t *testing.T) {
	r, _ := newRegistry(t, plugin.Options{})
	must(t, r.RegisterDomain("audit", nil, plugin.DomainOptions{
		Admit: func(c string) bool { return c == "auditor" },
	}))
	owner := plugin.Registration{
		Manifest: plugin.Manifest{Name: "owner", Provides: []plugin.Domain{plugin.DomainSites, plugin.DomainLSP, "audit"}},
		Register: func(c *plugin.Context) error {
			must(t, c.Provide(plugin.DomainSites, &sitesCtl{"s"}, plugin.AdmitOnly("editor")))
			must(t, c.Provide(plugin.DomainLSP, &lspCtl{"l"}, plugin.AdmitFunc(func(string) bool { panic("boom") })))
			must(t, c.Provide("audit", struct{}{}))
			return nil
		},
	}
	editor, he := consumer("editor", plugin.DomainSites, plugin.DomainLSP, "audit")
	other, ho := consumer("other", plugin.DomainSites, "audit")
	auditor, ha := consumer("auditor", "audit")
	r.Load(context.Background(), []plugin.Registration{owner, editor, other, auditor}, plugin.Config{})

	re := wantResolveErr(t, *ho, plugin.DomainSites, plugin.ErrNotAdmitted)
	if !strings.Contains(re.Reason, "owner") {
		t.Errorf("reason %q does not name the owner's restriction", re.Reason)
	}
	if _, err := (*he).Resolve(plugin.DomainSites); err != nil {
		t.Fatalf("admitted consumer refused: %v", err)
	}
	// A panicking admission function refuses.
	wantResolveErr(t, *he, plugin.DomainLSP, plugin.ErrNotAdmitted)
	// Core's domain restriction applies on top of the owner's (none here).
	wantResolveErr(t, *he, "audit", plugin.ErrNotAdmitted)
	wantResolveErr(t, *ho, "audit", plugin.ErrNotAdmitted)
	if _, err := (*ha).Resolve("audit"); err != nil {
		t.Fatalf("auditor refused: %v", err)
	}
	// Core is never subject to consumer restrictions.
	if _, err := r.ResolveCore(plugin.DomainSites); err != nil {
		t.Fatalf("ResolveCore: %v", err)
	}
}

func TestControlMissingMethodIsRefused(t *testing.T) {
	var nilCtl *sandboxCtl
	for _, tc := range []struct {
		name   string
		ctl    any
		reason string
	}{
		{"missing method", prepOnly{}, "missing RunCommand"},
		{"wrong signature", wrongSig{}, "RunCommand has"},
		{"typed nil", nilCtl, "nil control"},
		{"nil", nil, "nil control"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, logs := newRegistry(t, plugin.Options{})
			ran := false
			reg := plugin.Registration{
				Manifest: plugin.Manifest{Name: "bad", Provides: []plugin.Domain{plugin.DomainSandbox, plugin.DomainSites}},
				Register: func(c *plugin.Context) error {
					must(t, c.Provide(plugin.DomainSites, &sitesCtl{"s"}))
					err := c.Provide(plugin.DomainSandbox, tc.ctl)
					if !errors.Is(err, plugin.ErrNotImplemented) {
						t.Errorf("Provide = %v, want ErrNotImplemented", err)
					}
					ran = true
					return err
				},
			}
			r.Load(context.Background(), []plugin.Registration{reg}, plugin.Config{})
			if !ran {
				t.Fatal("Register did not run")
			}
			st := wantState(t, r, "bad", plugin.StateFailed, plugin.ErrNotImplemented)
			if !strings.Contains(st.Reason, tc.reason) {
				t.Errorf("reason %q does not contain %q", st.Reason, tc.reason)
			}
			if !strings.Contains(logs.String(), tc.reason) {
				t.Errorf("log does not give the reason %q:\n%s", tc.reason, logs)
			}
			for _, d := range []plugin.Domain{plugin.DomainSandbox, plugin.DomainSites} {
				if o, ok := r.Owner(d); ok {
					t.Errorf("Owner(%s) = %q after refused registration", d, o)
				}
				if _, err := r.ResolveCore(d); !errors.Is(err, plugin.ErrAbsent) {
					t.Errorf("ResolveCore(%s) = %v, want ErrAbsent", d, err)
				}
			}
		})
	}
}

func TestProvideCoreChecksInterface(t *testing.T) {
	r, _ := newRegistry(t, plugin.Options{})
	if err := r.ProvideCore(plugin.DomainSandboxArtifacts, prepOnly{}); !errors.Is(err, plugin.ErrNotImplemented) {
		t.Fatalf("ProvideCore(wrong type) = %v", err)
	}
	if err := r.ProvideCore("SandboxArtifacts", artifactsCtl{}); !errors.Is(err, plugin.ErrUnknownDomain) {
		t.Fatalf("ProvideCore(variant) = %v", err)
	}
	must(t, r.ProvideCore(plugin.DomainSandboxArtifacts, artifactsCtl{}))
	if err := r.ProvideCore(plugin.DomainSandboxArtifacts, artifactsCtl{}); !errors.Is(err, plugin.ErrDomainOwned) {
		t.Fatalf("second ProvideCore = %v", err)
	}
	a, err := plugin.ResolveCoreAs[artifactsDomain](r, plugin.DomainSandboxArtifacts)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := a.ReadArtifact("x"); string(b) != "bundle" {
		t.Fatalf("ReadArtifact = %q", b)
	}
	if _, err := plugin.ResolveCoreAs[sitesDomain](r, plugin.DomainSandboxArtifacts); !errors.Is(err, plugin.ErrNotImplemented) {
		t.Fatalf("ResolveCoreAs(wrong type) = %v", err)
	}
	if o, _ := r.Owner(plugin.DomainSandboxArtifacts); o != plugin.CoreOwner {
		t.Fatalf("Owner = %q", o)
	}
}

func TestSecondOwnerIsRefusedAndFirstKeepsWorking(t *testing.T) {
	r, logs := newRegistry(t, plugin.Options{})
	secondRan := false
	second := plugin.Registration{
		Manifest: plugin.Manifest{Name: "second", Provides: []plugin.Domain{plugin.DomainLSP, plugin.DomainSandbox}},
		Register: func(c *plugin.Context) error {
			secondRan = true
			c.Provide(plugin.DomainLSP, &lspCtl{"second"})
			return c.Provide(plugin.DomainSandbox, &sandboxCtl{"second"})
		},
	}
	user, hu := consumer("user", plugin.DomainSandbox, plugin.DomainLSP)
	statuses := r.Load(context.Background(), []plugin.Registration{
		provider("first", map[plugin.Domain]any{plugin.DomainSandbox: &sandboxCtl{"first"}}),
		second, user,
	}, plugin.Config{})

	if statuses[1].State != plugin.StateFailed || !errors.Is(statuses[1].Err, plugin.ErrDomainOwned) {
		t.Fatalf("second: %+v", statuses[1])
	}
	if secondRan {
		t.Fatal("the refused plugin's Register ran")
	}
	if !strings.Contains(logs.String(), `"sandbox\" is owned by first`) && !strings.Contains(logs.String(), "owned by first") {
		t.Fatalf("log lacks the reason:\n%s", logs)
	}
	// The whole second plugin is refused: its other domain is absent too.
	wantResolveErr(t, *hu, plugin.DomainLSP, plugin.ErrAbsent)
	sb, err := plugin.ResolveAs[sandboxDomain](*hu, plugin.DomainSandbox)
	if err != nil {
		t.Fatal(err)
	}
	if out, _ := sb.RunCommand("p", "ls"); out != "first:run:p:ls" {
		t.Fatalf("RunCommand through the first owner = %q", out)
	}
	if o, _ := r.Owner(plugin.DomainSandbox); o != "first" {
		t.Fatalf("Owner = %q", o)
	}
	// Core cannot take an owned domain either.
	if err := r.ProvideCore(plugin.DomainSandbox, &sandboxCtl{"core"}); !errors.Is(err, plugin.ErrDomainOwned) {
		t.Fatalf("ProvideCore on an owned domain = %v", err)
	}
}

func TestRequirementDisappearingMakesControlAbsent(t *testing.T) {
	r, _ := newRegistry(t, plugin.Options{})
	lsp := plugin.Registration{
		Manifest: plugin.Manifest{Name: "lsp", Provides: []plugin.Domain{plugin.DomainLSP}, Consumes: []plugin.Domain{plugin.DomainSandbox}},
		Register: func(c *plugin.Context) error {
			return c.Provide(plugin.DomainLSP, &lspCtl{"l"}, plugin.Requires(plugin.DomainSandbox))
		},
	}
	// editor requires lsp, which requires sandbox: a chain.
	editor := plugin.Registration{
		Manifest: plugin.Manifest{Name: "editor", Provides: []plugin.Domain{plugin.DomainEditor}, Consumes: []plugin.Domain{plugin.DomainLSP}},
		Register: func(c *plugin.Context) error {
			return c.Provide(plugin.DomainEditor, "editor-control", plugin.Requires(plugin.DomainLSP))
		},
	}
	ide, h := consumer("ide", plugin.DomainLSP, plugin.DomainEditor)
	r.Load(context.Background(), []plugin.Registration{
		provider("sandbox", map[plugin.Domain]any{plugin.DomainSandbox: &sandboxCtl{"sb"}}),
		lsp, editor, ide,
	}, plugin.Config{})
	c := *h

	for _, d := range []plugin.Domain{plugin.DomainLSP, plugin.DomainEditor} {
		if _, err := c.Resolve(d); err != nil {
			t.Fatalf("before disabling: Resolve(%s) = %v", d, err)
		}
	}
	must(t, r.Disable("sandbox", "operator"))
	wantState(t, r, "sandbox", plugin.StateDisabled, plugin.ErrDisabled)
	re := wantResolveErr(t, c, plugin.DomainLSP, plugin.ErrAbsent)
	if !strings.Contains(re.Reason, `requirement "sandbox"`) {
		t.Errorf("reason %q does not name the requirement", re.Reason)
	}
	wantResolveErr(t, c, plugin.DomainEditor, plugin.ErrAbsent) // transitively
	if _, err := r.ResolveCore(plugin.DomainLSP); !errors.Is(err, plugin.ErrAbsent) {
		t.Fatalf("ResolveCore(lsp) = %v, want ErrAbsent", err)
	}
	// The disabled plugin still owns its domain, and it is absent.
	if o, ok := r.Owner(plugin.DomainSandbox); !ok || o != "sandbox" {
		t.Fatalf("Owner(sandbox) = %q, %v", o, ok)
	}
	if _, err := r.ResolveCore(plugin.DomainSandbox); !errors.Is(err, plugin.ErrAbsent) || !errors.Is(err, errUnavailable) {
		t.Fatalf("ResolveCore(sandbox) = %v, want ErrAbsent and the domain's error", err)
	}

	must(t, r.Enable("sandbox"))
	for _, d := range []plugin.Domain{plugin.DomainLSP, plugin.DomainEditor} {
		if _, err := c.Resolve(d); err != nil {
			t.Fatalf("after enabling: Resolve(%s) = %v", d, err)
		}
	}
	// Disabling the middle of the chain: lsp itself and editor go absent.
	must(t, r.Disable("lsp", "operator"))
	wantResolveErr(t, c, plugin.DomainLSP, plugin.ErrAbsent)
	wantResolveErr(t, c, plugin.DomainEditor, plugin.ErrAbsent)

	if err := r.Disable("nope", ""); !errors.Is(err, plugin.ErrUnknownPlugin) {
		t.Fatalf("Disable(unknown) = %v", err)
	}
}

func TestRequirementNeverLoadedOrCyclic(t *testing.T) {
	r, _ := newRegistry(t, plugin.Options{})
	requirer := func(name string, provides, requires plugin.Domain) plugin.Registration {
		return plugin.Registration{
			Manifest: plugin.Manifest{Name: name, Provides: []plugin.Domain{provides}, Consumes: []plugin.Domain{requires}},
			Register: func(c *plugin.Context) error {
				return c.Provide(provides, &lspCtl{name}, plugin.Requires(requires))
			},
		}
	}
	sitesNeedsSandbox := plugin.Registration{
		Manifest: plugin.Manifest{Name: "sites", Provides: []plugin.Domain{plugin.DomainSites}, Consumes: []plugin.Domain{plugin.DomainSandbox}},
		Register: func(c *plugin.Context) error {
			return c.Provide(plugin.DomainSites, &sitesCtl{"s"}, plugin.Requires(plugin.DomainSandbox))
		},
	}
	must(t, r.RegisterDomain("ping", nil, plugin.DomainOptions{}))
	must(t, r.RegisterDomain("pong", nil, plugin.DomainOptions{}))
	u, h := consumer("user", plugin.DomainSites, "ping")
	r.Load(context.Background(), []plugin.Registration{
		provider("sandbox", map[plugin.Domain]any{plugin.DomainSandbox: &sandboxCtl{"sb"}}),
		sitesNeedsSandbox,
		requirer("ping", "ping", "pong"),
		requirer("pong", "pong", "ping"),
		u,
	}, plugin.Config{Disabled: []string{"sandbox"}})
	wantResolveErr(t, *h, plugin.DomainSites, plugin.ErrAbsent)
	re := wantResolveErr(t, *h, "ping", plugin.ErrAbsent)
	if !strings.Contains(re.Reason, "cycle") {
		t.Errorf("reason %q does not report the cycle", re.Reason)
	}
}

func TestRequirementMustBeConsumed(t *testing.T) {
	r, _ := newRegistry(t, plugin.Options{})
	reg := plugin.Registration{
		Manifest: plugin.Manifest{Name: "sites", Provides: []plugin.Domain{plugin.DomainSites}},
		Register: func(c *plugin.Context) error {
			err := c.Provide(plugin.DomainSites, &sitesCtl{"s"}, plugin.Requires(plugin.DomainSandbox))
			if !errors.Is(err, plugin.ErrNotDeclared) {
				t.Errorf("Provide = %v, want ErrNotDeclared", err)
			}
			return nil // ignoring the refusal does not help
		},
	}
	r.Load(context.Background(), []plugin.Registration{reg}, plugin.Config{})
	wantState(t, r, "sites", plugin.StateFailed, plugin.ErrNotDeclared)
	if _, ok := r.Owner(plugin.DomainSites); ok {
		t.Fatal("refused plugin owns sites")
	}
}

// recordingService records which of its methods ran.
type recordingService struct {
	mu     sync.Mutex
	events []string
}

func (s *recordingService) Run(ctx context.Context) error {
	s.mu.Lock()
	s.events = append(s.events, "run")
	s.mu.Unlock()
	<-ctx.Done()
	return nil
}

func TestPanicInRegistrationLeavesNoTrace(t *testing.T) {
	r, logs := newRegistry(t, plugin.Options{})
	var kept *plugin.Context
	panicky := plugin.Registration{
		Manifest: plugin.Manifest{Name: "panicky", Provides: []plugin.Domain{plugin.DomainLSP, plugin.DomainSites}},
		Register: func(c *plugin.Context) error {
			kept = c
			must(t, c.Provide(plugin.DomainLSP, &lspCtl{"panicky"}))
			must(t, c.AddService("indexer", &recordingService{}))
			var s *sitesCtl
			s.Publish("x") // nil pointer dereference: a runtime panic
			return nil
		},
	}
	user, h := consumer("user", plugin.DomainLSP, plugin.DomainSandbox)
	statuses := r.Load(context.Background(), []plugin.Registration{
		provider("sandbox", map[plugin.Domain]any{plugin.DomainSandbox: &sandboxCtl{"sb"}}),
		panicky,
		user,
	}, plugin.Config{})

	if len(statuses) != 3 {
		t.Fatalf("statuses: %+v", statuses)
	}
	wantState(t, r, "sandbox", plugin.StateLoaded, nil)
	wantState(t, r, "user", plugin.StateLoaded, nil)
	st := wantState(t, r, "panicky", plugin.StateFailed, plugin.ErrRegisterPanic)
	if len(st.Provides) != 0 {
		t.Errorf("panicked plugin provides %v", st.Provides)
	}
	if !strings.Contains(logs.String(), "nil pointer") {
		t.Errorf("log lacks the panic:\n%s", logs)
	}
	if _, err := (*h).Resolve(plugin.DomainSandbox); err != nil {
		t.Fatalf("other plugins still work: %v", err)
	}
	wantResolveErr(t, *h, plugin.DomainLSP, plugin.ErrAbsent)
	if _, ok := r.Owner(plugin.DomainLSP); ok {
		t.Fatal("the panicked plugin owns lsp")
	}
	for _, s := range r.Services() {
		if s.Plugin == "panicky" {
			t.Fatalf("the panicked plugin's service is listed: %+v", s)
		}
	}
	// Its Context is dead: nothing can be provided through it afterwards.
	if err := kept.Provide(plugin.DomainSites, &sitesCtl{"late"}); !errors.Is(err, plugin.ErrContextClosed) {
		t.Fatalf("late Provide = %v", err)
	}
	// Nothing was reserved: another plugin can own lsp now.
	r.Load(context.Background(), []plugin.Registration{
		provider("lsp2", map[plugin.Domain]any{plugin.DomainLSP: &lspCtl{"lsp2"}}),
	}, plugin.Config{})
	l, err := plugin.ResolveAs[lspDomain](*h, plugin.DomainLSP)
	if err != nil {
		t.Fatal(err)
	}
	if got := l.Bridge("go"); got != "lsp2:go" {
		t.Fatalf("Bridge = %q", got)
	}
}

func TestErrorAfterProvideLeavesNothing(t *testing.T) {
	r, _ := newRegistry(t, plugin.Options{})
	var consumerHandle *plugin.Consumer
	failing := plugin.Registration{
		Manifest: plugin.Manifest{Name: "failing", Provides: []plugin.Domain{plugin.DomainSandbox, plugin.DomainSites}, Consumes: []plugin.Domain{plugin.DomainLSP}},
		Register: func(c *plugin.Context) error {
			consumerHandle = c.Consumer()
			must(t, c.Provide(plugin.DomainSandbox, &sandboxCtl{"failing"}))
			must(t, c.AddService("svc", &recordingService{}))
			return errors.New("sites backend unreachable")
		},
	}
	r.Load(context.Background(), []plugin.Registration{
		failing,
		provider("lsp", map[plugin.Domain]any{plugin.DomainLSP: &lspCtl{"l"}}),
	}, plugin.Config{})

	st := wantState(t, r, "failing", plugin.StateFailed, nil)
	if !strings.Contains(st.Reason, "sites backend unreachable") {
		t.Errorf("reason = %q", st.Reason)
	}
	if _, ok := r.Owner(plugin.DomainSandbox); ok {
		t.Fatal("failed plugin owns sandbox")
	}
	if _, err := r.ResolveCore(plugin.DomainSandbox); !errors.Is(err, plugin.ErrAbsent) {
		t.Fatalf("ResolveCore(sandbox) = %v", err)
	}
	if n := len(r.Services()); n != 0 {
		t.Fatalf("%d services listed", n)
	}
	// The failed plugin's consumer handle resolves nothing.
	wantResolveErr(t, consumerHandle, plugin.DomainLSP, plugin.ErrAbsent)
	if err := r.Enable("failing"); err == nil {
		t.Fatal("Enable of a failed plugin succeeded")
	}
}

func TestRegistrationMustKeepItsManifest(t *testing.T) {
	r, _ := newRegistry(t, plugin.Options{})
	undeclared := plugin.Registration{
		Manifest: plugin.Manifest{Name: "undeclared", Provides: []plugin.Domain{plugin.DomainSites}},
		Register: func(c *plugin.Context) error {
			must(t, c.Provide(plugin.DomainSites, &sitesCtl{"s"}))
			if err := c.Provide(plugin.DomainLSP, &lspCtl{"l"}); !errors.Is(err, plugin.ErrNotDeclared) {
				t.Errorf("Provide(undeclared) = %v", err)
			}
			return nil // ignores the refusal
		},
	}
	lazy := plugin.Registration{
		Manifest: plugin.Manifest{Name: "lazy", Provides: []plugin.Domain{plugin.DomainSandbox}},
		Register: func(*plugin.Context) error { return nil },
	}
	twice := plugin.Registration{
		Manifest: plugin.Manifest{Name: "twice", Provides: []plugin.Domain{plugin.DomainEditor}},
		Register: func(c *plugin.Context) error {
			must(t, c.Provide(plugin.DomainEditor, 1))
			c.Provide(plugin.DomainEditor, 2)
			return nil
		},
	}
	dupService := plugin.Registration{
		Manifest: plugin.Manifest{Name: "dupservice"},
		Register: func(c *plugin.Context) error {
			must(t, c.AddService("a", &recordingService{}))
			c.AddService("a", &recordingService{})
			return nil
		},
	}
	r.Load(context.Background(), []plugin.Registration{undeclared, lazy, twice, dupService}, plugin.Config{})
	wantState(t, r, "undeclared", plugin.StateFailed, plugin.ErrNotDeclared)
	wantState(t, r, "lazy", plugin.StateFailed, plugin.ErrInvalidManifest)
	wantState(t, r, "twice", plugin.StateFailed, nil)
	wantState(t, r, "dupservice", plugin.StateFailed, nil)
	for _, d := range []plugin.Domain{plugin.DomainSites, plugin.DomainSandbox, plugin.DomainEditor} {
		if o, ok := r.Owner(d); ok {
			t.Errorf("Owner(%s) = %q", d, o)
		}
	}
}

func TestPluginCannotResolveSandboxArtifactsByAnyName(t *testing.T) {
	variants := []plugin.Domain{
		"sandboxArtifacts", "SandboxArtifacts", " sandboxArtifacts", "sandboxArtifacts ",
		"sandboxartifacts", "SANDBOXARTIFACTS", "sandbox_artifacts", "sandbox-artifacts",
		"sandbox.Artifacts", "sandboxArtifacts\u200b", "\tsandboxArtifacts\n",
	}
	r, _ := newRegistry(t, plugin.Options{})
	must(t, r.ProvideCore(plugin.DomainSandboxArtifacts, artifactsCtl{}))

	var regs []plugin.Registration
	for i, v := range variants {
		regs = append(regs,
			plugin.Registration{
				Manifest: plugin.Manifest{Name: fmt.Sprintf("consumes%d", i), Consumes: []plugin.Domain{v}},
				Register: func(*plugin.Context) error { t.Errorf("Register ran for Consumes %q", v); return nil },
			},
			plugin.Registration{
				Manifest: plugin.Manifest{Name: fmt.Sprintf("provides%d", i), Provides: []plugin.Domain{v}},
				Register: func(*plugin.Context) error { t.Errorf("Register ran for Provides %q", v); return nil },
			})
	}
	// A well-behaved manifest whose Register tries its luck.
	var sneakyErrs []error
	sneaky := plugin.Registration{
		Manifest: plugin.Manifest{Name: "sneaky", Consumes: []plugin.Domain{plugin.DomainSandbox}},
		Register: func(c *plugin.Context) error {
			for _, v := range variants {
				sneakyErrs = append(sneakyErrs, c.Provide(v, artifactsCtl{}))
			}
			return nil
		},
	}
	user, h := consumer("user", plugin.DomainSandbox)
	regs = append(regs, sneaky, user)
	r.Load(context.Background(), regs, plugin.Config{})

	for i := range variants {
		for _, name := range []string{fmt.Sprintf("consumes%d", i), fmt.Sprintf("provides%d", i)} {
			st := wantState(t, r, name, plugin.StateFailed, plugin.ErrInvalidManifest)
			if !errors.Is(st.Err, plugin.ErrCoreOnly) {
				t.Errorf("%s (%q): %v, want ErrCoreOnly", name, variants[i], st.Err)
			}
		}
	}
	wantState(t, r, "sneaky", plugin.StateFailed, plugin.ErrCoreOnly)
	for i, err := range sneakyErrs {
		if !errors.Is(err, plugin.ErrCoreOnly) {
			t.Errorf("Provide(%q) = %v, want ErrCoreOnly", variants[i], err)
		}
	}
	for _, v := range variants {
		wantResolveErr(t, *h, v, plugin.ErrCoreOnly)
		if _, err := plugin.ResolveAs[artifactsDomain](*h, v); err == nil {
			t.Errorf("ResolveAs(%q) succeeded", v)
		}
	}
	// Core resolves it, by its exact name only.
	if _, err := r.ResolveCore(plugin.DomainSandboxArtifacts); err != nil {
		t.Fatalf("ResolveCore: %v", err)
	}
	if _, err := r.ResolveCore("SandboxArtifacts"); !errors.Is(err, plugin.ErrUnknownDomain) {
		t.Fatalf("ResolveCore(variant) = %v", err)
	}
}

func TestSandboxArtifactsIsAlwaysCoreOnly(t *testing.T) {
	r := plugin.New(plugin.Options{Logger: slog.New(slog.DiscardHandler)})
	if err := r.RegisterDomain(plugin.DomainSandboxArtifacts, nil, plugin.DomainOptions{}); !errors.Is(err, plugin.ErrCoreOnly) {
		t.Fatalf("RegisterDomain(sandboxArtifacts, not core-only) = %v", err)
	}
	must(t, r.RegisterDomain(plugin.DomainSandbox, nil, plugin.DomainOptions{}))
	if err := r.RegisterDomain("Sandbox", nil, plugin.DomainOptions{}); err == nil {
		t.Fatal("a variant of a declared domain was declared")
	}
	if err := r.RegisterDomain("sandbox artifacts", nil, plugin.DomainOptions{CoreOnly: true}); err == nil {
		t.Fatal("a malformed domain was declared")
	}
	// Even undeclared, no plugin resolves it.
	user, h := consumer("user", plugin.DomainSandbox)
	r.Load(context.Background(), []plugin.Registration{user}, plugin.Config{})
	wantResolveErr(t, *h, plugin.DomainSandboxArtifacts, plugin.ErrCoreOnly)
}

func TestDisabledByConfigIsAbsent(t *testing.T) {
	r, logs := newRegistry(t, plugin.Options{})
	ran := false
	sites := plugin.Registration{
		Manifest: plugin.Manifest{Name: "sites", Provides: []plugin.Domain{plugin.DomainSites}},
		Register: func(c *plugin.Context) error {
			ran = true
			return c.Provide(plugin.DomainSites, &sitesCtl{"s"})
		},
	}
	user, h := consumer("user", plugin.DomainSites, plugin.DomainSandbox)
	r.Load(context.Background(), []plugin.Registration{
		sites, user,
		provider("sandbox", map[plugin.Domain]any{plugin.DomainSandbox: &sandboxCtl{"sb"}}),
	}, plugin.Config{Disabled: []string{" Sites", "SANDBOX", "ghost"}})
	if ran {
		t.Fatal("a disabled plugin's Register ran")
	}
	wantState(t, r, "sites", plugin.StateDisabled, plugin.ErrDisabled)
	wantResolveErr(t, *h, plugin.DomainSites, plugin.ErrAbsent)
	re := wantResolveErr(t, *h, plugin.DomainSandbox, plugin.ErrAbsent)
	if !errors.Is(re, errUnavailable) {
		t.Errorf("absent sandbox does not wrap the domain's error: %v", re)
	}
	if !strings.Contains(logs.String(), "ghost") {
		t.Errorf("unknown name in configuration not logged:\n%s", logs)
	}
	if err := r.Enable("sites"); err == nil {
		t.Fatal("Enable of a never-registered plugin succeeded")
	}
	// A disabled plugin reserves nothing: an alternative provider may own
	// its domain.
	r.Load(context.Background(), []plugin.Registration{
		provider("sites-alt", map[plugin.Domain]any{plugin.DomainSites: &sitesCtl{"alt"}}),
	}, plugin.Config{})
	s, err := plugin.ResolveAs[sitesDomain](*h, plugin.DomainSites)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Publish("p"); got != "alt:p" {
		t.Fatalf("Publish = %q", got)
	}
}

func TestSkipPluginIsAReason(t *testing.T) {
	r, logs := newRegistry(t, plugin.Options{})
	skip := plugin.Registration{
		Manifest: plugin.Manifest{Name: "kvm", Provides: []plugin.Domain{plugin.DomainSandbox}},
		Register: func(c *plugin.Context) error {
			must(t, c.Provide(plugin.DomainSandbox, &sandboxCtl{"kvm"}))
			return fmt.Errorf("no /dev/kvm on this host: %w", plugin.ErrSkipPlugin)
		},
	}
	statuses := r.Load(context.Background(), []plugin.Registration{skip}, plugin.Config{})
	st := wantState(t, r, "kvm", plugin.StateSkipped, plugin.ErrSkipPlugin)
	if statuses[0].State != plugin.StateSkipped || !strings.Contains(st.Reason, "/dev/kvm") {
		t.Fatalf("status %+v", st)
	}
	if strings.Contains(logs.String(), "level=ERROR") {
		t.Errorf("a skip was logged as an error:\n%s", logs)
	}
	if _, err := r.ResolveCore(plugin.DomainSandbox); !errors.Is(err, plugin.ErrAbsent) {
		t.Fatalf("ResolveCore = %v", err)
	}
}

func TestInvalidManifests(t *testing.T) {
	reg := func(m plugin.Manifest) plugin.Registration {
		return plugin.Registration{Manifest: m, Register: func(*plugin.Context) error { return nil }}
	}
	for _, tc := range []struct {
		name string
		reg  plugin.Registration
		want error
	}{
		{"empty name", reg(plugin.Manifest{}), plugin.ErrInvalidManifest},
		{"upper-case name", reg(plugin.Manifest{Name: "Sites"}), plugin.ErrInvalidManifest},
		{"name with space", reg(plugin.Manifest{Name: "a b"}), plugin.ErrInvalidManifest},
		{"core's name", reg(plugin.Manifest{Name: plugin.CoreOwner}), plugin.ErrDuplicatePlugin},
		{"no Register", plugin.Registration{Manifest: plugin.Manifest{Name: "x"}}, plugin.ErrInvalidManifest},
		{"unknown capability", reg(plugin.Manifest{Name: "x", Capabilities: []string{"root"}}), plugin.ErrInvalidManifest},
		{"capability twice", reg(plugin.Manifest{Name: "x", Capabilities: []string{"net-dial", "net-dial"}}), plugin.ErrInvalidManifest},
		{"unknown domain", reg(plugin.Manifest{Name: "x", Consumes: []plugin.Domain{"billing"}}), plugin.ErrUnknownDomain},
		{"domain variant", reg(plugin.Manifest{Name: "x", Provides: []plugin.Domain{"Sandbox"}}), plugin.ErrUnknownDomain},
		{"domain with space", reg(plugin.Manifest{Name: "x", Consumes: []plugin.Domain{"sandbox "}}), plugin.ErrUnknownDomain},
		{"domain twice", reg(plugin.Manifest{Name: "x", Consumes: []plugin.Domain{"lsp", "lsp"}}), plugin.ErrInvalidManifest},
		{"provides and consumes", reg(plugin.Manifest{Name: "x", Provides: []plugin.Domain{"lsp"}, Consumes: []plugin.Domain{"lsp"}}), plugin.ErrInvalidManifest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, _ := newRegistry(t, plugin.Options{Capabilities: []string{"net-dial"}})
			st := r.Load(context.Background(), []plugin.Registration{tc.reg}, plugin.Config{})
			if st[0].State != plugin.StateFailed || !errors.Is(st[0].Err, tc.want) {
				t.Fatalf("status %+v, want failed with %v", st[0], tc.want)
			}
		})
	}
}

func TestDuplicatePluginName(t *testing.T) {
	r, _ := newRegistry(t, plugin.Options{})
	st := r.Load(context.Background(), []plugin.Registration{
		provider("sb", map[plugin.Domain]any{plugin.DomainSandbox: &sandboxCtl{"one"}}),
		provider("sb", map[plugin.Domain]any{plugin.DomainLSP: &lspCtl{"two"}}),
	}, plugin.Config{})
	if !errors.Is(st[1].Err, plugin.ErrDuplicatePlugin) {
		t.Fatalf("second: %+v", st[1])
	}
	wantState(t, r, "sb", plugin.StateLoaded, nil)
	if _, ok := r.Owner(plugin.DomainLSP); ok {
		t.Fatal("the duplicate's domain is owned")
	}
	// Names stay unique across Load calls.
	st = r.Load(context.Background(), []plugin.Registration{
		provider("sb", map[plugin.Domain]any{plugin.DomainLSP: &lspCtl{"three"}}),
	}, plugin.Config{})
	if !errors.Is(st[0].Err, plugin.ErrDuplicatePlugin) {
		t.Fatalf("later duplicate: %+v", st[0])
	}
	if n := len(r.Statuses()); n != 1 {
		t.Fatalf("Statuses holds %d plugins", n)
	}
}

// stamped is what the test's Stamp hook hands out.
type stamped struct {
	sandboxDomain
	domain plugin.Domain
	owner  string
}

func TestStamping(t *testing.T) {
	var stampCalls []string
	stamp := func(d plugin.Domain, owner string, ctl any) any {
		stampCalls = append(stampCalls, string(d)+"/"+owner)
		switch c := ctl.(type) {
		case sandboxDomain:
			return &stamped{sandboxDomain: c, domain: d, owner: owner}
		case *lspCtl:
			return nil // refuses the control
		}
		return ctl
	}
	r, _ := newRegistry(t, plugin.Options{Stamp: stamp})
	user, h := consumer("user", plugin.DomainSandbox, plugin.DomainLSP)
	r.Load(context.Background(), []plugin.Registration{
		provider("provider", map[plugin.Domain]any{plugin.DomainSandbox: &sandboxCtl{"p"}}),
		provider("lsp", map[plugin.Domain]any{plugin.DomainLSP: &lspCtl{"l"}}),
		user,
	}, plugin.Config{})

	for range 2 { // every resolution hands out the stamped control
		v, err := (*h).Resolve(plugin.DomainSandbox)
		if err != nil {
			t.Fatal(err)
		}
		s, ok := v.(*stamped)
		if !ok {
			t.Fatalf("resolved %T, not the stamped control", v)
		}
		if s.domain != plugin.DomainSandbox || s.owner != "provider" {
			t.Fatalf("stamped with %q/%q", s.domain, s.owner)
		}
		if out, _ := s.RunCommand("p", "ls"); out != "p:run:p:ls" {
			t.Fatalf("RunCommand through the stamp = %q", out)
		}
	}
	if o, _ := r.Owner(plugin.DomainSandbox); o != "provider" {
		t.Fatalf("Owner = %q", o)
	}
	wantState(t, r, "lsp", plugin.StateFailed, plugin.ErrNotImplemented)
	must(t, r.ProvideCore(plugin.DomainSandboxArtifacts, artifactsCtl{}))
	want := []string{"sandbox/provider", "lsp/lsp", "sandboxArtifacts/core"}
	if !slices.Equal(stampCalls, want) {
		t.Fatalf("Stamp calls = %v, want %v", stampCalls, want)
	}
}

func TestResolveDuringRegisterIsAbsentAndContextCloses(t *testing.T) {
	r, _ := newRegistry(t, plugin.Options{Capabilities: []string{"net-dial"}})
	var during error
	var kept *plugin.Context
	reg := plugin.Registration{
		Manifest: plugin.Manifest{Name: "early", Version: "2", Consumes: []plugin.Domain{plugin.DomainSandbox}, Capabilities: []string{"net-dial"}},
		Register: func(c *plugin.Context) error {
			kept = c
			_, during = c.Consumer().Resolve(plugin.DomainSandbox)
			if !c.HasCapability("net-dial") || c.HasCapability("other") {
				t.Error("HasCapability wrong")
			}
			if c.Manifest().Name != "early" || c.Logger() == nil || c.Context() == nil {
				t.Error("Context accessors wrong")
			}
			return nil
		},
	}
	r.Load(context.Background(), []plugin.Registration{
		provider("sandbox", map[plugin.Domain]any{plugin.DomainSandbox: &sandboxCtl{"sb"}}),
		reg,
	}, plugin.Config{})
	if !errors.Is(during, plugin.ErrAbsent) {
		t.Fatalf("Resolve during Register = %v, want ErrAbsent", during)
	}
	if _, err := kept.Consumer().Resolve(plugin.DomainSandbox); err != nil {
		t.Fatalf("Resolve after load = %v", err)
	}
	if err := kept.AddService("late", &recordingService{}); !errors.Is(err, plugin.ErrContextClosed) {
		t.Fatalf("late AddService = %v", err)
	}
	if !r.HasCapability("early", "net-dial") || r.HasCapability("sandbox", "net-dial") {
		t.Fatal("Registry.HasCapability wrong")
	}
	var nilConsumer *plugin.Consumer
	if _, err := nilConsumer.Resolve(plugin.DomainSandbox); !errors.Is(err, plugin.ErrNotDeclared) {
		t.Fatalf("nil consumer: %v", err)
	}
}

func TestConcurrentResolveAndDisable(t *testing.T) {
	r, _ := newRegistry(t, plugin.Options{})
	lsp := plugin.Registration{
		Manifest: plugin.Manifest{Name: "lsp", Provides: []plugin.Domain{plugin.DomainLSP}, Consumes: []plugin.Domain{plugin.DomainSandbox}},
		Register: func(c *plugin.Context) error {
			return c.Provide(plugin.DomainLSP, &lspCtl{"l"}, plugin.Requires(plugin.DomainSandbox))
		},
	}
	user, h := consumer("user", plugin.DomainLSP)
	r.Load(context.Background(), []plugin.Registration{
		provider("sandbox", map[plugin.Domain]any{plugin.DomainSandbox: &sandboxCtl{"sb"}}),
		lsp, user,
	}, plugin.Config{})
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				v, err := (*h).Resolve(plugin.DomainLSP)
				if (v == nil) == (err == nil) || err != nil && !errors.Is(err, plugin.ErrAbsent) {
					t.Errorf("Resolve = %v, %v", v, err)
					return
				}
			}
		})
	}
	for range 200 {
		must(t, r.Disable("sandbox", "flap"))
		must(t, r.Enable("sandbox"))
	}
	close(stop)
	wg.Wait()
}
