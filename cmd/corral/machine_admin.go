package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/corral-sandbox/corral/machine"
	"github.com/corral-sandbox/corral/projects"
	"github.com/corral-sandbox/corral/store"
)

// newSetMachineCmd is `corral project set-machine`.
func newSetMachineCmd(state *stateFlags) *cobra.Command {
	var (
		img              string
		memory, disk, tm sizeFlag
		pids             int64
		cpus             float64
	)
	cmd := &cobra.Command{
		Use:   "set-machine PROJECT [--image NAME] [--memory SIZE] [--pids N] [--cpus 1.5] [--disk SIZE] [--tmp SIZE]",
		Short: "Set a managed project's machine image and limits",
		Long: `Set what PROJECT's machine is built from. Flags not given keep their value.
Limits override the worker's defaults. A changed image takes effect at the
machine's next start (once idle, or after corral project reset), and its
upper layer (what guest root installed) is discarded then.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withState(cmd, *state, func(ctx context.Context, _ string, st store.Store) error {
				p, err := projectArg(ctx, st, args[0])
				if err != nil {
					return err
				}
				if p.Kind != store.ProjectManaged {
					return fmt.Errorf("project %s is a host project: it has no machine", p.Name)
				}
				fl := cmd.Flags()
				image, l := p.Image, p.Limits
				if fl.Changed("image") {
					image = img
				}
				if memory.set {
					l.Memory = memory.n
				}
				if disk.set {
					l.Disk = disk.n
				}
				if tm.set {
					l.Tmp = tm.n
				}
				if fl.Changed("pids") {
					if pids <= 0 {
						return fmt.Errorf("--pids must be positive, not %d", pids)
					}
					l.Pids = pids
				}
				if fl.Changed("cpus") {
					if cpus <= 0 || cpus > 1e6 || math.IsNaN(cpus) {
						return fmt.Errorf("--cpus must be a positive number of CPUs, not %v", cpus)
					}
					l.CPUMillis = max(int64(math.Round(cpus*1000)), 1)
				}
				return st.SetProjectMachine(ctx, p.ID, image, l)
			})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&img, "image", "", "the machine's image `NAME` (base: the default)")
	fl.Var(&memory, "memory", "memory limit (B, KiB, MiB, GiB)")
	fl.Int64Var(&pids, "pids", 0, "task limit")
	fl.Float64Var(&cpus, "cpus", 0, "CPU limit, in CPUs (1.5)")
	fl.Var(&disk, "disk", "disk limit of the workspace, home and upper layer")
	fl.Var(&tm, "tmp", "size of /tmp and /dev/shm, charged to memory")
	return cmd
}

// newResetCmd is `corral project reset`.
func newResetCmd(state *stateFlags) *cobra.Command {
	var socket string
	cmd := &cobra.Command{
		Use:   "reset PROJECT [--worker-socket PATH]",
		Short: "Discard a managed project's machine state (refused while it is in use)",
		Long: `Discard what guest root changed in PROJECT's machine outside the workspace
and the home (the upper layer of its root filesystem): the next command starts
from the image again. Refused while the project has live leases or its machine
runs commands. The worker at --worker-socket (default STATE/worker.sock, the
daemon's or corral run's shared worker) stops the machine and deletes the
layer; without a running worker, the layer under STATE/worker is deleted
directly. PROJECT is a name, an id, or the directory corral run --project
registered (corral project reset ~/proj2).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withState(cmd, *state, func(ctx context.Context, dir string, st store.Store) error {
				p, err := projectArg(ctx, st, args[0])
				if err != nil {
					return err
				}
				if p.Kind != store.ProjectManaged {
					return fmt.Errorf("project %s is a host project: it has no machine", p.Name)
				}
				sock := socket
				if sock == "" {
					sock = filepath.Join(dir, "worker.sock")
				}
				dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				c, derr := machine.Dial(dctx, sock)
				cancel()
				if derr != nil {
					if socket != "" {
						return fmt.Errorf("worker: %w", derr)
					}
					// No worker: nothing runs the machine.
					live, err := st.ProjectLiveLeases(ctx, p.ID)
					if err != nil {
						return err
					}
					if live > 0 {
						return fmt.Errorf("project %s is in use (%d live leases)", p.Name, live)
					}
					return projects.RemoveMachineState(filepath.Join(dir, "worker"), p.ID)
				}
				c.Close()
				gw := machine.New(machine.SocketTransport{Path: sock}, machine.Options{Logger: cliLogger()})
				defer gw.Close()
				err = projects.ResetMachine(ctx, st, gw, p)
				if errors.Is(err, store.ErrProjectBusy) {
					return fmt.Errorf("project %s is in use; try again when its commands ended: %w", p.Name, err)
				}
				return err
			})
		},
	}
	cmd.Flags().StringVar(&socket, "worker-socket", "", "the worker at `PATH` (default STATE/worker.sock)")
	return cmd
}
