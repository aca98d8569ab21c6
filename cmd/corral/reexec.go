package main

import (
	"github.com/spf13/cobra"

	"github.com/corral-sandbox/corral/confine"
	"github.com/corral-sandbox/corral/machine"
	"github.com/corral-sandbox/corral/worker"
	"golang.org/x/sys/unix"
)

// reexec dispatches the hidden re-exec entry points before anything else
// runs: the confinement helper and the machine init never return.
func reexec() {
	confine.MaybeRun()
	worker.MaybeRunInit()
	// Descriptors this process inherited without close-on-exec (from a
	// shell, a service manager) must not reach the commands it starts —
	// confined ones are forked from a restricted thread, not through the
	// helper that used to close them. The ones a subcommand is given by
	// number (--worker-fd) stay usable here.
	_ = unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC)
}

// addCommands adds the subcommands beyond run and version.
func addCommands(root *cobra.Command) {
	root.AddCommand(newWorkerCmd())
	root.AddCommand(daemonCommands()...)
	root.AddCommand(newRunnerCmd())
	root.AddCommand(newExecCmd())
	root.AddCommand(newProcessCmd())
	root.AddCommand(newCpCmd())
	root.AddCommand(newMCPCmd())
}

// envTransport is the transport for a run that was given --worker-socket.
func envTransport(f *runFlags) machine.PrivilegedTransport {
	if f.workerSocket != "" {
		return machine.SocketTransport{Path: f.workerSocket}
	}
	return nil
}
