package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/core"
	"github.com/corral-sandbox/corral/image"
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
	env           []string
	envFile       []string
	interactive   bool

	state        string
	workerSocket string
	workerIdle   time.Duration
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
"corral: KIND: MESSAGE" on stderr, and exits 124 for a timeout, 125 otherwise
— except, as Docker does, 127 for a start error whose program was not found,
126 for one whose file cannot be executed, and 128+N when signal N aborted
the run (Ctrl-C: 130).

With --json, exactly one JSON object is written to stdout:
{"stdout":S,"stderr":S,"code":N|null,"signal":S|null} (plus "oomKilled":true
after "signal":"SIGKILL" when the kernel's OOM killer killed a managed command)
or {"error":{"kind":K,"message":S,"stdout":S,"stderr":S}} (a start error adds
"reason":"notFound" or "reason":"notExecutable" where it is known), with the
same exit statuses. SIGINT or SIGTERM aborts the command (kind "abort").

Without --json, output is written as it arrives (in order within each stream,
the bytes the command wrote); with --json it comes in the one object.

-e NAME=VALUE (repeatable) and --env-file FILE (NAME=VALUE lines; blank lines
and lines starting with # are skipped) set environment variables over the
sandbox's defaults; -e NAME passes corral's own $NAME, if set. -e wins over
--env-file, a later value over an earlier one. With -i corral's own stdin
becomes the command's (streamed; through --daemon it is sent whole, at most
16 MiB); without it the command's input is empty and corral's stdin is not
read.

A managed machine applies its image's configuration as Docker does: its Env
(PATH included) under -e, its User unless --user, its WorkingDir unless
--cwd; and with --project and no command, its Entrypoint followed by its Cmd
runs.

--project runs go through the state directory's shared worker
(STATE/worker.sock): the first run starts it in the background, later runs
(in parallel, on any project) use it, and it exits with its machines once no
run has used it for --worker-idle (default 1m). Its log is STATE/worker.log.
--worker-socket PATH uses a worker started otherwise (corral worker). The
guest's default user and root both write DIR: a user's checkout as that user
and as the machine's own ids; a root-owned one through POSIX ACL entries the
first run adds for the machine's ids (every .git excepted; see README).
Nothing the guest writes belongs to host root.`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 && f.project == "" {
				return errors.New("requires a command: corral run [flags] -- FILE [ARG...] (only --project may omit it, for its image's)")
			}
			status := runMain(cmd, &f, args)
			if status != 0 {
				return exitError{status}
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.host, "host", "", "run in a host project rooted at `DIR` (as root: ACL entries on DIR give the project's user access; see README)")
	fl.StringVar(&f.project, "project", "", "run in a managed project whose workspace is `DIR` (root)")
	fl.StringVarP(&f.cwd, "cwd", "w", "", "working `PATH` (host path for --host, guest path for --project)")
	fl.StringVarP(&f.user, "user", "u", "", "run as `NAME|UID` of the machine (--project, --daemon; default: the image's user)")
	fl.DurationVar(&f.timeout, "timeout", sandbox.DefaultTimeout, "bound the command's run time")
	fl.Var(&f.stdoutLimit, "stdout-limit", "stdout capture limit (B, KiB, MiB; default 1MiB)")
	fl.Var(&f.stderrLimit, "stderr-limit", "stderr capture limit (B, KiB, MiB; default 1MiB)")
	fl.Var(&f.combinedLimit, "combined-limit", "capture limit for stdout and stderr together (excludes the per-stream limits)")
	fl.StringVar(&f.leaseKind, "lease-kind", string(sandbox.LeaseTerminal), "lease `KIND`: editor, files, terminal, github, lsp, runner")
	fl.BoolVar(&f.json, "json", false, "write one JSON object to stdout")
	fl.StringArrayVarP(&f.env, "env", "e", nil, "set environment variable `NAME=VALUE` (or pass corral's own NAME); repeatable")
	fl.StringArrayVar(&f.envFile, "env-file", nil, "read environment variables from `FILE` (NAME=VALUE lines, # comments); repeatable")
	fl.BoolVarP(&f.interactive, "interactive", "i", false, "make corral's stdin the command's stdin")
	fl.StringVar(&f.state, "state", "", "state `DIR` (default $XDG_STATE_HOME/corral)")
	fl.StringVar(&f.workerSocket, "worker-socket", "", "use the running worker at `PATH` instead of starting one (--project)")
	fl.DurationVar(&f.workerIdle, "worker-idle", DefaultWorkerIdle, "a shared worker this run starts exits after this long without runs (--project)")
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
	// The command's output is reported at the end; without --json it is
	// written as it arrives instead, and not again.
	report := func(res *sandbox.CommandResult, err error) int {
		return reportTo(stdout, stderr, stdout, stderr, f.json, res, err)
	}
	opts, err := f.options()
	if err != nil {
		return report(nil, err)
	}
	env, err := f.environment()
	if err != nil {
		return report(nil, err)
	}
	if f.interactive {
		opts.Stdin = cmd.InOrStdin()
	}
	if !f.json {
		live := &liveWriter{stdout: stdout, stderr: stderr}
		opts.OnOutput = live.write
		opts.RawOutput = true
		report = func(res *sandbox.CommandResult, err error) int {
			return reportTo(stdout, stderr, io.Discard, io.Discard, false, res, err)
		}
	}
	ctx, stop, caught := signalContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// A run a signal aborted exits 128+N, as a shell's command would
	// (Ctrl-C: 130).
	outcome := report
	report = func(res *sandbox.CommandResult, err error) int {
		sig := caught()
		if err == nil || sig == 0 {
			return outcome(res, err)
		}
		ce := asCommandError(err)
		if ce.Kind == sandbox.KindAbort || ctx.Err() != nil {
			ce.Kind, ce.Message = sandbox.KindAbort, "interrupted by "+unix.SignalName(sig)
		}
		outcome(nil, ce)
		return 128 + int(sig)
	}
	if f.daemon != "" {
		return report(runViaDaemon(ctx, f, argv, env, opts))
	}

	renv, err := openRunEnv(ctx, f)
	if err != nil {
		return report(nil, err)
	}
	defer renv.close()
	if len(argv) == 0 {
		if argv, err = imageCommand(ctx, renv.state, renv.image); err != nil {
			return report(nil, err)
		}
	}
	in := sandbox.ExecInput{
		Command:   sandbox.Command{Type: sandbox.CommandTypeArgv, File: argv[0], Args: argv[1:]},
		Cwd:       renv.cwd,
		User:      f.user,
		LeaseKind: sandbox.LeaseKind(f.leaseKind),
		Project:   renv.project,
		Env:       env,
	}
	return report(renv.control.RunCommand(ctx, in, &renv.actor, opts))
}

// liveWriter writes output as it arrives (RunOptions.OnOutput); the two
// streams' writes are serialized, in case both go to one writer.
type liveWriter struct {
	mu             sync.Mutex
	stdout, stderr io.Writer
}

func (w *liveWriter) write(s sandbox.Stream, p []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if s == sandbox.Stderr {
		_, _ = w.stderr.Write(p)
	} else {
		_, _ = w.stdout.Write(p)
	}
}

// environment reads --env-file and -e into the command's variables (nil
// when there are none). Names are checked by RunCommand.
func (f *runFlags) environment() (map[string]string, error) {
	var env map[string]string
	set := func(k, v string) {
		if env == nil {
			env = map[string]string{}
		}
		env[k] = v
	}
	for _, file := range f.envFile {
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("--env-file: %w", err)
		}
		for i, line := range strings.Split(string(data), "\n") {
			line = strings.TrimSuffix(line, "\r")
			if strings.TrimSpace(line) == "" || strings.HasPrefix(strings.TrimSpace(line), "#") {
				continue
			}
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				return nil, fmt.Errorf("--env-file %s:%d: not NAME=VALUE: %q", file, i+1, line)
			}
			set(k, v)
		}
	}
	for _, kv := range f.env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			set(k, v)
		} else if v, ok := os.LookupEnv(kv); ok {
			set(kv, v)
		}
	}
	return env, nil
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
	core    *core.Core // for corral cp's machine files
	control *sandbox.Control
	project sandbox.ProjectRef
	actor   sandbox.Actor
	cwd     string
	closers []func()
	// state is the state directory; image a managed project's image.
	state, image string
}

func (e *runEnv) close() {
	for i := len(e.closers) - 1; i >= 0; i-- {
		e.closers[i]()
	}
}

// signalContext is signal.NotifyContext that also tells which signal
// ended the context: caught returns it, or 0 while none has.
func signalContext(parent context.Context, sigs ...os.Signal) (ctx context.Context, stop func(), caught func() syscall.Signal) {
	ctx, cancel := context.WithCancel(parent)
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, sigs...)
	var got atomic.Int32
	go func() {
		select {
		case s := <-ch:
			if n, ok := s.(syscall.Signal); ok {
				got.Store(int32(n))
			}
			cancel()
		case <-ctx.Done():
		}
	}()
	stop = func() {
		signal.Stop(ch)
		cancel()
	}
	return ctx, stop, func() syscall.Signal { return syscall.Signal(got.Load()) }
}

// imageCommand is the command of a run that gives none: the image's
// Entrypoint followed by its Cmd, as Docker runs a container without one.
func imageCommand(ctx context.Context, state, name string) ([]string, error) {
	if name == "" {
		name = image.BaseName
	}
	var cfg image.Config
	if name != image.BaseName {
		imgs, err := image.Open(filepath.Join(state, "images"), image.Options{Logger: cliLogger()})
		if err != nil {
			return nil, err
		}
		img, err := imgs.Get(ctx, name)
		if err != nil {
			return nil, err
		}
		cfg = img.Config
	}
	argv := append(slices.Clone(cfg.Entrypoint), cfg.Cmd...)
	if len(argv) == 0 {
		return nil, fmt.Errorf("no command given, and the image %s has no Entrypoint or Cmd", name)
	}
	return argv, nil
}
