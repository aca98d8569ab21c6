package main

import (
	"github.com/spf13/cobra"

	"github.com/corral-sandbox/corral/confine"
	"github.com/corral-sandbox/corral/machine"
	"github.com/corral-sandbox/corral/worker"
)

// reexec dispatches the hidden re-exec entry points before anything else
// runs: the confinement helper and the machine init never return.
func reexec() {
	confine.MaybeRun()
	worker.MaybeRunInit()
}

// addCommands adds the subcommands beyond run and version.
func addCommands(root *cobra.Command) {
	root.AddCommand(newWorkerCmd())
	root.AddCommand(daemonCommands()...)
	root.AddCommand(newRunnerCmd())
}

// envTransport is the transport for a run that was given --worker-socket.
func envTransport(f *runFlags) machine.PrivilegedTransport {
	if f.workerSocket != "" {
		return machine.SocketTransport{Path: f.workerSocket}
	}
	return nil
}
