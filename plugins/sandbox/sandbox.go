// Package sandbox is the built-in plugin that owns the "sandbox"
// domain: it provides corral's sandbox.Provider (package provider). Core
// turns what it provides into a *sandbox.Control — the provider's
// preparation plus core's own RunCommand — so a provider can never
// substitute a runner of its own.
package sandbox

import (
	"github.com/corral-sandbox/corral/plugin"
	"github.com/corral-sandbox/corral/provider"
)

// Name is the plugin's name.
const Name = "sandbox"

// Registration returns the plugin's registration. newProvider builds the
// provider when the plugin registers (core passes its store, leases and
// machine gateway).
func Registration(newProvider func() (*provider.Provider, error)) plugin.Registration {
	return plugin.Registration{
		Manifest: plugin.Manifest{
			Name:     Name,
			Version:  "1",
			Provides: []plugin.Domain{plugin.DomainSandbox},
		},
		Register: func(ctx *plugin.Context) error {
			p, err := newProvider()
			if err != nil {
				return err
			}
			return ctx.Provide(plugin.DomainSandbox, p)
		},
	}
}
