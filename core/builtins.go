package core

import (
	"log/slog"

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

// Deps is what core hands a plugin factory: the services built-in plugins
// are made of. A plugin reaches other domains only through its registry
// consumer, never through Deps.
type Deps struct {
	Store   *store.Store
	Leases  *lease.Manager
	Gateway *machine.Gateway
	Logger  *slog.Logger
	SelfExe string
	// LSPServers maps language-server names to their command lines
	// (Options.LSPServers); nil means the lsp plugin's defaults.
	LSPServers map[string][]string
}

// PluginFactory makes a plugin's registration from core's services.
type PluginFactory func(Deps) plugin.Registration

// Builtins returns corral's built-in plugins, in load order.
func Builtins() []PluginFactory {
	return []PluginFactory{
		SandboxPlugin,
		SitesPlugin,
		func(d Deps) plugin.Registration { return editorplugin.ForStore(d.Store, d.Logger) },
		func(d Deps) plugin.Registration {
			return lspplugin.Registration(lspplugin.Options{Servers: d.LSPServers, Logger: d.Logger})
		},
	}
}

// SandboxPlugin is the built-in provider of the "sandbox" domain: host
// projects and managed machines.
func SandboxPlugin(d Deps) plugin.Registration {
	return sandboxplugin.Registration(func() (*provider.Provider, error) {
		return provider.New(provider.Options{
			Store:   d.Store,
			Leases:  d.Leases,
			Gateway: d.Gateway,
			SelfExe: d.SelfExe,
			Logger:  d.Logger,
		})
	})
}

// SitesPlugin is the built-in owner of the "sites" domain: which project
// port is published under which name (kept in memory).
func SitesPlugin(d Deps) plugin.Registration {
	return sitesplugin.Registration(sitesplugin.Options{Store: d.Store, Logger: d.Logger})
}
