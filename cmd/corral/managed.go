package main

import (
	"context"
	"errors"

	"github.com/corral-sandbox/corral/machine"
)

// startManagedTransport returns the transport for a --project run: the
// given --worker-socket, or a private worker started for this run.
func startManagedTransport(ctx context.Context, f *runFlags, state string) (machine.PrivilegedTransport, func(), error) {
	if f.workerSocket != "" {
		return machine.SocketTransport{Path: f.workerSocket}, func() {}, nil
	}
	return nil, nil, errors.New("managed projects need the privileged worker: not yet wired")
}
