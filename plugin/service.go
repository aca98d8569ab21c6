package plugin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"
)

// Service is a plugin's long-running task, added with [Context.AddService]
// and run by a [ServiceManager]. Its life follows Caddy's modules:
// construction (in Register) is free of side effects; then the manager
// calls Provision and Validate if the service implements [Provisioner] and
// [Validator], runs Run, and finally calls Cleanup if it implements
// [CleanerUpper] — also when Provision or Validate failed, so Cleanup must
// cope with a partly provisioned service.
type Service interface {
	// Run does the service's work until ctx is cancelled, then returns.
	// Returning an error (or panicking) before that is a crash: the manager
	// restarts Run with backoff, a bounded number of times. Returning nil
	// before ctx is cancelled means the work is done: Run is not restarted.
	Run(ctx context.Context) error
}

// Provisioner is implemented by services that set themselves up before
// running (open files, resolve settings). ctx ends when Start's context
// does or the service is stopped.
type Provisioner interface {
	Provision(ctx context.Context) error
}

// Validator is implemented by services that check their provisioned state
// before running.
type Validator interface {
	Validate() error
}

// CleanerUpper is implemented by services that release resources. Cleanup
// runs exactly once per Start of the service, after Run's last return or
// after a failed Provision or Validate.
type CleanerUpper interface {
	Cleanup() error
}

// ServiceFunc adapts a function to a Service with no other life-cycle step.
type ServiceFunc func(ctx context.Context) error

// Run calls f(ctx).
func (f ServiceFunc) Run(ctx context.Context) error { return f(ctx) }

var _ Service = ServiceFunc(nil)

// ServiceOptions tunes a ServiceManager. The zero value means the
// documented defaults.
type ServiceOptions struct {
	// Logger receives service starts, crashes, restarts and stops. Nil
	// means slog.Default().
	Logger *slog.Logger
	// MaxRestarts bounds consecutive restarts of a crashing Run; once
	// exceeded the service is failed. Zero means 5; negative means a crash
	// is never restarted.
	MaxRestarts int
	// Backoff is the wait before the first restart; it doubles with every
	// consecutive crash, up to MaxBackoff. Zero means 1 s.
	Backoff time.Duration
	// MaxBackoff caps the wait between restarts. Zero means 30 s.
	MaxBackoff time.Duration
	// StableAfter is how long a Run must last for its crash to count as a
	// first crash again (the restart count and backoff reset). Zero means
	// one minute.
	StableAfter time.Duration
}

// ServiceState is where a service is in its life.
type ServiceState string

// The states of a service.
const (
	ServiceProvisioning ServiceState = "provisioning" // Provision or Validate running
	ServiceRunning      ServiceState = "running"      // Run running
	ServiceBackoff      ServiceState = "backoff"      // crashed, waiting to restart
	ServiceExited       ServiceState = "exited"       // Run returned nil on its own
	ServiceFailed       ServiceState = "failed"       // provisioning failed or restarts exhausted
	ServiceStopped      ServiceState = "stopped"      // stopped by Stop or StopPlugin
)

// ServiceStatus describes one service.
type ServiceStatus struct {
	Plugin string
	Name   string
	State  ServiceState
	// Restarts counts every restart since Start.
	Restarts int
	// Err is the last failure: of Provision, Validate or Run.
	Err error
	// CleanupErr is Cleanup's error, once it ran.
	CleanupErr error
}

// ServiceManager starts, supervises and stops plugins' services. Core
// builds one in daemon mode; a delegated runner process has none: its
// *ServiceManager is nil, on which Stop, StopPlugin, Status and Statuses
// are safe no-ops and Start returns [ErrNoServiceManager].
type ServiceManager struct {
	opts ServiceOptions
	log  *slog.Logger

	mu      sync.Mutex
	stopped bool
	byKey   map[string]*managedService
	order   []*managedService
}

type managedService struct {
	ps     PluginService
	runCtx context.Context
	cancel context.CancelFunc
	done   chan struct{} // closed after Cleanup

	// guarded by ServiceManager.mu
	st ServiceStatus
}

// NewServiceManager returns a manager with no services.
func NewServiceManager(opts ServiceOptions) *ServiceManager {
	if opts.MaxRestarts == 0 {
		opts.MaxRestarts = 5
	}
	if opts.Backoff <= 0 {
		opts.Backoff = time.Second
	}
	if opts.MaxBackoff <= 0 {
		opts.MaxBackoff = 30 * time.Second
	}
	if opts.StableAfter <= 0 {
		opts.StableAfter = time.Minute
	}
	m := &ServiceManager{opts: opts, log: opts.Logger, byKey: make(map[string]*managedService)}
	if m.log == nil {
		m.log = slog.Default()
	}
	return m
}

func serviceKey(plugin, name string) string { return plugin + "/" + name }

// Start provisions and validates services one by one, in order, and runs
// each that succeeded in its own goroutine. It is fail-open: a service
// whose Provision or Validate fails (or panics) is cleaned up and marked
// failed, and the others start. Start blocks until every service is
// provisioned; ctx bounds provisioning only. Run's context carries ctx's
// values but is cancelled only by Stop or StopPlugin.
//
// Start returns the joined provisioning failures (nil if every service
// started), [ErrServicesStopped] after Stop, and [ErrNoServiceManager] on a
// nil manager. A service already managed and not finished is refused;
// Start may be called again for services added later.
func (m *ServiceManager) Start(ctx context.Context, services []PluginService) error {
	if m == nil {
		return ErrNoServiceManager
	}
	var errs []error
	for _, ps := range services {
		s, err := m.add(ctx, ps)
		if err != nil {
			if errors.Is(err, ErrServicesStopped) {
				return errors.Join(append(errs, err)...)
			}
			errs = append(errs, err)
			continue
		}
		if err := m.provision(ctx, s); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (m *ServiceManager) add(ctx context.Context, ps PluginService) (*managedService, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped {
		return nil, ErrServicesStopped
	}
	if isNil(ps.Service) {
		return nil, fmt.Errorf("plugin: service %s/%s is nil", ps.Plugin, ps.Name)
	}
	key := serviceKey(ps.Plugin, ps.Name)
	if old, ok := m.byKey[key]; ok {
		select {
		case <-old.done:
		default:
			return nil, fmt.Errorf("plugin: service %s is already managed", key)
		}
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s := &managedService{ps: ps, runCtx: runCtx, cancel: cancel, done: make(chan struct{}),
		st: ServiceStatus{Plugin: ps.Plugin, Name: ps.Name, State: ServiceProvisioning}}
	if i := slices.IndexFunc(m.order, func(o *managedService) bool { return o == m.byKey[key] }); i >= 0 {
		m.order[i] = s // a finished service started again keeps its place
	} else {
		m.order = append(m.order, s)
	}
	m.byKey[key] = s
	return s, nil
}

// provision runs Provision and Validate, then launches the supervisor.
// Stop cancels provisioning through s.runCtx.
func (m *ServiceManager) provision(ctx context.Context, s *managedService) error {
	log := m.log.With("plugin", s.ps.Plugin, "service", s.ps.Name)
	pctx, cancel := context.WithCancel(ctx)
	stopProv := context.AfterFunc(s.runCtx, cancel)
	err := provisionService(pctx, s.ps.Service)
	stopProv()
	cancel()
	if err == nil && s.runCtx.Err() != nil {
		err = fmt.Errorf("stopped during provisioning: %w", s.runCtx.Err())
	}
	if err != nil {
		err = fmt.Errorf("plugin: service %s/%s: %w", s.ps.Plugin, s.ps.Name, err)
		m.set(s, func(st *ServiceStatus) { st.State, st.Err = ServiceFailed, err })
		log.Error("service failed to start", "err", err)
		m.cleanup(s, log)
		return err
	}
	m.set(s, func(st *ServiceStatus) { st.State = ServiceRunning })
	log.Info("service started")
	go m.supervise(s, log)
	return nil
}

func provisionService(ctx context.Context, svc Service) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: %v", ErrServicePanic, p)
		}
	}()
	if p, ok := svc.(Provisioner); ok {
		if err := p.Provision(ctx); err != nil {
			return fmt.Errorf("provision: %w", err)
		}
	}
	if v, ok := svc.(Validator); ok {
		if err := v.Validate(); err != nil {
			return fmt.Errorf("validate: %w", err)
		}
	}
	return nil
}

func (m *ServiceManager) supervise(s *managedService, log *slog.Logger) {
	ctx := s.runCtx
	backoff := m.opts.Backoff
	consecutive := 0
	for {
		began := time.Now()
		err := runService(ctx, s.ps.Service)
		if ctx.Err() != nil {
			m.set(s, func(st *ServiceStatus) {
				st.State = ServiceStopped
				if err != nil && !errors.Is(err, context.Canceled) {
					st.Err = err
				}
			})
			break
		}
		if err == nil {
			m.set(s, func(st *ServiceStatus) { st.State = ServiceExited })
			log.Info("service exited")
			break
		}
		if time.Since(began) >= m.opts.StableAfter {
			consecutive, backoff = 0, m.opts.Backoff
		}
		if m.opts.MaxRestarts < 0 || consecutive >= m.opts.MaxRestarts {
			m.set(s, func(st *ServiceStatus) { st.State, st.Err = ServiceFailed, err })
			log.Error("service failed; not restarting", "err", err, "consecutive_restarts", consecutive)
			break
		}
		consecutive++
		m.set(s, func(st *ServiceStatus) { st.State, st.Err = ServiceBackoff, err; st.Restarts++ })
		log.Warn("service crashed; restarting", "err", err, "backoff", backoff)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			m.set(s, func(st *ServiceStatus) { st.State = ServiceStopped })
		case <-t.C:
			m.set(s, func(st *ServiceStatus) { st.State = ServiceRunning })
		}
		if ctx.Err() != nil {
			break
		}
		backoff = min(2*backoff, m.opts.MaxBackoff)
	}
	m.cleanup(s, log)
}

func runService(ctx context.Context, svc Service) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: %v", ErrServicePanic, p)
		}
	}()
	return svc.Run(ctx)
}

// cleanup runs Cleanup if the service has one, records its error and
// marks the service done.
func (m *ServiceManager) cleanup(s *managedService, log *slog.Logger) {
	defer close(s.done)
	defer s.cancel()
	c, ok := s.ps.Service.(CleanerUpper)
	if !ok {
		return
	}
	err := func() (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("%w: %v", ErrServicePanic, p)
			}
		}()
		return c.Cleanup()
	}()
	if err != nil {
		err = fmt.Errorf("plugin: service %s/%s: cleanup: %w", s.ps.Plugin, s.ps.Name, err)
		log.Error("service cleanup failed", "err", err)
	}
	m.set(s, func(st *ServiceStatus) { st.CleanupErr = err })
}

func (m *ServiceManager) set(s *managedService, f func(*ServiceStatus)) {
	m.mu.Lock()
	f(&s.st)
	m.mu.Unlock()
}

// Stop cancels every service's context (provisioning ones included), waits
// for each Run to return and its Cleanup to finish, and refuses later
// Starts. It blocks until then or until ctx ends, in which case it returns
// an error wrapping ctx.Err() naming the services still running (their
// goroutines end on their own when Run returns). Otherwise it returns the
// joined Cleanup errors, or nil. It may be called more than once, and on a
// nil manager, where it does nothing and returns nil.
func (m *ServiceManager) Stop(ctx context.Context) error {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	m.stopped = true
	m.mu.Unlock()
	return m.stopWhere(ctx, func(PluginService) bool { return true })
}

// StopPlugin stops plugin's services as Stop does, leaving the others
// running; they may be started again later. It is a no-op on a nil
// manager.
func (m *ServiceManager) StopPlugin(ctx context.Context, plugin string) error {
	if m == nil {
		return nil
	}
	return m.stopWhere(ctx, func(ps PluginService) bool { return ps.Plugin == plugin })
}

func (m *ServiceManager) stopWhere(ctx context.Context, match func(PluginService) bool) error {
	m.mu.Lock()
	var targets []*managedService
	for _, s := range m.order {
		if match(s.ps) {
			s.cancel()
			targets = append(targets, s)
		}
	}
	m.mu.Unlock()
	var running []string
	for _, s := range targets {
		select {
		case <-s.done:
		case <-ctx.Done():
			select {
			case <-s.done:
			default:
				running = append(running, serviceKey(s.ps.Plugin, s.ps.Name))
			}
		}
	}
	if len(running) > 0 {
		return fmt.Errorf("plugin: stopping services: %w (still running: %s)", ctx.Err(), strings.Join(running, ", "))
	}
	var errs []error
	m.mu.Lock()
	for _, s := range targets {
		if s.st.CleanupErr != nil {
			errs = append(errs, s.st.CleanupErr)
		}
	}
	m.mu.Unlock()
	return errors.Join(errs...)
}

// Status reports service name of plugin. ok is false if the manager (or a
// nil manager) does not hold it.
func (m *ServiceManager) Status(plugin, name string) (st ServiceStatus, ok bool) {
	if m == nil {
		return ServiceStatus{}, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.byKey[serviceKey(plugin, name)]
	if !ok {
		return ServiceStatus{}, false
	}
	return s.st, true
}

// Statuses reports every service the manager holds, in start order (nil
// for a nil manager).
func (m *ServiceManager) Statuses() []ServiceStatus {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]ServiceStatus, 0, len(m.order))
	for _, s := range m.order {
		out = append(out, s.st)
	}
	return out
}
