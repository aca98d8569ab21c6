package provider

import (
	"context"

	"github.com/corral-sandbox/corral/machine"
)

// Egress is what the provider asks of corral's egress service
// (*egress.Manager implements it): before a managed session starts, it arms
// a proxy-mode project's machine and returns the proxy environment
// (HTTP_PROXY, ...) the session gets on top of its own; a mode-none
// project's sessions get nothing added. The environment is added only for
// proxy-mode projects, so a program there that ignores it fails closed:
// the machine has its loopback only.
type Egress interface {
	// Session is called before a managed session of p starts, under the
	// session's lease (its ID, which also covers whatever the service
	// runs in the machine to start it); the returned environment is added
	// to the session's; release is called once the session ended or
	// failed to start. An error refuses the session (it would find no
	// proxy).
	Session(ctx context.Context, p machine.Project, account int64, lease string) (env map[string]string, release func(), err error)
}

// PolicyEgress is an Egress that can start a session under the project's
// stored policy as the preparation read it, with the tenancy
// (store.Tenancy.EgressPolicy: JSON, "" for mode none), instead of reading
// it again (*egress.Manager implements it). The provider uses it only when
// the command's lease was inserted under the version of that read, which a
// policy change bumps (store schema 17): a policy changed by any process
// before the lease applies to the command.
type PolicyEgress interface {
	Egress
	// SessionPolicy is Session under stored, the policy as read at the
	// project's tenancy version version (store.Tenancy.Version).
	SessionPolicy(ctx context.Context, p machine.Project, account int64, lease, stored string, version int64) (env map[string]string, release func(), err error)
}
