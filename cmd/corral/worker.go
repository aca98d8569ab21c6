package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/corral-sandbox/corral/worker"
)

func newWorkerCmd() *cobra.Command {
	var (
		socket, projectsRoot, state string
		cgroupParent                string
		images                      string
		ownWorkspaces, grant        bool
		idle, exitIdle              time.Duration
		idleLock                    string
		memory, tmp, disk           sizeFlag
		pids                        int64
		cpus                        float64
		maxSessions                 int
		allowUID                    uint32
	)
	cmd := &cobra.Command{
		Use:   "worker --socket PATH --projects-root DIR",
		Short: "Serve protocol 2 as the privileged worker (root)",
		Long: `Run the persistent privileged worker: it listens on a SOCK_SEQPACKET Unix
socket (mode 0600) and runs one machine per project whose workspace lies under
--projects-root. It must run as root. It serves connections only from root
and from the uid given by --allow-uid (the daemon's); others get a
"forbidden" error frame and are closed. SIGTERM or SIGINT stops every machine.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := worker.RequireRoot(); err != nil {
				return err
			}
			if socket == "" || projectsRoot == "" {
				return errors.New("--socket and --projects-root are required")
			}
			if (exitIdle > 0) != (idleLock != "") {
				return errors.New("--exit-idle and --idle-lock go together")
			}
			if state == "" {
				state = "/var/lib/corral/worker"
			}
			if err := os.MkdirAll(state, 0o700); err != nil {
				return err
			}
			log := slog.New(slog.NewJSONHandler(cmd.ErrOrStderr(), nil))
			w, err := worker.New(worker.Config{
				ProjectsRoot:    projectsRoot,
				StateDir:        state,
				ImagesDir:       images,
				OwnWorkspaces:   ownWorkspaces,
				GrantWorkspaces: grant,
				CgroupParent:    cgroupParent,
				IdleGrace:       idle,
				MaxSessions:     maxSessions,
				Limits:          worker.Limits{Memory: memory.n, Pids: pids, CPUMillis: cpuMillis(cpus), Tmp: tmp.n, Disk: disk.n},
				Logger:          log,
				Name:            "corral-worker/" + version,
				AllowUID:        allowUID,
			})
			if err != nil {
				return err
			}
			ln, err := worker.Listen(socket)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			// An idle worker exits holding the users' lock, which the
			// process's end releases.
			held := make(chan *os.File, 1)
			if exitIdle > 0 {
				go func() {
					if f := exitWhenIdle(ctx, idleLock, exitIdle); f != nil {
						held <- f
						log.Info("worker idle: exiting", "idle", exitIdle.String())
						stop()
					}
				}()
			}
			defer func() {
				select {
				case f := <-held:
					runtime.KeepAlive(f)
				default:
				}
			}()
			log.Info("worker listening", "socket", socket, "projectsRoot", projectsRoot)
			serveErr := w.Serve(ctx, ln)
			sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := w.Shutdown(sctx); err != nil {
				return fmt.Errorf("shutdown: %w", err)
			}
			os.Remove(socket)
			return serveErr
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&socket, "socket", "", "listen on this Unix socket `PATH`")
	fl.StringVar(&projectsRoot, "projects-root", "", "accept only workspaces under `DIR`")
	fl.StringVar(&state, "state", "", "worker state `DIR` (homes, upper layers); default /var/lib/corral/worker")
	fl.StringVar(&images, "images", "", "image store `DIR` (default STATE/images)")
	fl.BoolVar(&ownWorkspaces, "own-workspaces", false, "give root-owned workspaces to their projects' unprivileged ids before the first start (for managed workspaces, not user checkouts)")
	fl.BoolVar(&grant, "grant-workspaces", false, "let machines write root-owned workspaces through POSIX ACL entries for their guest ids, every .git excepted (for user checkouts on a root machine; corral run's shared worker)")
	fl.StringVar(&cgroupParent, "cgroup-parent", "", "machine cgroup parent `PATH`, relative to the worker's own cgroup (v1, delegated v2) or the v2 root; default corral-<hash of the state directory>")
	fl.DurationVar(&idle, "idle-grace", 0, "stop a machine after this long without sessions (default 1m)")
	fl.DurationVar(&exitIdle, "exit-idle", 0, "exit once the lock file --idle-lock has been free (no corral run holds it shared) for this long (the shared worker of corral run --project)")
	fl.StringVar(&idleLock, "idle-lock", "", "the users' lock `FILE` of --exit-idle")
	fl.Var(&memory, "memory", "memory limit per machine (default 1GiB)")
	fl.Int64Var(&pids, "pids", 0, "task limit per machine (default 512)")
	fl.Uint32Var(&allowUID, "allow-uid", 0, "also serve connections from this `UID` (the daemon's; root is always served)")
	fl.Float64Var(&cpus, "cpus", 0, "CPU limit per machine, in CPUs (default 1; negative: none)")
	fl.Var(&tmp, "tmp", "size of a machine's /tmp and of its /dev/shm, each; charged to its memory (default 256MiB)")
	fl.Var(&disk, "disk", "size of a machine's disk (its home: an ext4 image of its own under the state directory, at least 8MiB), unless its project sets one (default none: the home is a host directory)")
	fl.IntVar(&maxSessions, "max-sessions", 0, "sessions per machine (default 64)")
	return cmd
}

// cpuMillis converts a --cpus value to thousandths of a CPU (negative
// stays negative: no limit).
func cpuMillis(cpus float64) int64 {
	switch {
	case cpus < 0:
		return -1
	case cpus == 0:
		return 0
	}
	return max(int64(cpus*1000+0.5), 1)
}
