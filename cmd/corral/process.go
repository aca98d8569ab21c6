package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/corral-sandbox/corral/client"
	"github.com/corral-sandbox/corral/sandbox"
)

// processFlags are the daemon flags every process subcommand takes.
type processFlags struct {
	daemon    string
	token     string
	projectID int64
	json      bool
}

func (f *processFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.daemon, "daemon", "", "the corral daemon at `ADDR` (a Unix socket path, host:port or URL)")
	fl.StringVar(&f.token, "token", "", "bearer token (default $CORRAL_TOKEN)")
	fl.Int64Var(&f.projectID, "project-id", 0, "the daemon's project `ID`")
}

func (f *processFlags) client() (*client.Client, error) {
	if f.daemon == "" || f.projectID <= 0 {
		return nil, errors.New("give --daemon ADDR --project-id N")
	}
	return f.dial()
}

// dial returns a client of --daemon with --token (default $CORRAL_TOKEN).
func (f *processFlags) dial() (*client.Client, error) {
	return daemonClient(f.daemon, f.token)
}

// daemonClient is the one client setup of the commands that talk to a
// daemon: a client of addr (--daemon) with the bearer token given
// (--token), or $CORRAL_TOKEN when none was.
func daemonClient(addr, token string) (*client.Client, error) {
	if token == "" {
		token = os.Getenv("CORRAL_TOKEN")
	}
	return client.New(addr, token)
}

func newProcessCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "process",
		Short: "Start, list, follow and kill a daemon's background processes",
		Long: `Background processes run in a project, held by the daemon (not by corral):
they keep running when corral exits, until they exit, their lifetime ends
(--lifetime, default 1 h) or they are killed. Their newest output is kept by
the daemon and can be replayed and followed.`,
	}
	cmd.AddCommand(newProcessStartCmd(), newProcessListCmd(), newProcessLogsCmd(), newProcessKillCmd())
	return cmd
}

func newProcessStartCmd() *cobra.Command {
	var (
		f        processFlags
		env      []string
		workdir  string
		user     string
		lifetime time.Duration
		buffer   int64
		tty      bool
	)
	cmd := &cobra.Command{
		Use:   "start [-e K=V] [-w DIR] [-u USER] [--lifetime D] --daemon ADDR --project-id N -- CMD [ARG...]",
		Short: "Start a background process and print its id",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			req := client.ProcessRequest{Argv: args, Cwd: workdir, User: user, OutputBuffer: buffer}
			if lifetime > 0 {
				req.Lifetime = int64((lifetime + time.Second - 1) / time.Second)
			}
			if tty {
				req.TTY = &sandbox.TTYSize{Rows: 24, Cols: 80}
			}
			for _, kv := range env {
				k, v, ok := strings.Cut(kv, "=")
				if !ok || !sandbox.ValidEnvName(k) {
					return fmt.Errorf("-e %q: want K=V with a valid name", kv)
				}
				if req.Env == nil {
					req.Env = map[string]string{}
				}
				req.Env[k] = v
			}
			p, err := c.StartProcess(cmd.Context(), f.projectID, req)
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd, p)
			}
			fmt.Fprintln(cmd.OutOrStdout(), p.ID)
			return nil
		},
	}
	f.add(cmd)
	jsonFlag(cmd, &f.json)
	fl := cmd.Flags()
	fl.StringArrayVarP(&env, "env", "e", nil, "set `K=V` in the command's environment (repeatable)")
	fl.StringVarP(&workdir, "workdir", "w", "", "working `DIR`")
	fl.StringVarP(&user, "user", "u", "", "run as `NAME|UID` of the machine")
	fl.DurationVar(&lifetime, "lifetime", 0, "kill it after `D` (default: the daemon's, 1h)")
	fl.Int64Var(&buffer, "buffer", 0, "keep the newest `BYTES` of its output (default: the daemon's, 1 MiB)")
	fl.BoolVarP(&tty, "tty", "t", false, "run it on a terminal (24x80)")
	return cmd
}

func newProcessListCmd() *cobra.Command {
	var f processFlags
	cmd := &cobra.Command{
		Use:   "list --daemon ADDR --project-id N",
		Short: "List a project's background processes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			ps, err := c.Processes(cmd.Context(), f.projectID)
			if err != nil {
				return err
			}
			return listing[client.Process]{
				items:  ps,
				header: "ID\tSTATE\tOUTCOME\tSTARTED\tOUTPUT\tCOMMAND",
				row: func(p client.Process) []any {
					return []any{p.ID, p.State, outcome(p), p.Started.Local().Format(time.DateTime),
						p.Output.StdoutBytes + p.Output.StderrBytes, strings.Join(p.Argv, " ")}
				},
			}.print(cmd, f.json)
		},
	}
	f.add(cmd)
	jsonFlag(cmd, &f.json)
	return cmd
}

// outcome is a process's outcome in a list: its code or signal, else its
// error's kind.
func outcome(p client.Process) string {
	switch {
	case p.Exit != nil && p.Exit.Code != nil:
		return fmt.Sprintf("code %d", *p.Exit.Code)
	case p.Exit != nil && p.Exit.Signal != nil:
		s := *p.Exit.Signal
		if p.Exit.OOMKilled {
			s += " (OOM)"
		}
		return s
	case p.Error != nil:
		return p.Error.Kind
	}
	return "-"
}

func newProcessLogsCmd() *cobra.Command {
	var (
		f      processFlags
		follow bool
		from   int64
	)
	cmd := &cobra.Command{
		Use:   "logs [-f] [--from OFFSET] --daemon ADDR --project-id N ID",
		Short: "Print a background process's output (and follow it with -f)",
		Long: `Print what the daemon kept of a process's output, its stdout on corral's
stdout and its stderr on corral's stderr. With -f, keep printing new output
until the process ends (^C stops following; the process keeps running). When
older output fell off the daemon's buffer, a note on stderr says so.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			stdout, stderr := cmd.OutOrStdout(), cmd.ErrOrStderr()
			first := true
			end, err := c.ProcessOutput(ctx, f.projectID, args[0], client.OutputOptions{From: from, Follow: follow}, func(ch client.OutputChunk) error {
				if first && ch.Offset > from {
					fmt.Fprintf(stderr, "corral: output before offset %d is no longer kept\n", ch.Offset)
				}
				first = false
				w := stdout
				if ch.Stream == "stderr" {
					w = stderr
				}
				_, err := w.Write(ch.Data)
				return err
			})
			if err != nil {
				if ctx.Err() != nil && cmd.Context().Err() == nil {
					return nil // ^C: stop following
				}
				return err
			}
			if f.json {
				return printJSON(cmd, end)
			}
			return nil
		},
	}
	f.add(cmd)
	jsonFlag(cmd, &f.json)
	cmd.Flags().Lookup("json").Usage = "print the last line (offset, state, outcome) as JSON after the output"
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "follow new output until the process ends")
	cmd.Flags().Int64Var(&from, "from", 0, "start at `OFFSET` of the combined output")
	return cmd
}

func newProcessKillCmd() *cobra.Command {
	var (
		f   processFlags
		sig string
	)
	cmd := &cobra.Command{
		Use:   "kill [-s SIGNAL] --daemon ADDR --project-id N ID",
		Short: "Kill a background process's whole tree (or send it a signal)",
		Long: `Without -s, kill the process's whole tree, wait for it to end and have the
daemon forget it. With -s SIGNAL (TERM, INT, HUP, …), send that signal to
every process of its tree and return; the daemon keeps its outcome.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), time.Minute)
			defer cancel()
			var p *client.Process
			if sig != "" {
				p, err = c.SignalProcess(ctx, f.projectID, args[0], sig)
			} else {
				p, err = c.KillProcess(ctx, f.projectID, args[0])
			}
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd, p)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s %s %s\n", p.ID, p.State, outcome(*p))
			return nil
		},
	}
	f.add(cmd)
	jsonFlag(cmd, &f.json)
	cmd.Flags().StringVarP(&sig, "signal", "s", "", "send `SIGNAL` to the tree instead of killing and forgetting it")
	return cmd
}
