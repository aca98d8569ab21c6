// Package core is corral's composition root: Build opens the store, starts
// the lease reconciler, builds the machine gateway from the privileged
// transport it is given, loads the plugins and composes the sandbox control.
package core

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/corral-sandbox/corral/egress"
	"github.com/corral-sandbox/corral/lease"
	"github.com/corral-sandbox/corral/machine"
	"github.com/corral-sandbox/corral/plugin"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/store"
)

// HeartbeatInterval is the lease heartbeat period of leases that live ttl
// without one: three beats per TTL (a lease outlives two missed beats), at
// most sandbox.DefaultHeartbeatInterval (the default TTL, 15 s, gives it:
// 5 s). The one place the rule is written: the daemon and the runner pass
// their TTL to Build and a zero interval.
func HeartbeatInterval(ttl time.Duration) time.Duration {
	return min(sandbox.DefaultHeartbeatInterval, ttl/3)
}

// Options configure Build.
type Options struct {
	// Store is the database. If nil, Build opens StorePath (and closes it
	// on Close).
	Store store.Store
	// StorePath is the store opened when Store is nil: a store URL
	// (store.Open's forms: an SQLite file's path, sqlite:PATH,
	// postgres://...).
	StorePath string
	// Migrate lets Build create and migrate the database. A process that
	// must not migrate (the delegated runner) sets false: Build then refuses
	// a schema this binary does not know exactly, starts no plugin services
	// and no egress service, and loads no plugin providing the "sites"
	// domain (the published Sites control is the daemon's).
	Migrate bool
	// PrivilegedTransport reaches the privileged worker. If nil, every
	// machine-runtime call fails at once with
	// machine.ErrNoPrivilegedTransport; host projects still work. Core never
	// discovers a worker on its own.
	PrivilegedTransport machine.PrivilegedTransport
	// SelfExe is corral's executable, for the confinement helper. Empty
	// means os.Executable().
	SelfExe string
	// StateDir is the process's state directory, where host projects'
	// block of host ids is owned (StateDir/host-ids). Empty means the
	// directory of the SQLite store's file; a store that is no file
	// (PostgreSQL) then refuses host projects' confined commands.
	StateDir string
	// Control tunes the sandbox control (heartbeat interval, drain). A
	// zero HeartbeatInterval follows the lease TTL (see HeartbeatInterval).
	Control sandbox.ControlOptions
	// Lease tunes the lease manager (TTL, sweep interval).
	Lease lease.Options
	// Logger receives diagnostics; nil means slog.Default().
	Logger *slog.Logger
	// Plugins are the plugins to load, in order. Nil means Builtins().
	// Only the built-in factories receive core's store, lease manager and
	// machine gateway; one made with Plugin receives Deps (a logger and
	// configuration) and reaches the rest only through the registry, as
	// its manifest declares.
	Plugins []PluginFactory
	// PluginConfig enables and disables plugins by name.
	PluginConfig plugin.Config
	// LSPServers configures the language servers the lsp plugin may start,
	// by name (a command line each, run inside the project's machine). Nil
	// means the plugin's defaults (gopls).
	LSPServers map[string][]string
	// Egress configures the egress service (see package egress), which a
	// core built with Migrate runs: it arms proxy-mode projects' machines
	// and journals their connections.
	Egress EgressOptions
}

// Core is a built corral core. Close it when done.
type Core struct {
	store       store.Store
	ownStore    bool
	leases      *lease.Manager
	gateway     *machine.Gateway
	registry    *plugin.Registry
	services    *plugin.ServiceManager
	controlOpts sandbox.ControlOptions
	migrated    bool
	log         *slog.Logger
	egress      *egress.Manager
	cancel      context.CancelFunc
	wg          sync.WaitGroup
	closeOnce   sync.Once
}

// Build composes a core. On error everything it opened is closed again.
// journalFinishGrace is how long after its lease's release a command's
// journal entry may stay open before the reconciler closes it as
// interrupted: RunCommand's caller records the outcome right after the
// release, in microseconds.
const journalFinishGrace = 3 * time.Second

func Build(ctx context.Context, opts Options) (c *Core, err error) {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	c = &Core{store: opts.Store, log: log}
	defer func() {
		if err != nil {
			c.Close()
			c = nil
		}
	}()
	if c.store == nil {
		if opts.StorePath == "" {
			return c, errors.New("core: no store and no store path")
		}
		scheme, target, err := store.SplitURL(opts.StorePath)
		if err != nil {
			return c, fmt.Errorf("core: %w", err)
		}
		if opts.Migrate && scheme == store.SchemeSQLite {
			if err := os.MkdirAll(filepath.Dir(target), 0o700); err != nil {
				return c, fmt.Errorf("core: %w", err)
			}
		}
		c.store, err = store.Open(ctx, opts.StorePath, store.Options{Migrate: opts.Migrate})
		if err != nil {
			return c, fmt.Errorf("core: %w", err)
		}
		c.ownStore = true
	} else if !opts.Migrate {
		// A store handed in must still be one this binary knows.
		have, err := c.store.SchemaVersion(ctx)
		if err != nil {
			return c, fmt.Errorf("core: %w", err)
		}
		if have != store.LatestVersion() {
			return c, fmt.Errorf("core: %w", &store.SchemaError{Path: c.store.Path(), Have: have, Want: store.LatestVersion()})
		}
	}

	lopts := opts.Lease
	if lopts.Logger == nil {
		lopts.Logger = log
	}
	if lopts.OnExpired == nil {
		lopts.OnExpired = func(l store.Lease) {
			c.interrupt([]string{l.ID}, "interrupted: lease expired")
		}
	}
	if lopts.OnSweep == nil {
		// A process killed between a command's release and its journal
		// finish leaves an entry no expiry closes; give the live ones
		// between the two writes a few seconds.
		lopts.OnSweep = func(ctx context.Context, now time.Time) {
			if n, err := c.store.JournalInterruptReleased(ctx, now.Add(-journalFinishGrace), "interrupted: its process ended before recording the outcome"); err != nil {
				log.Warn("journal: cannot close the entries of released leases", "err", err)
			} else if n > 0 {
				log.Info("journal: entries of released leases closed as interrupted", "entries", n)
			}
		}
	}
	c.leases = lease.NewManager(c.store, lopts)
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	c.cancel = cancel
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		if err := c.leases.Run(rctx); err != nil && rctx.Err() == nil {
			log.Error("lease reconciler stopped", "err", err)
		}
	}()

	c.gateway = machine.New(opts.PrivilegedTransport, machine.Options{
		Logger:        log,
		OnInterrupted: c.onInterrupted,
	})

	copts := opts.Control
	if copts.HeartbeatInterval == 0 {
		copts.HeartbeatInterval = HeartbeatInterval(c.leases.TTL())
	}
	if copts.Logger == nil {
		copts.Logger = log
	}
	copts.Journal = journal(c.store, func(msg string, args ...any) { log.Warn(msg, args...) })
	c.controlOpts = copts
	c.migrated = opts.Migrate

	c.registry = plugin.New(plugin.Options{Logger: log, Stamp: c.stamp})
	if err := c.registerDomains(); err != nil {
		return c, err
	}
	artifacts := &Artifacts{resolve: c.Sandbox}
	if err := c.registry.ProvideCore(plugin.DomainSandboxArtifacts, artifacts, plugin.Requires(plugin.DomainSandbox)); err != nil {
		return c, fmt.Errorf("core: %w", err)
	}
	factories := opts.Plugins
	if factories == nil {
		factories = Builtins()
	}
	in := internals{
		Deps:  Deps{Logger: log, LSPServers: opts.LSPServers},
		store: c.store, leases: c.leases, gateway: c.gateway, selfExe: opts.SelfExe, stateDir: opts.StateDir,
	}
	if opts.Migrate {
		if c.egress, err = c.buildEgress(opts.Egress); err != nil {
			return c, err
		}
		in.egress = c.egress
	}
	regs := make([]plugin.Registration, 0, len(factories))
	for i, f := range factories {
		reg, ok := f.registration(in)
		if !ok {
			return c, fmt.Errorf("core: plugin %d: a zero PluginFactory (make one with core.Plugin)", i)
		}
		if !opts.Migrate && slices.Contains(reg.Provides, plugin.DomainSites) {
			// The published Sites control belongs to the daemon's core:
			// a core that must not migrate (the delegated runner) has
			// none, whatever its plugin list.
			log.Debug("sites plugin not loaded: this core does not migrate", "plugin", reg.Name)
			continue
		}
		regs = append(regs, reg)
	}
	c.registry.Load(ctx, regs, opts.PluginConfig)

	// A process that must not migrate (the delegated runner) runs no plugin
	// services.
	if opts.Migrate {
		c.services = plugin.NewServiceManager(plugin.ServiceOptions{Logger: log})
		if err := c.services.Start(ctx, c.registry.Services()); err != nil {
			return c, fmt.Errorf("core: start plugin services: %w", err)
		}
	}
	return c, nil
}

// onInterrupted records that the worker connection was lost while sessions
// ran: the journal marks their commands interrupted before any of them
// settles.
//
// Sessions are named after the leases that cover them (see the provider).
func (c *Core) onInterrupted(sessionIDs []string) {
	c.log.Warn("worker connection lost", "sessions", len(sessionIDs))
	c.interrupt(sessionIDs, "interrupted: connection to the worker lost")
}

// interrupt marks the journal entries of leases interrupted.
func (c *Core) interrupt(leaseIDs []string, message string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, id := range leaseIDs {
		if _, err := c.store.JournalInterrupt(ctx, id, message); err != nil {
			c.log.Error("journal: record interruption", "lease", id, "err", err)
		}
	}
}

// Store returns the core's database.
func (c *Core) Store() store.Store { return c.store }

// Leases returns the lease manager.
func (c *Core) Leases() *lease.Manager { return c.leases }

// Gateway returns the machine gateway (never nil; without a transport every
// call fails with machine.ErrNoPrivilegedTransport).
func (c *Core) Gateway() *machine.Gateway { return c.gateway }

// Sandbox resolves the sandbox control for core's own use, at call time.
// When no provider is loaded (absent, disabled, failed) the error wraps
// sandbox.ErrUnavailable: callers report "unavailable", never crash.
func (c *Core) Sandbox() (*sandbox.Control, error) {
	ctl, err := plugin.ResolveCoreAs[*sandbox.Control](c.registry, plugin.DomainSandbox)
	if err != nil {
		if !errors.Is(err, sandbox.ErrUnavailable) {
			err = fmt.Errorf("%w: %w", sandbox.ErrUnavailable, err)
		}
		return nil, err
	}
	return ctl, nil
}

// Registry returns the plugin registry.
func (c *Core) Registry() *plugin.Registry { return c.registry }

// Services returns the plugin-service manager; nil for a core built with
// Migrate false (the delegated runner).
func (c *Core) Services() *plugin.ServiceManager { return c.services }

// Migrated reports whether this core was built with Migrate.
func (c *Core) Migrated() bool { return c.migrated }

// Close stops the reconciler and the gateway and closes a store Build
// opened. It blocks until they stopped and may be called more than once.
func (c *Core) Close() error {
	var err error
	c.closeOnce.Do(func() {
		if c.services != nil {
			sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err = errors.Join(err, c.services.Stop(sctx))
			cancel()
		}
		if c.cancel != nil {
			c.cancel()
		}
		c.wg.Wait()
		if c.egress != nil {
			err = errors.Join(err, c.egress.Close())
		}
		if c.gateway != nil {
			err = errors.Join(err, c.gateway.Close())
		}
		if c.ownStore && c.store != nil {
			err = errors.Join(err, c.store.Close())
		}
	})
	return err
}
