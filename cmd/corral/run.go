package main

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/corral-sandbox/corral/sandbox"
)

// runFlags are the pinned flags of `corral run`.
type runFlags struct {
	host          string
	project       string
	cwd           string
	user          string
	timeout       time.Duration
	stdoutLimit   sizeFlag
	stderrLimit   sizeFlag
	combinedLimit sizeFlag
	leaseKind     string
	json          bool

	state        string
	workerSocket string
	image        string

	daemon    string
	token     string
	projectID int64

	egressAllow     []string
	egressAllowCIDR []string
}

func newRunCmd() *cobra.Command {
	var f runFlags
	cmd := &cobra.Command{
		Use:   "run [flags] -- FILE [ARG...]",
		Short: "Run one bounded command in a project",
		Long: `Run one bounded command in a host project (--host DIR) or a managed
project (--project DIR) and report its outcome.

Without --json, the command's stdout and stderr are written to corral's own and
corral exits with the command's exit code, or 128+N for a death by signal N.
If corral could not complete the command it writes the partial output, then
"corral: KIND: MESSAGE" on stderr, and exits 124 for a timeout, 125 otherwise.

With --json, exactly one JSON object is written to stdout:
{"stdout":S,"stderr":S,"code":N|null,"signal":S|null} (plus "oomKilled":true
after "signal":"SIGKILL" when the kernel's OOM killer killed a managed command)
or {"error":{"kind":K,"message":S,"stdout":S,"stderr":S}}, with the same exit
statuses. SIGINT or SIGTERM aborts the command (kind "abort").`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			status := runMain(cmd, &f, args)
			if status != 0 {
				return exitError{status}
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.host, "host", "", "run in a host project rooted at `DIR`")
	fl.StringVar(&f.project, "project", "", "run in a managed project whose workspace is `DIR` (root)")
	fl.StringVar(&f.cwd, "cwd", "", "working `PATH` (host path for --host, guest path for --project)")
	fl.StringVar(&f.user, "user", "", "run as `NAME|UID` of the machine (--project, --daemon; default: the image's user)")
	fl.DurationVar(&f.timeout, "timeout", sandbox.DefaultTimeout, "bound the command's run time")
	fl.Var(&f.stdoutLimit, "stdout-limit", "stdout capture limit (B, KiB, MiB; default 1MiB)")
	fl.Var(&f.stderrLimit, "stderr-limit", "stderr capture limit (B, KiB, MiB; default 1MiB)")
	fl.Var(&f.combinedLimit, "combined-limit", "capture limit for stdout and stderr together (excludes the per-stream limits)")
	fl.StringVar(&f.leaseKind, "lease-kind", string(sandbox.LeaseTerminal), "lease `KIND`: editor, files, terminal, github, lsp, runner")
	fl.BoolVar(&f.json, "json", false, "write one JSON object to stdout")
	fl.StringVar(&f.state, "state", "", "state `DIR` (default $XDG_STATE_HOME/corral)")
	fl.StringVar(&f.workerSocket, "worker-socket", "", "use the running worker at `PATH` instead of starting one (--project)")
	fl.StringVar(&f.image, "image", "", "the machine's image `NAME` (--project; recorded for the project; default base)")
	fl.StringVar(&f.daemon, "daemon", "", "run through the corral daemon at `ADDR` (a Unix socket path or host:port)")
	fl.StringVar(&f.token, "token", "", "bearer token for --daemon (default $CORRAL_TOKEN)")
	fl.Int64Var(&f.projectID, "project-id", 0, "the daemon's project `ID` (with --daemon)")
	fl.StringSliceVar(&f.egressAllow, "egress-allow", nil, "give this run's machine proxies that connect where `RULES` allow (comma-separated domains, *.wildcards, CIDRs, :ports; --project; the project's stored policy is restored afterwards)")
	fl.StringArrayVar(&f.egressAllowCIDR, "egress-allow-cidr", nil, "open the floor range `CIDR` for this run's proxies (repeatable; e.g. 127.0.0.0/8)")
	return cmd
}

// runMain runs the command and reports it; it returns corral's exit status.
func runMain(cmd *cobra.Command, f *runFlags, argv []string) int {
	stdout, stderr := cmd.OutOrStdout(), cmd.ErrOrStderr()
	opts, err := f.options()
	if err != nil {
		return report(stdout, stderr, f.json, nil, err)
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if f.daemon != "" {
		res, err := runViaDaemon(ctx, f, argv, opts)
		return report(stdout, stderr, f.json, res, err)
	}

	env, err := openRunEnv(ctx, f)
	if err != nil {
		return report(stdout, stderr, f.json, nil, err)
	}
	defer env.close()
	in := sandbox.ExecInput{
		Command:   sandbox.Command{Type: sandbox.CommandTypeArgv, File: argv[0], Args: argv[1:]},
		Cwd:       env.cwd,
		User:      f.user,
		LeaseKind: sandbox.LeaseKind(f.leaseKind),
		Project:   env.project,
	}
	res, err := env.control.RunCommand(ctx, in, &env.actor, opts)
	return report(stdout, stderr, f.json, res, err)
}

// options validates the flags into RunOptions.
func (f *runFlags) options() (*sandbox.RunOptions, error) {
	switch {
	case f.daemon != "":
		if f.host != "" || f.project != "" || f.projectID <= 0 {
			return nil, errors.New("--daemon takes --project-id ID, not --host or --project")
		}
	case (f.host == "") == (f.project == ""):
		return nil, errors.New("give exactly one of --host DIR and --project DIR")
	}
	if (len(f.egressAllow) > 0 || len(f.egressAllowCIDR) > 0) && f.project == "" {
		return nil, errors.New("--egress-allow and --egress-allow-cidr take --project DIR")
	}
	if f.image != "" && f.project == "" {
		return nil, errors.New("--image goes with --project DIR")
	}
	if f.combinedLimit.set && (f.stdoutLimit.set || f.stderrLimit.set) {
		return nil, errors.New("--combined-limit excludes --stdout-limit and --stderr-limit")
	}
	if f.timeout <= 0 {
		return nil, fmt.Errorf("--timeout must be positive, not %v", f.timeout)
	}
	if !sandbox.LeaseKind(f.leaseKind).Valid() {
		return nil, fmt.Errorf("--lease-kind %q is not one of editor, files, terminal, github, lsp, runner", f.leaseKind)
	}
	return &sandbox.RunOptions{
		Timeout: f.timeout,
		OutputLimit: sandbox.OutputLimit{
			Stdout:   f.stdoutLimit.n,
			Stderr:   f.stderrLimit.n,
			Combined: f.combinedLimit.n,
		},
	}, nil
}

// runEnv is what one `corral run` needs: a control, the project, the actor.
type runEnv struct {
	control *sandbox.Control
	project sandbox.ProjectRef
	actor   sandbox.Actor
	cwd     string
	closers []func()
}

func (e *runEnv) close() {
	for i := len(e.closers) - 1; i >= 0; i-- {
		e.closers[i]()
	}
}
