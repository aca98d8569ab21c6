package core

import (
	"fmt"

	"github.com/corral-sandbox/corral/egress"
)

// EgressOptions configure core's egress service. The zero value is the
// default: the operator floor closed (loopback, private, link-local,
// CGNAT, metadata ranges and the host's own addresses refused), the
// system resolver, egress.Options' default limits.
type EgressOptions struct {
	// AllowCIDRs open ranges of the floor (corral daemon
	// --egress-allow-cidr), for example 127.0.0.0/8 for tests.
	AllowCIDRs []string
	// Service tunes the proxies (limits, timeouts, resolver, an audit
	// hook called after each journal row is written). Its Floor is
	// replaced by the one AllowCIDRs makes.
	Service egress.Options
}

func (c *Core) buildEgress(o EgressOptions) (*egress.Manager, error) {
	floor, err := egress.NewFloor(o.AllowCIDRs, true)
	if err != nil {
		return nil, fmt.Errorf("core: %w", err)
	}
	so := o.Service
	so.Floor = floor
	if so.Logger == nil {
		so.Logger = c.log
	}
	mg, err := egress.NewManager(egress.ManagerOptions{Service: so, Store: c.store, Gateway: c.gateway, Logger: c.log})
	if err != nil {
		return nil, fmt.Errorf("core: %w", err)
	}
	return mg, nil
}

// Egress returns the egress service; nil for a core built without Migrate
// (the delegated runner, whose daemon runs it).
func (c *Core) Egress() *egress.Manager { return c.egress }
