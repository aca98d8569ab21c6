package machine

import (
	"context"
	"fmt"
	"net"

	"github.com/corral-sandbox/corral/wire"
)

// Listen returns a listener on 127.0.0.1:port inside the network namespace
// of project's running machine, through the worker (net-listen, announced
// feature wire.FeatureNetListen). It starts no machine: without a running
// one, or when the port is taken, it fails with a *RejectedError (code
// wire.CodeDialFailed). A worker that did not announce the feature yields
// an error wrapping ErrUnsupported, with nothing sent; a lost connection
// wraps ErrInterrupted; ctx bounds the call, not the listener.
//
// The listener is the caller's alone (the worker keeps no copy): what the
// machine's programs connect to it is accepted by the caller, and the
// caller closes it, at the latest when the machine stops (a stopped
// machine's listener stays open, with nothing left to connect to it).
func (g *Gateway) Listen(ctx context.Context, p Project, port int) (net.Listener, error) {
	c, err := g.connection(ctx)
	if err != nil {
		return nil, err
	}
	if !c.hello.Has(wire.FeatureNetListen) {
		return nil, fmt.Errorf("%w: listeners in the machine (feature %q)", ErrUnsupported, wire.FeatureNetListen)
	}
	project, err := p.wire(c.hello)
	if err != nil {
		return nil, err
	}
	id := g.newID("listen")
	w := c.addDial(id)
	if w == nil {
		return nil, c.lossErr
	}
	if err := c.wc.Send(&wire.NetListen{ID: id, Project: project, Port: port}); err != nil {
		c.removeDial(id)
		c.fail(err)
		return nil, fmt.Errorf("%w: %w", ErrInterrupted, err)
	}
	select {
	case r := <-w:
		if r.err != nil {
			return nil, fmt.Errorf("machine: listen on port %d of project %d: %w", port, project.ID, r.err)
		}
		defer r.file.Close()
		ln, err := net.FileListener(r.file)
		if err != nil {
			return nil, fmt.Errorf("machine: listen on port %d of project %d: %w", port, project.ID, err)
		}
		return ln, nil
	case <-ctx.Done():
		if !c.removeDial(id) {
			if r := <-w; r.file != nil {
				r.file.Close()
			}
		}
		return nil, ctx.Err()
	}
}
