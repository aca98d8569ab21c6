package core

import (
	"log/slog"
	"path/filepath"

	"github.com/corral-sandbox/corral/lease"
	"github.com/corral-sandbox/corral/machine"
	"github.com/corral-sandbox/corral/plugin"
	"github.com/corral-sandbox/corral/plugins/editor"
	"github.com/corral-sandbox/corral/plugins/lsp"
	"github.com/corral-sandbox/corral/plugins/sandbox"
	"github.com/corral-sandbox/corral/plugins/sites"
	"github.com/corral-sandbox/corral/provider"
	"github.com/corral-sandbox/corral/store"
)

// Deps is what core hands a plugin factory made with [Plugin]: a logger
// and configuration, nothing of core's internals. Such a plugin reaches
// other domains only through its registry context, and only those its
// manifest declares: a plugin with an empty manifest reaches no machine,
// no store and no lease, whatever transport core was given.
type Deps struct {
	Logger *slog.Logger
	// LSPServers maps language-server names to their command lines
	// (Options.LSPServers); nil means the lsp plugin's defaults.
	LSPServers map[string][]string
}

// internals are what built-in plugins are made of: the store, the lease
// manager and the machine gateway. They reach built-in factories only
// (see PluginFactory), never a factory made with Plugin.
type internals struct {
	Deps
	store    store.Store
	leases   *lease.Manager
	gateway  *machine.Gateway
	selfExe  string
	stateDir string          // Options.StateDir
	egress   provider.Egress // nil: no egress service
}

// PluginFactory makes one plugin's registration when core is built. Make
// one with [Plugin] (any plugin: its factory receives [Deps]); the
// built-in plugins are [SandboxPlugin], [SitesPlugin], [EditorPlugin] and
// [LSPPlugin] ([Builtins] lists them), whose factories alone receive
// core's internals. The zero PluginFactory is refused by Build.
type PluginFactory struct {
	public  func(Deps) plugin.Registration
	builtin func(internals) plugin.Registration
}

// Plugin returns the factory of a plugin that is not corral's own: f
// receives Deps only.
func Plugin(f func(Deps) plugin.Registration) PluginFactory {
	return PluginFactory{public: f}
}

// registration calls the factory with what it may receive.
func (f PluginFactory) registration(in internals) (plugin.Registration, bool) {
	switch {
	case f.builtin != nil:
		return f.builtin(in), true
	case f.public != nil:
		return f.public(in.Deps), true
	}
	return plugin.Registration{}, false
}

// Builtins returns corral's built-in plugins, in load order.
func Builtins() []PluginFactory {
	return []PluginFactory{SandboxPlugin, SitesPlugin, EditorPlugin, LSPPlugin}
}

// SandboxPlugin is the built-in provider of the "sandbox" domain: host
// projects and managed machines.
var SandboxPlugin = PluginFactory{builtin: func(d internals) plugin.Registration {
	return sandbox.Registration(func() (*provider.Provider, error) {
		var ids provider.HostIDs
		if d.stateDir != "" {
			ids.Owner = filepath.Join(d.stateDir, "host-ids")
		}
		return provider.New(provider.Options{
			HostIDs: ids,
			Store:   d.store,
			Leases:  d.leases,
			Gateway: d.gateway,
			SelfExe: d.selfExe,
			Logger:  d.Logger,
			Egress:  d.egress,
		})
	})
}}

// SitesPlugin is the built-in owner of the "sites" domain: which project
// port is published under which name.
var SitesPlugin = PluginFactory{builtin: func(d internals) plugin.Registration {
	return sites.Registration(sites.Options{Store: d.store, Logger: d.Logger})
}}

// EditorPlugin is the built-in provider of the "editor" domain (Git views
// of a project).
var EditorPlugin = PluginFactory{builtin: func(d internals) plugin.Registration {
	return editor.ForStore(d.store, d.Logger)
}}

// LSPPlugin is the built-in provider of the "lsp" domain (language servers
// in machines).
var LSPPlugin = PluginFactory{builtin: func(d internals) plugin.Registration {
	return lsp.Registration(lsp.Options{Servers: d.LSPServers, Logger: d.Logger})
}}
