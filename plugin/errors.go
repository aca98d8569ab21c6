package plugin

import (
	"errors"
	"fmt"

	"github.com/corral-sandbox/corral/internal/errdefs"
)

// Sentinel errors. Errors returned by this package wrap one of them (with
// %w or through [*ResolveError]); check them with errors.Is.
var (
	// ErrAbsent reports that a domain has no usable control: no owner, the
	// owner is disabled, skipped or failed, or one of the control's
	// requirements is itself absent. Callers report "unavailable".
	ErrAbsent = errdefs.New(errdefs.Unavailable, "plugin: control absent")
	// ErrNotDeclared reports that a consumer resolved a domain its manifest
	// does not declare in Consumes.
	ErrNotDeclared = errors.New("plugin: domain not declared by consumer")
	// ErrNotAdmitted reports that the domain's owner (or core's domain
	// restriction) does not admit the consumer.
	ErrNotAdmitted = errors.New("plugin: consumer not admitted")
	// ErrCoreOnly reports an attempt by a plugin to provide, consume or
	// resolve a core-only domain, under any spelling.
	ErrCoreOnly = errors.New("plugin: domain is core-only")

	// ErrSkipPlugin is returned (possibly wrapped) by a Register function
	// that decides the plugin does not apply on this host. Loading records
	// the plugin as skipped with the error as the reason; it is not a
	// failure.
	ErrSkipPlugin = errors.New("plugin: skip plugin")

	// ErrInvalidManifest reports a manifest that cannot be loaded.
	ErrInvalidManifest = errors.New("plugin: invalid manifest")
	// ErrDuplicatePlugin reports a second plugin with a name already taken.
	ErrDuplicatePlugin = errors.New("plugin: duplicate plugin name")
	// ErrUnknownDomain reports a domain that core never declared, or a
	// variant (case, spacing, separators) of one it did.
	ErrUnknownDomain = errors.New("plugin: unknown domain")
	// ErrDomainOwned reports a second provider for a domain; the first owner
	// keeps it.
	ErrDomainOwned = errors.New("plugin: domain already owned")
	// ErrNotImplemented reports a control that does not implement its
	// domain's whole interface (or is nil).
	ErrNotImplemented = errors.New("plugin: control does not implement domain interface")
	// ErrRegisterPanic reports a Register function that panicked.
	ErrRegisterPanic = errors.New("plugin: registration panicked")
	// ErrDisabled reports a plugin disabled by configuration or by
	// [Registry.Disable].
	ErrDisabled = errors.New("plugin: disabled")
	// ErrUnknownPlugin reports a plugin name the registry does not hold.
	ErrUnknownPlugin = errors.New("plugin: unknown plugin")
	// ErrContextClosed reports a [Context] used after its Register function
	// returned.
	ErrContextClosed = errors.New("plugin: registration context closed")

	// ErrServicesStopped reports a [ServiceManager] used after Stop.
	ErrServicesStopped = errors.New("plugin: service manager stopped")
	// ErrNoServiceManager reports Start on a nil *ServiceManager (a runner
	// process has none).
	ErrNoServiceManager = errors.New("plugin: no service manager in this process")
	// ErrServicePanic reports a service method that panicked.
	ErrServicePanic = errors.New("plugin: service panicked")
)

// ResolveError is the error of a refused resolution. It unwraps to Err (one
// of ErrAbsent, ErrNotDeclared, ErrNotAdmitted, ErrCoreOnly, or
// ErrUnknownDomain for core resolving an undeclared domain) and, when the
// domain is absent and core declared a domain-specific error for absence
// ([DomainOptions].Absent, e.g. sandbox.ErrUnavailable), to that error too.
type ResolveError struct {
	// Consumer is the resolving plugin's name, or [CoreOwner].
	Consumer string
	// Domain is the domain as the consumer spelled it.
	Domain Domain
	// Err is the sentinel saying why.
	Err error
	// Reason is a human-readable detail ("owner sites is disabled",
	// "requirement sandbox: no owner").
	Reason string

	absent error
}

func (e *ResolveError) Error() string {
	msg := fmt.Sprintf("%v: %s resolving %q", e.Err, e.Consumer, e.Domain)
	if e.Reason != "" {
		msg += ": " + e.Reason
	}
	return msg
}

// Unwrap returns Err and, if set, the domain's absence error.
func (e *ResolveError) Unwrap() []error {
	if e.absent != nil {
		return []error{e.Err, e.absent}
	}
	return []error{e.Err}
}
