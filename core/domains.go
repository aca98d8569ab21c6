package core

import (
	"fmt"

	"github.com/corral-sandbox/corral/plugin"
	"github.com/corral-sandbox/corral/plugins/editor"
	"github.com/corral-sandbox/corral/plugins/lsp"
	"github.com/corral-sandbox/corral/plugins/sites"
	"github.com/corral-sandbox/corral/sandbox"
)

// registerDomains declares every known domain with the interface its
// controls must implement.
func (c *Core) registerDomains() error {
	decl := []struct {
		d     plugin.Domain
		check func(any) error
		opts  plugin.DomainOptions
	}{
		{plugin.DomainSandbox, plugin.Implements[sandbox.Provider](), plugin.DomainOptions{Absent: sandbox.ErrUnavailable}},
		{plugin.DomainSandboxArtifacts, plugin.Implements[ArtifactReader](), plugin.DomainOptions{CoreOnly: true}},
		{plugin.DomainEditor, plugin.Implements[editor.Domain](), plugin.DomainOptions{}},
		{plugin.DomainLSP, plugin.Implements[lsp.Domain](), plugin.DomainOptions{}},
		{plugin.DomainSites, plugin.Implements[sites.Control](), plugin.DomainOptions{Absent: sites.ErrUnavailable}},
	}
	for _, x := range decl {
		if err := c.registry.RegisterDomain(x.d, x.check, x.opts); err != nil {
			return fmt.Errorf("core: declare domain %s: %w", x.d, err)
		}
	}
	return nil
}

// stamp turns what a plugin provides into what resolvers receive. A
// sandbox provider becomes core's Control — its preparation plus core's
// RunCommand — stamped with the owner's domain, so a provider cannot
// substitute its own runner and every call is attributed.
func (c *Core) stamp(d plugin.Domain, owner string, ctl any) any {
	switch d {
	case plugin.DomainSandbox:
		p, ok := ctl.(sandbox.Provider)
		if !ok {
			return nil
		}
		return sandbox.NewControl(p, c.controlOpts).WithDomain(string(d))
	}
	return ctl
}
