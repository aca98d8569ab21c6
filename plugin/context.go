package plugin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
)

// Context is what a plugin's Register function receives: the only way to
// provide controls and add services, and only for what its manifest
// declares, so a plugin can never act or publish as another. Everything
// done through it is staged and committed when Register returns nil;
// otherwise it is discarded. A Context must not be used after Register
// returns (its methods then fail with [ErrContextClosed]), but the
// [Consumer] it hands out stays valid.
type Context struct {
	ctx context.Context
	r   *Registry
	rec *record
	log *slog.Logger

	mu         sync.Mutex
	closed     bool
	staged     map[Domain]*control
	services   []PluginService
	poisoned   error // first refused operation: fails the plugin
	panicStack string
}

// Context returns the context Load was called with. It carries values and
// cancellation for registration only; services get their own context from
// the [ServiceManager].
func (c *Context) Context() context.Context { return c.ctx }

// Logger returns the registry's logger with the plugin's name and version.
func (c *Context) Logger() *slog.Logger { return c.log }

// Manifest returns a copy of the plugin's manifest.
func (c *Context) Manifest() Manifest { return cloneManifest(c.rec.m) }

// HasCapability reports whether the plugin's manifest declares capability
// name (and the registry therefore accepted it).
func (c *Context) HasCapability(name string) bool {
	return slices.Contains(c.rec.m.Capabilities, name)
}

// Consumer returns the plugin's handle for resolving the domains its
// manifest consumes. It resolves nothing until the plugin is loaded (during
// Register every resolution reports ErrAbsent): keep the handle, and
// resolve when a control is needed, every time.
func (c *Context) Consumer() *Consumer { return &Consumer{r: c.r, rec: c.rec} }

// ProvideOption qualifies a provided control.
type ProvideOption func(*provideConfig)

type provideConfig struct {
	admit    []func(string) bool
	requires []Domain
}

// AdmitOnly restricts the control to the named consumer plugins. Without
// an admission option, every plugin that declares the domain in Consumes
// is admitted. Several admission options must all admit.
func AdmitOnly(consumers ...string) ProvideOption {
	names := slices.Clone(consumers)
	return AdmitFunc(func(c string) bool { return slices.Contains(names, c) })
}

// AdmitFunc restricts the control to the consumers for which admit returns
// true. admit is called at every resolution by a plugin (never for core);
// it must be fast and must not call the registry. A panic counts as a
// refusal.
func AdmitFunc(admit func(consumer string) bool) ProvideOption {
	return func(p *provideConfig) {
		if admit != nil {
			p.admit = append(p.admit, admit)
		}
	}
}

// Requires declares domains the control needs. Whenever one of them does
// not resolve for the control's owner (no owner, disabled, skipped or
// failed, not admitted, or itself missing a requirement), the control
// resolves as absent, exactly like a disabled plugin. A plugin may only
// require domains its manifest consumes.
func Requires(domains ...Domain) ProvideOption {
	ds := slices.Clone(domains)
	return func(p *provideConfig) { p.requires = append(p.requires, ds...) }
}

// Provide stages ctl as the plugin's control for domain d. d must be one of
// the manifest's Provides and not yet provided by this plugin; ctl must pass
// the domain's interface check; requirements must be in the manifest's
// Consumes. A refused Provide fails the whole plugin, even if Register
// ignores the error and returns nil.
func (c *Context) Provide(d Domain, ctl any, opts ...ProvideOption) error {
	var cfg provideConfig
	for _, o := range opts {
		o(&cfg)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrContextClosed
	}
	return c.poison(c.provide(d, ctl, cfg))
}

func (c *Context) provide(d Domain, ctl any, cfg provideConfig) error {
	m := &c.rec.m
	if !slices.Contains(m.Provides, d) {
		c.r.mu.RLock()
		err := c.r.checkDomainRef(d)
		c.r.mu.RUnlock()
		if errors.Is(err, ErrCoreOnly) {
			return fmt.Errorf("provide: %w", err)
		}
		return fmt.Errorf("%w: provide %q: not in the manifest's Provides", ErrNotDeclared, d)
	}
	if _, dup := c.staged[d]; dup {
		return fmt.Errorf("plugin: provide %q: already provided by this plugin", d)
	}
	for _, q := range cfg.requires {
		if !slices.Contains(m.Consumes, q) {
			return fmt.Errorf("%w: provide %q: requirement %q not in the manifest's Consumes", ErrNotDeclared, d, q)
		}
	}
	c.r.mu.RLock()
	info := c.r.domains[foldDomain(d)]
	c.r.mu.RUnlock()
	v, err := c.r.admitControl(info, m.Name, ctl)
	if err != nil {
		return fmt.Errorf("provide: %w", err)
	}
	c.staged[d] = &control{domain: d, owner: c.rec, value: v, requires: slices.Clone(cfg.requires), admit: cfg.admit}
	return nil
}

// AddService stages a long-running service, started by core's
// [ServiceManager] once the plugin is loaded. name must be a valid plugin
// name (lower-case letters, digits, '.', '_', '-') and unique within the
// plugin. A refused AddService fails the whole plugin.
func (c *Context) AddService(name string, s Service) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrContextClosed
	}
	var err error
	switch {
	case isNil(s):
		err = fmt.Errorf("plugin: service %q is nil", name)
	case !validPluginName(name):
		err = fmt.Errorf("plugin: bad service name %q", name)
	case slices.ContainsFunc(c.services, func(p PluginService) bool { return p.Name == name }):
		err = fmt.Errorf("plugin: service %q added twice", name)
	default:
		c.services = append(c.services, PluginService{Plugin: c.rec.m.Name, Name: name, Service: s})
	}
	return c.poison(err)
}

func (c *Context) poison(err error) error {
	if err != nil && c.poisoned == nil {
		c.poisoned = err
	}
	return err
}

func (c *Context) close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
}

// commitCheck reports why the staged registration may not be committed.
func (c *Context) commitCheck() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.poisoned != nil {
		return c.poisoned
	}
	for _, d := range c.rec.m.Provides {
		if _, ok := c.staged[d]; !ok {
			return fmt.Errorf("%w: Provides %q but Register did not provide it", ErrInvalidManifest, d)
		}
	}
	return nil
}

// Consumer resolves controls on behalf of one plugin. It holds no control:
// every Resolve looks the domain up anew, so a control whose owner (or one
// of whose requirements) was disabled in the meantime is absent. Callers
// should resolve when they need a control and not keep what Resolve
// returned across calls. A Consumer is safe for concurrent use.
type Consumer struct {
	r   *Registry
	rec *record
}

// Name returns the consuming plugin's name.
func (c *Consumer) Name() string {
	if c == nil || c.rec == nil {
		return ""
	}
	return c.rec.m.Name
}

// Resolve returns the control for domain d, stamped with its owner's
// domain. It returns a [*ResolveError] wrapping
//   - ErrCoreOnly if d is, or is a variant of, a core-only domain;
//   - ErrNotDeclared if the plugin's manifest does not consume d exactly;
//   - ErrNotAdmitted if core's domain restriction or the owner's restriction
//     refuses the plugin;
//   - ErrAbsent if this plugin is not loaded, d has no owner, the owner is
//     not loaded, or a requirement of the control does not resolve for its
//     owner.
func (c *Consumer) Resolve(d Domain) (any, error) {
	if c == nil || c.rec == nil || c.r == nil {
		return nil, &ResolveError{Domain: d, Err: ErrNotDeclared, Reason: "nil consumer"}
	}
	c.r.mu.RLock()
	defer c.r.mu.RUnlock()
	v, err := c.r.resolveLocked(c.rec, d, nil)
	if err != nil {
		return nil, err
	}
	return v, nil
}

// ResolveAs resolves d through c and asserts the control to T. A control
// that is not a T is reported as an error wrapping ErrNotImplemented.
func ResolveAs[T any](c *Consumer, d Domain) (T, error) {
	v, err := c.Resolve(d)
	return as[T](v, err, d)
}

// ResolveCoreAs resolves d as core and asserts the control to T.
func ResolveCoreAs[T any](r *Registry, d Domain) (T, error) {
	v, err := r.ResolveCore(d)
	return as[T](v, err, d)
}

func as[T any](v any, err error, d Domain) (T, error) {
	var zero T
	if err != nil {
		return zero, err
	}
	t, ok := v.(T)
	if !ok {
		return zero, fmt.Errorf("%w: control for %q is %T, not %v", ErrNotImplemented, d, v, typeName[T]())
	}
	return t, nil
}

func typeName[T any]() string {
	var p *T
	return fmt.Sprintf("%T", p)[1:]
}

// ResolveCore resolves domain d for core itself: core-only domains
// included, with no declaration or admission check. d must be declared
// exactly (ErrUnknownDomain otherwise). It returns a [*ResolveError]
// wrapping ErrAbsent if d has no owner, the owner is not loaded, or a
// requirement does not resolve for the owner.
func (r *Registry) ResolveCore(d Domain) (any, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	v, err := r.resolveLocked(nil, d, nil)
	if err != nil {
		return nil, err
	}
	return v, nil
}

// resolveLocked resolves d for cons (nil: core). path holds the domains
// being resolved above this one, to refuse requirement cycles. r.mu must
// be held (read).
func (r *Registry) resolveLocked(cons *record, d Domain, path []Domain) (any, *ResolveError) {
	name := CoreOwner
	if cons != nil {
		name = cons.m.Name
	}
	fail := func(sentinel error, format string, args ...any) *ResolveError {
		return &ResolveError{Consumer: name, Domain: d, Err: sentinel, Reason: fmt.Sprintf(format, args...)}
	}
	key := foldDomain(d)
	info, declared := r.domains[key]
	if cons != nil {
		if alwaysCoreOnly(key) || declared && info.opts.CoreOnly {
			return nil, fail(ErrCoreOnly, "plugins never resolve core-only domains")
		}
		if cons.state != StateLoaded {
			return nil, fail(ErrAbsent, "consumer %s is not loaded (%s)", name, orState(cons))
		}
		if !slices.Contains(cons.m.Consumes, d) {
			return nil, fail(ErrNotDeclared, "not in the manifest's Consumes")
		}
	}
	if !declared || info.id != d {
		// Unreachable for plugins: manifests consume only declared domains.
		return nil, fail(ErrUnknownDomain, "domain not declared")
	}
	absent := func(format string, args ...any) *ResolveError {
		e := fail(ErrAbsent, format, args...)
		e.absent = info.opts.Absent
		return e
	}
	ctl := info.owner
	if ctl == nil {
		return nil, absent("no owner")
	}
	if ctl.owner != nil && ctl.owner.state != StateLoaded {
		return nil, absent("owner %s is %s", ctl.owner.m.Name, orState(ctl.owner))
	}
	if cons != nil {
		if info.opts.Admit != nil && !safeAdmit(info.opts.Admit, name) {
			return nil, fail(ErrNotAdmitted, "refused by the domain's restriction")
		}
		for _, admit := range ctl.admit {
			if !safeAdmit(admit, name) {
				return nil, fail(ErrNotAdmitted, "refused by owner %s", ctl.ownerName())
			}
		}
	}
	if len(ctl.requires) > 0 {
		path = append(path, d)
		for _, q := range ctl.requires {
			if slices.Contains(path, q) {
				return nil, absent("requirement cycle through %q", q)
			}
			if _, err := r.resolveLocked(ctl.owner, q, path); err != nil {
				return nil, absent("requirement %q: %v: %s", q, err.Err, err.Reason)
			}
		}
	}
	return ctl.value, nil
}

func orState(rec *record) string {
	if rec.reason != "" {
		return rec.reason
	}
	if rec.state == "" {
		return "loading"
	}
	return string(rec.state)
}

func safeAdmit(admit func(string) bool, consumer string) (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	return admit(consumer)
}
