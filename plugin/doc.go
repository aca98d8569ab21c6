// Package plugin is corral's plugin registry: manifests, domain-keyed
// controls with one owner each, consumer restrictions, core-only controls,
// and the manager of plugins' long-running services.
//
// It follows containerd's plugin module and Caddy's module life cycle. A
// [Registry] is a plain value with no global state. Core declares the
// domains it knows ([Registry.RegisterDomain]) with the interface their
// controls must implement, then loads [Registration]s: each has a
// [Manifest] (name, version, provided and consumed domains, capabilities)
// and a Register function that provides controls and adds services through
// a [Context].
//
// # Rules
//
//   - Deny by default. A plugin provides only the domains its manifest
//     lists in Provides, resolves only those it lists in Consumes, and only
//     if core's domain restriction and the owner's restriction admit it.
//   - One owner per domain: the first plugin to provide it. A later plugin
//     that names an owned domain is refused as a whole, with a logged
//     reason; the owner keeps working.
//   - A control must implement its domain's whole interface, checked when
//     it is provided ([Implements]).
//   - A control may require other domains ([Requires]); whenever one of
//     them does not resolve, the control resolves as absent ([ErrAbsent]),
//     exactly like a control whose plugin is disabled.
//   - Resolution happens at call time, every time, through a [Consumer]:
//     nothing is cached, so disabling a plugin takes effect at the next
//     resolution, for its controls and for everything requiring them.
//   - Every control is stamped with its domain and owner when provided
//     ([Options].Stamp), so calls through it are attributed to the owner's
//     domain; a plugin's Context provides only its own manifest's domains,
//     so it can never act as another.
//   - Core-only domains ([DomainSandboxArtifacts]) are provided only by
//     [Registry.ProvideCore] and resolved only by [Registry.ResolveCore];
//     no plugin may name them, or any case or separator variant of them, in
//     a manifest or a resolution.
//   - Loading is fail-open and atomic per plugin: an invalid manifest, an
//     error or a panic in Register, or a refused provide skips that plugin
//     with a logged reason and a recorded [PluginStatus]; what it provided
//     was staged and is discarded, so nothing of it resolves and none of its
//     services run. [ErrSkipPlugin] skips a plugin without counting as a
//     failure.
//
// # Services
//
// A plugin's [Service]s are run by a [ServiceManager]: provision, validate,
// run in a goroutine with bounded restarts and backoff, stop on
// [ServiceManager.Stop], and clean up — also after a failed provision. A
// delegated runner process has no service manager; a nil *ServiceManager is
// safe to stop and query.
//
// # Typical use by core
//
//	r := plugin.New(plugin.Options{Logger: log, Stamp: stamp})
//	r.RegisterDomain(plugin.DomainSandbox, plugin.Implements[sandboxDomain](),
//		plugin.DomainOptions{Absent: sandbox.ErrUnavailable})
//	r.RegisterDomain(plugin.DomainSandboxArtifacts, plugin.Implements[artifacts](),
//		plugin.DomainOptions{CoreOnly: true})
//	r.Load(ctx, builtins, cfg)
//	r.ProvideCore(plugin.DomainSandboxArtifacts, arts, plugin.Requires(plugin.DomainSandbox))
//	services := plugin.NewServiceManager(plugin.ServiceOptions{Logger: log})
//	services.Start(ctx, r.Services())
package plugin
