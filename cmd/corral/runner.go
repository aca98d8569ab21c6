package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/corral-sandbox/corral/runner"
)

// newRunnerCmd is `corral runner`, the delegated runner a parent corral
// starts with runner.Start.
func newRunnerCmd() *cobra.Command {
	var (
		state, storeFlagValue string
		ttl                   time.Duration
		fd                    int
	)
	cmd := &cobra.Command{
		Use:   "runner --state DIR [--worker-fd 3] [--lease-ttl D]",
		Short: "Run a delegated job of bounded commands (started by a parent corral)",
		Long: `Run one job as a delegated process. A parent corral starts it (see the runner
package) with exactly one inherited descriptor, 3, named by --worker-fd 3: its
own connection to the privileged worker. Without --worker-fd only host-project
commands succeed. The runner has no other way to the worker, never migrates
the store (--store, default STATE/corral.db; another schema version is refused), runs no plugin services
and has no Sites control.

The job is one JSON document on stdin:
{"actor":{"accountUserId":N,"roots":[...]},"project":{"kind":K,"projectId":N},
 "commands":[{"command":{"type":"argv","file":F,"args":[...]},"cwd":S,
              "timeoutMs":N,"outputLimit":{"stdout":N,"stderr":N,"combined":N}}]}
The parent keeps stdin open afterwards. The commands run in order (lease kind
"runner"); for each the runner writes one line to stdout:
{"stdout":S,"stderr":S,"code":N|null,"signal":S|null} or
{"error":{"kind":K,"message":S,"stdout":S,"stderr":S}}.

Exit status: 0 when every command was reported; 1 when the job could not be run
(reason on stderr, nothing on stdout); 3 when stdin reached EOF (the parent is
gone) or SIGTERM/SIGINT arrived first: the running command is cancelled and
nothing more is reported. Leases left behind by a killed runner expire after
--lease-ttl, and their commands end with them.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if ttl < 0 {
				return fmt.Errorf("--lease-ttl must not be negative, not %v", ttl)
			}
			dir, err := stateDir(state)
			if err != nil {
				return err
			}
			u, err := storeURL(storeFlagValue, dir)
			if err != nil {
				return err
			}
			status := runner.Main(cmd.Context(), runner.Options{
				StorePath: u,
				StateDir:  dir,
				LeaseTTL:  ttl,
				WorkerFD:  fd,
				Logger:    cliLogger(),
			})
			if status != 0 {
				return exitError{status}
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&state, "state", "", "state `DIR` holding corral.db (default $XDG_STATE_HOME/corral)")
	storeFlag(fl, &storeFlagValue)
	fl.IntVar(&fd, "worker-fd", 0, "inherited descriptor `N` holding the runner's worker connection (runner.Start passes 3)")
	fl.DurationVar(&ttl, "lease-ttl", 0, "TTL of the runner's leases: how long its commands may outlive it if it is killed (default 15s)")
	return cmd
}
