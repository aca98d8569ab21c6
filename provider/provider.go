// Package provider is corral's sandbox provider: it implements
// sandbox.Provider on the corral store and its leases.
//
// Preparation checks tenancy first (the project exists, the actor is one of
// its members, the project has the requested kind), then the branch's own
// rules, and mints the lease last, once every check passed: a refused
// preparation leaves nothing behind. The tenancy is read from the store's
// cache (store.CachedTenancy) and takes effect only through the lease
// insert, which refuses a lease if the project, one of its memberships or
// its egress policy changed since that read (store.ErrTenancyChanged; the
// preparation then reads again): a membership revoked, a trust withdrawn
// or an egress policy tightened, by any process, applies to the next
// command, whose managed session starts under the policy of that read
// (PolicyEgress). Other projects' changes cost it nothing. The provider never runs anything; core's
// sandbox.Control does.
//
// Host projects (see prepareHost) are prepared as a *sandbox.LocalPrepared,
// confined (package confine) unless the actor is a trusted member of the
// project: when corral is root, as the project's own unprivileged user with
// no capabilities in a pid namespace of its own; always with Landlock.
package provider

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/corral-sandbox/corral/confine"
	"github.com/corral-sandbox/corral/lease"
	"github.com/corral-sandbox/corral/machine"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/store"
)

// DefaultDomain is stamped on leases when Options.Domain is empty.
const DefaultDomain = "sandbox"

// DisplayRoot is what a host project's root is shown as: in output, in
// DisplayCwd, and (for managed projects) inside the machine.
const DisplayRoot = sandbox.GuestWorkspace

// DefaultPath is the PATH of every command's environment unless
// Options.Env sets another.
const DefaultPath = "/usr/local/bin:/usr/bin:/bin"

// PrepareTimeout bounds one preparation (store lookups and the lease
// acquisition, which may wait for another process's write lock).
const PrepareTimeout = 30 * time.Second

// Options configure a Provider.
type Options struct {
	// Store holds projects and members. Required.
	Store store.Store
	// Leases mints the leases that cover executions. Required.
	Leases *lease.Manager
	// Domain is stamped on every lease this provider mints (the registry
	// domain it serves). Empty means DefaultDomain ("sandbox").
	Domain string
	// SelfExe is corral's own executable, launched as the confinement
	// helper (see confine.Command); its main must call confine.MaybeRun
	// first. Empty means os.Executable().
	SelfExe string
	// Gateway reaches managed machines through the privileged worker. Nil,
	// or a gateway without a transport, makes every managed preparation
	// fail with machine.ErrNoPrivilegedTransport; host projects still work.
	Gateway *machine.Gateway
	// Logger receives diagnostics. Nil means slog.Default().
	Logger *slog.Logger
	// Env is added to every command's environment, after the minimal
	// defaults (PATH, HOME, LANG, TERM), which an entry with the same name
	// replaces. Nil adds nothing. The daemon's own environment is never
	// passed on.
	Env []string
	// Egress, if set, is told of every managed session before it starts
	// (core's egress service): see Egress.
	Egress Egress
	// HostIDs configures the unprivileged users confined host commands run
	// as when this process is root (see prepareHost); the zero value
	// claims the block in idrange.DefaultRegistry for "host-ids" beside the
	// store's database. Ignored when not root.
	HostIDs HostIDs
}

// Provider prepares executions for corral's projects. It is safe for
// concurrent use.
type Provider struct {
	store   store.Store
	leases  *lease.Manager
	gateway *machine.Gateway
	domain  string
	self    string
	log     *slog.Logger
	env     []string
	egress  Egress

	// available reports whether confinement works on this kernel
	// (confine.Available; replaced in tests).
	available func() (int, error)
	// users gives confined host commands users of their own; nil when
	// this process is not root.
	users *hostUsers
}

var _ sandbox.Provider = (*Provider)(nil)

// New returns a provider over opts.Store and opts.Leases. It fails if either
// is missing or corral's executable cannot be determined. A kernel without
// Landlock is not an error here: it is logged, and each confined
// preparation is then refused.
func New(opts Options) (*Provider, error) {
	if opts.Store == nil || opts.Leases == nil {
		return nil, errors.New("provider: a store and a lease manager are required")
	}
	p := &Provider{
		store:     opts.Store,
		leases:    opts.Leases,
		gateway:   opts.Gateway,
		domain:    opts.Domain,
		self:      opts.SelfExe,
		log:       opts.Logger,
		env:       append([]string(nil), opts.Env...),
		egress:    opts.Egress,
		available: confine.Available,
	}
	if p.domain == "" {
		p.domain = DefaultDomain
	}
	if canSwitchUsers() {
		p.users = newHostUsers(opts.HostIDs, opts.Store.Path())
	} else if os.Geteuid() == 0 {
		p.log.Warn("root without the capabilities to give host commands users and namespaces of their own: they keep corral's user, under Landlock only")
	}
	if p.log == nil {
		p.log = slog.Default()
	}
	if p.self == "" {
		self, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("provider: locate corral's executable for the confinement helper: %w", err)
		}
		p.self = self
	}
	for _, kv := range p.env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return nil, fmt.Errorf("provider: environment entry %q is not NAME=VALUE", kv)
		}
	}
	if abi, err := p.available(); err != nil {
		p.log.Warn("host commands of untrusted members will be refused: no confinement", "err", err)
	} else {
		p.log.Debug("landlock available", "abi", abi)
	}
	return p, nil
}

// PrepareExecution implements sandbox.Provider.
//
// It fails with an error wrapping sandbox.ErrNotFound if the project does
// not exist, sandbox.ErrDenied if the actor is not a member of it, and a
// plain error if the project's kind is not in.Project.Kind or the branch
// refuses (see prepareHost). On failure no lease was minted.
//
// Preparation is short and is not cut short by ctx's cancellation (only its
// values are used), so that RunCommand's abort check, which follows it,
// reports a cancelled call as an abort and releases the lease; it is bounded
// by PrepareTimeout instead.
func (p *Provider) PrepareExecution(ctx context.Context, in sandbox.ExecInput, actor sandbox.Actor) (sandbox.Prepared, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), PrepareTimeout)
	defer cancel()
	for attempt := 1; ; attempt++ {
		prep, err := p.prepare(ctx, in, actor, attempt < tenancyAttempts)
		if errors.Is(err, store.ErrTenancyChanged) {
			continue // read again: the store dropped the cached entry
		}
		return prep, err
	}
}

// tenancyAttempts bounds the preparations of one PrepareExecution whose
// lease was refused because the tenancy changed after it was read; the last
// one reads it afresh and does not check the version at the insert (as a
// read followed by an insert did before schema 11).
const tenancyAttempts = 3

// prepare is one attempt of PrepareExecution. With checked, the tenancy
// comes from the store's cache and the lease is minted only if it has not
// changed since (else the error wraps store.ErrTenancyChanged).
func (p *Provider) prepare(ctx context.Context, in sandbox.ExecInput, actor sandbox.Actor, checked bool) (sandbox.Prepared, error) {
	ten, err := p.tenancy(ctx, in, actor, checked)
	if err != nil {
		return nil, err
	}
	proj, member := ten.Project, ten.Member
	if checked {
		ctx = context.WithValue(ctx, tenancyKey{}, ten.Version)
	}
	switch proj.Kind {
	case store.ProjectHost:
		if in.User != "" {
			return nil, fmt.Errorf("provider: project %d is a host project, whose commands run as the caller: a user (%q) can only be named in a managed project", proj.ID, in.User)
		}
		return p.prepareHost(ctx, in, actor, proj, member)
	case store.ProjectManaged:
		var read *store.Tenancy // its egress policy, when the lease insert confirms the read
		if checked {
			read = &ten
		}
		return p.prepareManaged(ctx, in, actor, proj, read)
	default:
		return nil, fmt.Errorf("provider: project %d: %s projects are not supported yet: %w", proj.ID, proj.Kind, errors.ErrUnsupported)
	}
}

// tenancyKey is the context key of the tenancy version mintLease checks.
type tenancyKey struct{}

// tenancy looks the project up and checks the actor's membership, before
// anything else is touched. A non-member learns nothing about the project
// beyond its existence. With cached, it may answer from the store's cache
// (store.CachedTenancy), whose answer takes effect only if the lease
// insert confirms its version (mintLease).
func (p *Provider) tenancy(ctx context.Context, in sandbox.ExecInput, actor sandbox.Actor, cached bool) (store.Tenancy, error) {
	id := in.Project.ProjectID
	var (
		ten store.Tenancy
		err error
	)
	if cached {
		ten, err = p.store.CachedTenancy(ctx, id, actor.AccountUserID)
	} else {
		ten.Project, ten.Member, err = p.store.GetProjectMember(ctx, id, actor.AccountUserID)
	}
	switch {
	case errors.Is(err, store.ErrNotMember):
		return store.Tenancy{}, fmt.Errorf("provider: account %d is not a member of project %d: %w", actor.AccountUserID, id, sandbox.ErrDenied)
	case errors.Is(err, store.ErrNotFound):
		return store.Tenancy{}, fmt.Errorf("provider: project %d: %w", id, sandbox.ErrNotFound)
	case err != nil:
		return store.Tenancy{}, fmt.Errorf("provider: look up project %d and its membership: %w", id, err)
	}
	if string(ten.Project.Kind) != string(in.Project.Kind) {
		return store.Tenancy{}, fmt.Errorf("provider: project %d is a %s project, not %s", id, ten.Project.Kind, in.Project.Kind)
	}
	return ten, nil
}

// mintLease acquires the lease covering one execution. It is the last step
// of every branch's preparation, and where a cached tenancy takes effect:
// the lease is inserted only if the tenancy version ctx carries (prepare)
// is still the store's, else the error wraps store.ErrTenancyChanged.
func (p *Provider) mintLease(ctx context.Context, in sandbox.ExecInput, actor sandbox.Actor) (*lease.Lease, error) {
	version, _ := ctx.Value(tenancyKey{}).(int64)
	// Core's journal entry of the command, if it asked for one, is
	// written with the lease.
	journal, _ := sandbox.JournalIntent(ctx).(*lease.JournalStart)
	if journal != nil && journal.ID != 0 {
		journal = nil // written already: one entry covers one lease
	}
	l, err := p.leases.Acquire(ctx, lease.AcquireRequest{
		Account:        actor.AccountUserID,
		Project:        in.Project.ProjectID,
		Kind:           in.LeaseKind,
		Domain:         p.domain,
		TenancyVersion: version,
		Journal:        journal,
	})
	if err != nil {
		return nil, fmt.Errorf("provider: %w", err)
	}
	return l, nil
}
