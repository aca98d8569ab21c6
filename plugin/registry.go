package plugin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
)

// Options configures a Registry. The zero value is valid.
type Options struct {
	// Logger receives one record per plugin loaded, skipped, disabled or
	// refused, with the reason. Nil means slog.Default().
	Logger *slog.Logger
	// Stamp, if non-nil, is applied once to every control when it is
	// provided (by a plugin or by core), after the domain's interface check,
	// with the domain and its owner's name ([CoreOwner] for core). What it
	// returns is what every resolver receives: core uses it to hand out
	// sandboxControl.WithDomain("sandbox"), so that every call through a
	// control is attributed to the owner's domain. A nil result refuses the
	// control. Stamp may run while the registry is locked and must not
	// call it. Nil Stamp hands controls out as provided.
	Stamp func(domain Domain, owner string, control any) any
	// Capabilities lists the capability names manifests may ask for. A
	// manifest asking for any other is invalid. Nil means none.
	Capabilities []string
}

// DomainOptions qualifies a declared domain. The zero value declares an
// ordinary domain that any plugin may provide and any declaring, admitted
// plugin may consume.
type DomainOptions struct {
	// CoreOnly makes the domain core's alone: only [Registry.ProvideCore]
	// provides it, only [Registry.ResolveCore] resolves it, and a manifest
	// naming it (or any variant of it) is invalid.
	CoreOnly bool
	// Admit, if non-nil, is core's restriction on which plugins may resolve
	// the domain, applied in addition to the owner's. A panic counts as a
	// refusal.
	Admit func(consumer string) bool
	// Absent, if non-nil, is joined into every ErrAbsent [*ResolveError]
	// for this domain, so callers can test for their own error
	// (sandbox.ErrUnavailable) with errors.Is.
	Absent error
}

// Config enables and disables plugins at load time.
type Config struct {
	// Disabled names plugins that Load must not register: their Register
	// function is never called, they own nothing and their domains resolve
	// as absent unless another, enabled plugin provides them. Names are
	// compared after trimming space and lower-casing; a name that matches no
	// registration is logged. Nil disables nothing.
	Disabled []string
}

// State is a plugin's load state.
type State string

// The states of a plugin. Only a loaded plugin's controls resolve; every
// other state makes them absent.
const (
	// StateLoaded: registered and enabled.
	StateLoaded State = "loaded"
	// StateDisabled: disabled by configuration (never registered) or by
	// [Registry.Disable] (registered, still owning its domains).
	StateDisabled State = "disabled"
	// StateSkipped: its Register returned [ErrSkipPlugin]. Not a failure.
	StateSkipped State = "skipped"
	// StateFailed: its manifest was invalid, its Register failed or
	// panicked, or a control it provided was refused.
	StateFailed State = "failed"
)

// PluginStatus describes one plugin.
type PluginStatus struct {
	Name    string
	Version string
	State   State
	// Reason explains any state but StateLoaded; Err is the same as an
	// error wrapping one of this package's sentinels (ErrInvalidManifest,
	// ErrDomainOwned, ErrRegisterPanic, ErrSkipPlugin, ErrDisabled, ...).
	Reason string
	Err    error
	// Provides lists the domains the plugin owns (loaded or disabled at run
	// time); empty when it was never registered.
	Provides []Domain
}

// PluginService is a service added by a loaded plugin, for a
// [ServiceManager].
type PluginService struct {
	Plugin  string
	Name    string
	Service Service
}

// Registry holds declared domains, loaded plugins and the controls they
// provide. It is pure: it has no global state and starts no goroutines. It
// runs plugin code only inside Load (Register functions) and, at
// resolution, the owners' admission functions. All methods are safe for
// concurrent use; Load calls are serialized. Domain checks must not call
// the registry.
type Registry struct {
	log          *slog.Logger
	stamp        func(Domain, string, any) any
	capabilities map[string]bool

	loadMu sync.Mutex // serializes Load

	mu      sync.RWMutex
	domains map[string]*domainInfo // by foldDomain
	plugins map[string]*record
	order   []*record
}

type domainInfo struct {
	id    Domain
	check func(any) error
	opts  DomainOptions
	owner *control
}

// control is a committed control.
type control struct {
	domain   Domain
	owner    *record // nil: core
	value    any     // stamped
	requires []Domain
	admit    []func(string) bool
}

func (c *control) ownerName() string {
	if c.owner == nil {
		return CoreOwner
	}
	return c.owner.m.Name
}

type record struct {
	m          Manifest
	state      State
	reason     string
	err        error
	registered bool // Register succeeded and its controls were committed
	provides   []*control
	services   []PluginService
}

// New returns an empty registry. Core declares its domains with
// RegisterDomain before loading plugins.
func New(opts Options) *Registry {
	r := &Registry{
		log:          opts.Logger,
		stamp:        opts.Stamp,
		capabilities: make(map[string]bool),
		domains:      make(map[string]*domainInfo),
		plugins:      make(map[string]*record),
	}
	if r.log == nil {
		r.log = slog.Default()
	}
	for _, c := range opts.Capabilities {
		r.capabilities[c] = true
	}
	return r
}

// RegisterDomain declares domain d. Every control provided for d must pass
// check, which returns nil if the control implements the domain's whole
// interface (see [Implements]); a nil check accepts any non-nil control.
//
// It fails if d is malformed, already declared, or a variant (case,
// separators) of a declared domain, and if d is [DomainSandboxArtifacts]
// without opts.CoreOnly.
func (r *Registry) RegisterDomain(d Domain, check func(any) error, opts DomainOptions) error {
	if !validDomain(d) {
		return fmt.Errorf("%w: malformed domain ID %q", ErrUnknownDomain, d)
	}
	key := foldDomain(d)
	if alwaysCoreOnly(key) && !opts.CoreOnly {
		return fmt.Errorf("%w: %q must be declared CoreOnly", ErrCoreOnly, d)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if info, ok := r.domains[key]; ok {
		return fmt.Errorf("plugin: domain %q already declared as %q", d, info.id)
	}
	r.domains[key] = &domainInfo{id: d, check: check, opts: opts}
	return nil
}

// Load registers regs in order. It is fail-open and atomic per plugin: a
// plugin that is disabled by cfg, has an invalid manifest or a name already
// taken, provides a domain already owned, or whose Register returns an
// error, panics or has a provide refused is left out entirely (nothing it
// provided resolves, none of its services are listed) with a logged
// reason, and the others load. A plugin whose Register returns
// [ErrSkipPlugin] is skipped the same way, logged as a reason rather than
// a failure.
//
// A domain's owner is the first plugin to provide it, in load order; a
// later plugin naming an owned domain in Provides is refused as a whole
// ([ErrDomainOwned]) before its Register runs, so it never operates with
// part of what it declared, and the first owner keeps working.
//
// Load may be called more than once; names stay unique across calls. ctx is
// given to Register functions through [Context.Context]. Load returns one
// status per registration, in order (including refused duplicates, which
// [Registry.Status] does not hold).
func (r *Registry) Load(ctx context.Context, regs []Registration, cfg Config) []PluginStatus {
	r.loadMu.Lock()
	defer r.loadMu.Unlock()
	disabled := make(map[string]bool)
	for _, n := range cfg.Disabled {
		disabled[strings.ToLower(strings.TrimSpace(n))] = true
	}
	out := make([]PluginStatus, 0, len(regs))
	for i := range regs {
		rec := r.loadOne(ctx, &regs[i], disabled)
		delete(disabled, regs[i].Name)
		out = append(out, rec.status())
	}
	for n := range disabled {
		r.log.Warn("plugin: configuration disables an unknown plugin", "plugin", n)
	}
	return out
}

func (r *Registry) loadOne(ctx context.Context, reg *Registration, disabled map[string]bool) *record {
	rec := &record{m: cloneManifest(reg.Manifest)}
	log := r.log.With("plugin", rec.m.Name, "version", rec.m.Version)

	r.mu.Lock()
	if _, taken := r.plugins[rec.m.Name]; taken || rec.m.Name == CoreOwner {
		r.mu.Unlock()
		rec.fail(fmt.Errorf("%w: %q", ErrDuplicatePlugin, rec.m.Name))
		log.Error("plugin refused", "reason", rec.reason)
		return rec // not recorded: the name belongs to the first
	}
	refuse := func(err error) *record {
		rec.fail(err)
		if validPluginName(rec.m.Name) {
			r.add(rec)
		}
		r.mu.Unlock()
		log.Error("plugin refused", "reason", rec.reason)
		return rec
	}
	if disabled[rec.m.Name] {
		rec.state, rec.err = StateDisabled, fmt.Errorf("%w by configuration", ErrDisabled)
		rec.reason = rec.err.Error()
		r.add(rec)
		r.mu.Unlock()
		log.Info("plugin disabled", "reason", rec.reason)
		return rec
	}
	if err := r.validateManifest(reg); err != nil {
		return refuse(err)
	}
	if err := r.checkUnowned(rec); err != nil {
		return refuse(err)
	}
	r.mu.Unlock()

	c := &Context{ctx: ctx, r: r, rec: rec, log: log, staged: make(map[Domain]*control)}
	err := callRegister(reg.Register, c)
	c.close()

	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil {
		err = c.commitCheck()
	}
	if err == nil {
		err = r.checkUnowned(rec) // core may have provided meanwhile
	}
	if err != nil {
		if errors.Is(err, ErrSkipPlugin) {
			rec.state, rec.err, rec.reason = StateSkipped, err, err.Error()
			log.Info("plugin skipped", "reason", rec.reason)
		} else {
			rec.fail(err)
			if errors.Is(err, ErrRegisterPanic) {
				log.Error("plugin refused", "reason", rec.reason, "stack", c.panicStack)
			} else {
				log.Error("plugin refused", "reason", rec.reason)
			}
		}
		r.add(rec)
		return rec
	}
	for _, d := range rec.m.Provides {
		p := c.staged[d]
		r.domains[foldDomain(d)].owner = p
		rec.provides = append(rec.provides, p)
	}
	rec.services = c.services
	rec.registered = true
	rec.state = StateLoaded
	r.add(rec)
	log.Info("plugin loaded", "provides", rec.m.Provides)
	return rec
}

func callRegister(f func(*Context) error, c *Context) (err error) {
	defer func() {
		if v := recover(); v != nil {
			c.panicStack = string(debug.Stack())
			err = fmt.Errorf("%w: %v", ErrRegisterPanic, v)
		}
	}()
	if err := f(c); err != nil {
		return fmt.Errorf("register: %w", err)
	}
	return nil
}

// checkUnowned fails if any domain rec provides already has an owner.
// r.mu must be held.
func (r *Registry) checkUnowned(rec *record) error {
	for _, d := range rec.m.Provides {
		if o := r.domains[foldDomain(d)].owner; o != nil {
			return fmt.Errorf("%w: %q is owned by %s", ErrDomainOwned, d, o.ownerName())
		}
	}
	return nil
}

func (r *Registry) add(rec *record) {
	r.plugins[rec.m.Name] = rec
	r.order = append(r.order, rec)
}

func (rec *record) fail(err error) {
	rec.state, rec.err, rec.reason = StateFailed, err, err.Error()
}

func (rec *record) status() PluginStatus {
	s := PluginStatus{Name: rec.m.Name, Version: rec.m.Version, State: rec.state, Reason: rec.reason, Err: rec.err}
	for _, p := range rec.provides {
		s.Provides = append(s.Provides, p.domain)
	}
	return s
}

func cloneManifest(m Manifest) Manifest {
	m.Provides = slices.Clone(m.Provides)
	m.Consumes = slices.Clone(m.Consumes)
	m.Capabilities = slices.Clone(m.Capabilities)
	return m
}

// Status reports the plugin called name. ok is false if no registration
// by that name was loaded (refused duplicates and invalid names are only
// in Load's result).
func (r *Registry) Status(name string) (s PluginStatus, ok bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	rec, ok := r.plugins[name]
	if !ok {
		return PluginStatus{}, false
	}
	return rec.status(), true
}

// Statuses reports every plugin the registry holds, in load order.
func (r *Registry) Statuses() []PluginStatus {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]PluginStatus, 0, len(r.order))
	for _, rec := range r.order {
		out = append(out, rec.status())
	}
	return out
}

// Owner reports who owns domain d: a plugin name, or [CoreOwner]. ok is
// false if d is not declared or has no owner. A plugin disabled with
// [Registry.Disable] still owns its domains (they resolve as absent).
func (r *Registry) Owner(d Domain) (owner string, ok bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	info, ok := r.domains[foldDomain(d)]
	if !ok || info.id != d || info.owner == nil {
		return "", false
	}
	return info.owner.ownerName(), true
}

// HasCapability reports whether plugin name is loaded and its manifest
// declares capability c.
func (r *Registry) HasCapability(name, c string) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	rec, ok := r.plugins[name]
	return ok && rec.state == StateLoaded && slices.Contains(rec.m.Capabilities, c)
}

// Services returns the services of every loaded plugin, in load order,
// for a [ServiceManager].
func (r *Registry) Services() []PluginService {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var out []PluginService
	for _, rec := range r.order {
		if rec.state == StateLoaded {
			out = append(out, rec.services...)
		}
	}
	return out
}

// Disable makes plugin name's controls resolve as absent from the next
// resolution on, and with them every control that requires one of its
// domains. The plugin keeps owning its domains and its Consumer resolves
// nothing. Disable does not stop its services; core does that with
// [ServiceManager.StopPlugin]. Disabling a plugin that is not loaded
// changes nothing and returns nil. It fails only for an unknown name.
func (r *Registry) Disable(name, reason string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	rec, ok := r.plugins[name]
	if !ok {
		return fmt.Errorf("%w: %q", ErrUnknownPlugin, name)
	}
	if rec.state != StateLoaded {
		return nil
	}
	rec.state, rec.err = StateDisabled, fmt.Errorf("%w: %s", ErrDisabled, reason)
	rec.reason = rec.err.Error()
	r.log.Info("plugin disabled", "plugin", name, "reason", reason)
	return nil
}

// Enable reverses Disable. It is a no-op for a loaded plugin. It fails for
// an unknown name and for a plugin that was never registered (disabled by
// configuration, skipped or failed): loading it needs a new Load.
func (r *Registry) Enable(name string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	rec, ok := r.plugins[name]
	if !ok {
		return fmt.Errorf("%w: %q", ErrUnknownPlugin, name)
	}
	if rec.state == StateLoaded {
		return nil
	}
	if !rec.registered {
		return fmt.Errorf("plugin: cannot enable %q: it was never registered (%s)", name, rec.reason)
	}
	rec.state, rec.err, rec.reason = StateLoaded, nil, ""
	r.log.Info("plugin enabled", "plugin", name)
	return nil
}

// ProvideCore provides control for domain d as core ([CoreOwner]). It is
// the only way to provide a core-only domain; core may also provide an
// ordinary one. The control must pass the domain's check; Stamp is applied
// with owner [CoreOwner]. Options restrict consumers and declare
// requirements as for plugins, but core may require any declared domain.
//
// It fails with ErrUnknownDomain if d is not declared exactly, with
// ErrDomainOwned if d has an owner, and with ErrNotImplemented if the
// control fails the domain's check.
func (r *Registry) ProvideCore(d Domain, ctl any, opts ...ProvideOption) error {
	var cfg provideConfig
	for _, o := range opts {
		o(&cfg)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	info, ok := r.domains[foldDomain(d)]
	if !ok || info.id != d {
		return fmt.Errorf("%w: %q", ErrUnknownDomain, d)
	}
	if info.owner != nil {
		return fmt.Errorf("%w: %q is owned by %s", ErrDomainOwned, d, info.owner.ownerName())
	}
	for _, q := range cfg.requires {
		if ri, ok := r.domains[foldDomain(q)]; !ok || ri.id != q || q == d {
			return fmt.Errorf("%w: requirement %q", ErrUnknownDomain, q)
		}
	}
	v, err := r.admitControl(info, CoreOwner, ctl)
	if err != nil {
		return err
	}
	info.owner = &control{domain: d, value: v, requires: slices.Clone(cfg.requires), admit: cfg.admit}
	r.log.Info("core provides control", "domain", d)
	return nil
}

// admitControl checks ctl against the domain's interface and stamps it.
// Check and Stamp may run with r.mu held and must not call the registry.
func (r *Registry) admitControl(info *domainInfo, owner string, ctl any) (any, error) {
	if isNil(ctl) {
		return nil, fmt.Errorf("%w: nil control for %q", ErrNotImplemented, info.id)
	}
	if info.check != nil {
		if err := safeCheck(info.check, ctl); err != nil {
			return nil, fmt.Errorf("%w: %q: %w", ErrNotImplemented, info.id, err)
		}
	}
	if r.stamp == nil {
		return ctl, nil
	}
	v := r.stamp(info.id, owner, ctl)
	if isNil(v) {
		return nil, fmt.Errorf("%w: stamping %q returned nil", ErrNotImplemented, info.id)
	}
	return v, nil
}

func safeCheck(check func(any) error, v any) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("check panicked: %v", p)
		}
	}()
	return check(v)
}

func isNil(v any) bool {
	if v == nil {
		return true
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Func, reflect.Chan, reflect.Slice:
		return rv.IsNil()
	}
	return false
}

// Implements returns a domain check (for [Registry.RegisterDomain]) that
// accepts a control only if it implements the interface type T, and
// otherwise names the methods it lacks or whose signatures differ. It
// panics if T is not an interface type.
func Implements[T any]() func(any) error {
	it := reflect.TypeFor[T]()
	if it.Kind() != reflect.Interface {
		panic(fmt.Sprintf("plugin.Implements: %v is not an interface type", it))
	}
	return func(v any) error {
		if v == nil {
			return errors.New("nil control")
		}
		t := reflect.TypeOf(v)
		if t.Implements(it) {
			return nil
		}
		var problems []string
		for i := range it.NumMethod() {
			m := it.Method(i)
			got, ok := t.MethodByName(m.Name)
			if !ok || m.PkgPath != "" {
				problems = append(problems, "missing "+m.Name)
				continue
			}
			if !sameSignature(got.Type, m.Type) {
				problems = append(problems, fmt.Sprintf("%s has %v, want %v", m.Name, got.Type, m.Type))
			}
		}
		return fmt.Errorf("%v does not implement %v: %s", t, it, strings.Join(problems, "; "))
	}
}

// sameSignature compares a method value's type (receiver first) with an
// interface method's type (no receiver).
func sameSignature(method, want reflect.Type) bool {
	if method.NumIn() != want.NumIn()+1 || method.NumOut() != want.NumOut() || method.IsVariadic() != want.IsVariadic() {
		return false
	}
	for i := range want.NumIn() {
		if method.In(i+1) != want.In(i) {
			return false
		}
	}
	for i := range want.NumOut() {
		if method.Out(i) != want.Out(i) {
			return false
		}
	}
	return true
}
