package plugin_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/plugin"
)

// lifeService records its life cycle. Run fails the first failRuns times
// (panicking instead if panicRun), then blocks until cancelled, or returns
// nil at once if exitRun.
type lifeService struct {
	provisionErr error
	validateErr  error
	cleanupErr   error
	failRuns     int
	panicRun     bool
	exitRun      bool
	blockProv    bool // Provision waits for its context

	mu      sync.Mutex
	events  []string
	runs    int
	running chan struct{} // closed when a Run blocks
}

func newLife() *lifeService { return &lifeService{running: make(chan struct{})} }

func (s *lifeService) log(e string) {
	s.mu.Lock()
	s.events = append(s.events, e)
	s.mu.Unlock()
}

func (s *lifeService) Events() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.events)
}

func (s *lifeService) Provision(ctx context.Context) error {
	s.log("provision")
	if s.blockProv {
		<-ctx.Done()
		return ctx.Err()
	}
	return s.provisionErr
}

func (s *lifeService) Validate() error { s.log("validate"); return s.validateErr }

func (s *lifeService) Run(ctx context.Context) error {
	s.log("run")
	s.mu.Lock()
	s.runs++
	n := s.runs
	s.mu.Unlock()
	if n <= s.failRuns {
		if s.panicRun {
			panic("run exploded")
		}
		return errors.New("run crashed")
	}
	if s.exitRun {
		return nil
	}
	close(s.running)
	<-ctx.Done()
	return ctx.Err()
}

func (s *lifeService) Cleanup() error { s.log("cleanup"); return s.cleanupErr }

func quickManager() *plugin.ServiceManager {
	return plugin.NewServiceManager(plugin.ServiceOptions{
		Logger:     slog.New(slog.DiscardHandler),
		Backoff:    time.Millisecond,
		MaxBackoff: 4 * time.Millisecond,
	})
}

func waitState(t *testing.T, m *plugin.ServiceManager, plugin_, name string, want plugin.ServiceState) plugin.ServiceStatus {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, ok := m.Status(plugin_, name)
		if ok && st.State == want {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("service %s/%s: state %q (%v), want %q", plugin_, name, st.State, st.Err, want)
		}
		time.Sleep(time.Millisecond)
	}
}

func stop(t *testing.T, m *plugin.ServiceManager) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return m.Stop(ctx)
}

func TestServiceLifecycle(t *testing.T) {
	m := quickManager()
	s := newLife()
	must(t, m.Start(context.Background(), []plugin.PluginService{{Plugin: "p", Name: "svc", Service: s}}))
	<-s.running
	waitState(t, m, "p", "svc", plugin.ServiceRunning)
	must(t, stop(t, m))
	st := waitState(t, m, "p", "svc", plugin.ServiceStopped)
	if st.Err != nil || st.Restarts != 0 {
		t.Fatalf("status %+v", st)
	}
	if got, want := s.Events(), []string{"provision", "validate", "run", "cleanup"}; !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	// Stop is idempotent; Start after Stop is refused.
	must(t, stop(t, m))
	if err := m.Start(context.Background(), []plugin.PluginService{{Plugin: "p", Name: "other", Service: newLife()}}); !errors.Is(err, plugin.ErrServicesStopped) {
		t.Fatalf("Start after Stop = %v", err)
	}
}

func TestServiceRestartsCrashedRun(t *testing.T) {
	for _, panics := range []bool{false, true} {
		t.Run(map[bool]string{false: "error", true: "panic"}[panics], func(t *testing.T) {
			m := quickManager()
			s := newLife()
			s.failRuns, s.panicRun = 2, panics
			must(t, m.Start(context.Background(), []plugin.PluginService{{Plugin: "p", Name: "svc", Service: s}}))
			<-s.running
			st := waitState(t, m, "p", "svc", plugin.ServiceRunning)
			if st.Restarts != 2 {
				t.Fatalf("Restarts = %d, want 2", st.Restarts)
			}
			if panics != errors.Is(st.Err, plugin.ErrServicePanic) {
				t.Fatalf("last error %v", st.Err)
			}
			must(t, stop(t, m))
			if got, want := s.Events(), []string{"provision", "validate", "run", "run", "run", "cleanup"}; !slices.Equal(got, want) {
				t.Fatalf("events %v, want %v", got, want)
			}
		})
	}
}

func TestServiceRestartsAreBounded(t *testing.T) {
	m := plugin.NewServiceManager(plugin.ServiceOptions{
		Logger: slog.New(slog.DiscardHandler), MaxRestarts: 2, Backoff: time.Millisecond,
	})
	s := newLife()
	s.failRuns = 1000
	must(t, m.Start(context.Background(), []plugin.PluginService{{Plugin: "p", Name: "svc", Service: s}}))
	st := waitState(t, m, "p", "svc", plugin.ServiceFailed)
	if st.Restarts != 2 || st.Err == nil || !strings.Contains(st.Err.Error(), "run crashed") {
		t.Fatalf("status %+v", st)
	}
	must(t, stop(t, m)) // waits for cleanup
	if got, want := s.Events(), []string{"provision", "validate", "run", "run", "run", "cleanup"}; !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
}

func TestServiceNeverRestartedWhenNegative(t *testing.T) {
	m := plugin.NewServiceManager(plugin.ServiceOptions{Logger: slog.New(slog.DiscardHandler), MaxRestarts: -1})
	s := newLife()
	s.failRuns = 1
	must(t, m.Start(context.Background(), []plugin.PluginService{{Plugin: "p", Name: "svc", Service: s}}))
	st := waitState(t, m, "p", "svc", plugin.ServiceFailed)
	if st.Restarts != 0 {
		t.Fatalf("Restarts = %d", st.Restarts)
	}
	must(t, stop(t, m))
}

func TestServiceExitIsNotRestarted(t *testing.T) {
	m := quickManager()
	s := newLife()
	s.exitRun = true
	must(t, m.Start(context.Background(), []plugin.PluginService{{Plugin: "p", Name: "svc", Service: s}}))
	waitState(t, m, "p", "svc", plugin.ServiceExited)
	must(t, stop(t, m))
	if got, want := s.Events(), []string{"provision", "validate", "run", "cleanup"}; !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
}

func TestServiceCleanupAfterFailedProvisioning(t *testing.T) {
	m := quickManager()
	badProv, badValid, good := newLife(), newLife(), newLife()
	badProv.provisionErr = errors.New("no port")
	badValid.validateErr = errors.New("bad config")
	badProv.cleanupErr = errors.New("cleanup also failed")
	err := m.Start(context.Background(), []plugin.PluginService{
		{Plugin: "a", Name: "prov", Service: badProv},
		{Plugin: "a", Name: "valid", Service: badValid},
		{Plugin: "b", Name: "good", Service: good},
	})
	if err == nil || !strings.Contains(err.Error(), "no port") || !strings.Contains(err.Error(), "bad config") {
		t.Fatalf("Start = %v, want both provisioning failures", err)
	}
	<-good.running // fail-open: the good one runs
	if got, want := badProv.Events(), []string{"provision", "cleanup"}; !slices.Equal(got, want) {
		t.Fatalf("failed provision: events %v, want %v", got, want)
	}
	if got, want := badValid.Events(), []string{"provision", "validate", "cleanup"}; !slices.Equal(got, want) {
		t.Fatalf("failed validate: events %v, want %v", got, want)
	}
	st, _ := m.Status("a", "prov")
	if st.State != plugin.ServiceFailed || st.CleanupErr == nil {
		t.Fatalf("status %+v", st)
	}
	// Stop reports the cleanup failure it knows of.
	if err := stop(t, m); err == nil || !strings.Contains(err.Error(), "cleanup also failed") {
		t.Fatalf("Stop = %v", err)
	}
	if n := len(m.Statuses()); n != 3 {
		t.Fatalf("Statuses: %d", n)
	}
}

func TestServiceStopDuringProvisioning(t *testing.T) {
	m := quickManager()
	s := newLife()
	s.blockProv = true
	started := make(chan error)
	go func() {
		started <- m.Start(context.Background(), []plugin.PluginService{{Plugin: "p", Name: "svc", Service: s}})
	}()
	waitState(t, m, "p", "svc", plugin.ServiceProvisioning)
	must(t, stop(t, m))
	if err := <-started; !errors.Is(err, context.Canceled) {
		t.Fatalf("Start = %v, want context.Canceled", err)
	}
	if got, want := s.Events(), []string{"provision", "cleanup"}; !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
}

// stubborn ignores cancellation until released.
type stubborn struct {
	release chan struct{}
	running chan struct{}
}

func (s *stubborn) Run(context.Context) error {
	close(s.running)
	<-s.release
	return nil
}

func TestServiceStopIsBounded(t *testing.T) {
	m := quickManager()
	s := &stubborn{release: make(chan struct{}), running: make(chan struct{})}
	must(t, m.Start(context.Background(), []plugin.PluginService{{Plugin: "p", Name: "stubborn", Service: s}}))
	<-s.running
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err := m.Stop(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "p/stubborn") {
		t.Fatalf("Stop = %v", err)
	}
	close(s.release)
	must(t, stop(t, m))
	waitState(t, m, "p", "stubborn", plugin.ServiceStopped)
}

func TestServiceStopPlugin(t *testing.T) {
	m := quickManager()
	a, b := newLife(), newLife()
	must(t, m.Start(context.Background(), []plugin.PluginService{
		{Plugin: "a", Name: "svc", Service: a},
		{Plugin: "b", Name: "svc", Service: b},
	}))
	<-a.running
	<-b.running
	// A running service cannot be started twice.
	if err := m.Start(context.Background(), []plugin.PluginService{{Plugin: "a", Name: "svc", Service: newLife()}}); err == nil {
		t.Fatal("duplicate Start accepted")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	must(t, m.StopPlugin(ctx, "a"))
	waitState(t, m, "a", "svc", plugin.ServiceStopped)
	if st, _ := m.Status("b", "svc"); st.State != plugin.ServiceRunning {
		t.Fatalf("b: %+v", st)
	}
	// A stopped service may be started again, in its place.
	again := newLife()
	must(t, m.Start(context.Background(), []plugin.PluginService{{Plugin: "a", Name: "svc", Service: again}}))
	<-again.running
	if n := len(m.Statuses()); n != 2 {
		t.Fatalf("Statuses: %d", n)
	}
	must(t, stop(t, m))
	if got := a.Events(); got[len(got)-1] != "cleanup" {
		t.Fatalf("a: %v", got)
	}
}

func TestNilServiceManager(t *testing.T) {
	var m *plugin.ServiceManager // a runner process has none
	if err := m.Stop(context.Background()); err != nil {
		t.Fatalf("Stop = %v", err)
	}
	if err := m.StopPlugin(context.Background(), "x"); err != nil {
		t.Fatalf("StopPlugin = %v", err)
	}
	if err := m.Start(context.Background(), nil); !errors.Is(err, plugin.ErrNoServiceManager) {
		t.Fatalf("Start = %v", err)
	}
	if _, ok := m.Status("x", "y"); ok || m.Statuses() != nil {
		t.Fatal("nil manager reports services")
	}
}

// TestRegistryServicesRun wires the registry to the manager as core does:
// only loaded plugins' services run, and a service resolves controls at call
// time through its plugin's Consumer.
func TestRegistryServicesRun(t *testing.T) {
	r, _ := newRegistry(t, plugin.Options{})
	var resolved atomic.Int32
	indexer := plugin.Registration{
		Manifest: plugin.Manifest{Name: "indexer", Consumes: []plugin.Domain{plugin.DomainSandbox}},
		Register: func(c *plugin.Context) error {
			cons := c.Consumer()
			return c.AddService("loop", plugin.ServiceFunc(func(ctx context.Context) error {
				if _, err := cons.Resolve(plugin.DomainSandbox); err == nil {
					resolved.Add(1)
				}
				<-ctx.Done()
				return nil
			}))
		},
	}
	broken := plugin.Registration{
		Manifest: plugin.Manifest{Name: "broken"},
		Register: func(c *plugin.Context) error {
			must(t, c.AddService("loop", plugin.ServiceFunc(func(context.Context) error {
				t.Error("a failed plugin's service ran")
				return nil
			})))
			return errors.New("nope")
		},
	}
	r.Load(context.Background(), []plugin.Registration{
		provider("sandbox", map[plugin.Domain]any{plugin.DomainSandbox: &sandboxCtl{"sb"}}),
		indexer, broken,
	}, plugin.Config{})
	svcs := r.Services()
	if len(svcs) != 1 || svcs[0].Plugin != "indexer" || svcs[0].Name != "loop" {
		t.Fatalf("Services = %+v", svcs)
	}
	m := quickManager()
	must(t, m.Start(context.Background(), svcs))
	waitState(t, m, "indexer", "loop", plugin.ServiceRunning)
	deadline := time.Now().Add(5 * time.Second)
	for resolved.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if resolved.Load() != 1 {
		t.Fatal("the service did not resolve sandbox")
	}
	must(t, stop(t, m))
}
