package machine

import (
	"context"
	"fmt"
	"net"
	"os"

	"github.com/corral-sandbox/corral/wire"
)

// Listen returns a listener on 127.0.0.1:port inside the network namespace
// of project's machine, through the worker (net-listen, announced feature
// wire.FeatureNetListen); like Dial, it starts the machine if none runs.
// When the port is taken it fails with a *RejectedError wrapping
// ErrDialFailed (ErrNoMachine when the project has no running machine). A worker that did not announce the feature yields
// an error wrapping ErrUnsupported, with nothing sent; a lost connection
// wraps ErrInterrupted; ctx bounds the call, not the listener.
//
// The listener is the caller's alone (the worker keeps no copy): what the
// machine's programs connect to it is accepted by the caller, and the
// caller closes it, at the latest when the machine stops (a stopped
// machine's listener stays open, with nothing left to connect to it).
func (g *Gateway) Listen(ctx context.Context, p Project, port int) (net.Listener, error) {
	f, err := g.netRequest(ctx, p, port, "listen", wire.FeatureNetListen, func(id string, wp wire.Project) wire.Message {
		return &wire.NetListen{ID: id, Project: wp, Port: port}
	})
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ln, err := net.FileListener(f)
	if err != nil {
		return nil, fmt.Errorf("machine: listen on port %d of project %d: %w", port, p.ID, err)
	}
	return ln, nil
}

// netRequest sends the net-dial or net-listen frame req makes and returns
// the descriptor the worker answers with. feature, if not empty, must have
// been announced. A late answer after ctx ended finds no waiter; its
// descriptor is closed then.
func (g *Gateway) netRequest(ctx context.Context, p Project, port int, verb, feature string, req func(id string, wp wire.Project) wire.Message) (*os.File, error) {
	c, err := g.connection(ctx)
	if err != nil {
		return nil, err
	}
	if feature != "" && !c.hello.Has(feature) {
		return nil, fmt.Errorf("%w: net %s in the machine (feature %q)", ErrUnsupported, verb, feature)
	}
	project, err := p.wire(c.hello)
	if err != nil {
		return nil, err
	}
	id := g.newID(verb)
	w := c.addDial(id)
	if w == nil {
		return nil, c.lossErr
	}
	if err := c.wc.Send(req(id, project)); err != nil {
		c.removeDial(id)
		c.fail(err)
		return nil, fmt.Errorf("%w: %w", ErrInterrupted, err)
	}
	select {
	case r := <-w:
		if r.err != nil {
			return nil, fmt.Errorf("machine: %s port %d of project %d: %w", verb, port, project.ID, r.err)
		}
		return r.file, nil
	case <-ctx.Done():
		if !c.removeDial(id) {
			if r := <-w; r.file != nil {
				r.file.Close()
			}
		}
		return nil, ctx.Err()
	}
}
