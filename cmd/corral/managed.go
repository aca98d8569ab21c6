package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/corral-sandbox/corral/internal/workerproc"
	"github.com/corral-sandbox/corral/machine"
)

// startManagedTransport returns the transport for a --project run: the
// given --worker-socket, or a private worker started as a child of this
// process on a private socket, which stop ends.
func startManagedTransport(ctx context.Context, f *runFlags, state string) (machine.PrivilegedTransport, func(), error) {
	if f.workerSocket != "" {
		return machine.SocketTransport{Path: f.workerSocket}, func() {}, nil
	}
	if os.Geteuid() != 0 {
		return nil, nil, errors.New("managed projects need the privileged worker: run as root, or pass --worker-socket")
	}
	ws, err := filepath.Abs(f.project)
	if err != nil {
		return nil, nil, err
	}
	if ws, err = filepath.EvalSymlinks(ws); err != nil {
		return nil, nil, fmt.Errorf("project directory: %w", err)
	}
	self, err := os.Executable()
	if err != nil {
		return nil, nil, err
	}
	dir, err := os.MkdirTemp("", "corral-worker-")
	if err != nil {
		return nil, nil, err
	}
	sock := filepath.Join(dir, "worker.sock")
	// Images beside the worker's state (STATE/images, where `corral image
	// import --state STATE` puts them). Not --own-workspaces: the
	// workspace is the user's own checkout. The worker logs JSON; a private
	// worker's logs are kept only to explain a failed start.
	p, err := workerproc.Start(ctx, workerproc.Options{
		Exe: self,
		Args: []string{"worker", "--socket", sock, "--projects-root", filepath.Dir(ws),
			"--state", filepath.Join(state, "worker"), "--images", filepath.Join(state, "images")},
		Socket:    sock,
		Pdeathsig: syscall.SIGTERM,
	})
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	stop := func() {
		_ = p.Stop(context.Background()) // SIGTERM, then SIGKILL after 30 s
		os.RemoveAll(dir)
	}
	return machine.SocketTransport{Path: sock}, stop, nil
}
