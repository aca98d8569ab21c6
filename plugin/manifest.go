package plugin

import (
	"fmt"
	"slices"
)

// CoreOwner is the owner name of controls core provides itself
// ([Registry.ProvideCore]) and the consumer name of [Registry.ResolveCore].
// No plugin may take it.
const CoreOwner = "core"

// Manifest declares what a plugin is and may do. Everything is denied by
// default: a plugin provides only the domains listed in Provides, resolves
// only those listed in Consumes, and holds only the capabilities listed in
// Capabilities. The registry validates a manifest before running any of the
// plugin's code; an invalid one skips the plugin (State [StateFailed],
// reason wrapping [ErrInvalidManifest] or [ErrCoreOnly]).
type Manifest struct {
	// Name identifies the plugin in logs, status, configuration and owner
	// restrictions. Required: a lower-case ASCII letter or digit followed by
	// lower-case letters, digits, '.', '_' or '-', at most 64 bytes. "core"
	// is reserved. Names are unique within a registry.
	Name string
	// Version is informational (logs, status). It may be empty.
	Version string
	// Provides lists the domains the plugin's Register function provides.
	// Each must be declared by core, not core-only, and listed once.
	// Register must provide every one of them, or the plugin fails.
	Provides []Domain
	// Consumes lists the domains the plugin may resolve, and the only
	// domains its controls may require. Same rules as Provides; a domain
	// may not be both provided and consumed by one plugin.
	Consumes []Domain
	// Capabilities lists privileges the plugin asks for ("net-dial"). Each
	// must be one of [Options].Capabilities. The registry only records them;
	// whoever grants a privilege checks [Context.HasCapability] or
	// [Registry.HasCapability].
	Capabilities []string
}

// Registration is a plugin as handed to [Registry.Load]: its manifest and
// the function that registers its controls and services.
//
// Register must not have side effects beyond its Context: it provides
// controls and adds services there, and starts nothing. Everything it
// provides is staged and committed only if it returns nil; if it returns an
// error or panics, nothing it did is kept. Returning an error that wraps
// [ErrSkipPlugin] skips the plugin on this host without counting as a
// failure.
type Registration struct {
	Manifest
	Register func(*Context) error
}

func validPluginName(s string) bool {
	if len(s) == 0 || len(s) > 64 || s == CoreOwner {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9':
		case i > 0 && (c == '.' || c == '_' || c == '-'):
		default:
			return false
		}
	}
	return true
}

// checkDomainRef validates a domain a plugin names in its manifest or
// passes to a Context method: well formed, declared by core (exactly, not
// a variant), and not core-only. r.mu must be held.
func (r *Registry) checkDomainRef(d Domain) error {
	key := foldDomain(d)
	if alwaysCoreOnly(key) {
		return fmt.Errorf("%w: %q", ErrCoreOnly, d)
	}
	info, ok := r.domains[key]
	if ok && info.opts.CoreOnly {
		return fmt.Errorf("%w: %q", ErrCoreOnly, d)
	}
	if !validDomain(d) || !ok || info.id != d {
		if ok {
			return fmt.Errorf("%w: %q is a variant of %q", ErrUnknownDomain, d, info.id)
		}
		return fmt.Errorf("%w: %q", ErrUnknownDomain, d)
	}
	return nil
}

// validateManifest checks m against the declared domains and known
// capabilities. r.mu must be held.
func (r *Registry) validateManifest(reg *Registration) error {
	m := &reg.Manifest
	if !validPluginName(m.Name) {
		return fmt.Errorf("%w: bad plugin name %q", ErrInvalidManifest, m.Name)
	}
	if reg.Register == nil {
		return fmt.Errorf("%w: no Register function", ErrInvalidManifest)
	}
	for _, list := range []struct {
		field string
		ds    []Domain
	}{{"Provides", m.Provides}, {"Consumes", m.Consumes}} {
		for i, d := range list.ds {
			if err := r.checkDomainRef(d); err != nil {
				return fmt.Errorf("%w: %s: %w", ErrInvalidManifest, list.field, err)
			}
			if slices.Contains(list.ds[:i], d) {
				return fmt.Errorf("%w: %s lists %q twice", ErrInvalidManifest, list.field, d)
			}
		}
	}
	for _, d := range m.Provides {
		if slices.Contains(m.Consumes, d) {
			return fmt.Errorf("%w: %q is both provided and consumed", ErrInvalidManifest, d)
		}
	}
	for i, c := range m.Capabilities {
		if !r.capabilities[c] {
			return fmt.Errorf("%w: unknown capability %q", ErrInvalidManifest, c)
		}
		if slices.Contains(m.Capabilities[:i], c) {
			return fmt.Errorf("%w: capability %q listed twice", ErrInvalidManifest, c)
		}
	}
	return nil
}
