package main

import (
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/corral-sandbox/corral/api"
	"github.com/corral-sandbox/corral/daemon"
	"github.com/corral-sandbox/corral/export"
)

// daemonCommands are the daemon's subcommands: daemon, account, token and
// project. addCommands adds them to the root.
func daemonCommands() []*cobra.Command {
	return []*cobra.Command{newDaemonCmd(), newAccountCmd(), newTokenCmd(), newProjectCmd(), newStoreCmd()}
}

func newDaemonCmd() *cobra.Command {
	var (
		cfg            daemon.Config
		state          string
		storeFlagValue string
		debug          bool
		lspServers     []string
		allowCIDRs     []string
		memory         sizeFlag
		tmp            sizeFlag
		disk           sizeFlag
		pids           int64
		cpus           float64
	)
	cmd := &cobra.Command{
		Use:   "daemon --state DIR [--listen ADDR] [--worker-socket PATH]",
		Short: "Serve the HTTP API on STATE/corral.sock (and optionally TCP)",
		Long: `Serve corral's authenticated HTTP API, the Sites gateway, /metrics and
/healthz on the Unix socket STATE/corral.sock (mode 0660) and, with --listen, on
a TCP address. The database is --store (default STATE/corral.db); managed workspaces live in
STATE/projects.

As root and without --worker-socket, the daemon starts the privileged worker
itself (corral worker --socket STATE/worker.sock --projects-root STATE/projects)
and restarts it with backoff if it dies. With --worker-socket it uses that
worker. Otherwise it has no privileged transport: host projects work, managed
calls answer 503 "no privileged transport in this process".

With --sites-domain D, site NAME is served at the origin NAME.D (requests
whose Host is NAME.D, on any listener; point a wildcard DNS name *.D at the
TCP listener or at a TLS proxy in front of it): browsers open it through a
signed URL (POST /v1/projects/ID/sites/NAME/url) and the API refuses every
Host under D. /sites/NAME/ paths then work on the Unix socket only.

Logs are JSON on stderr. SIGTERM or SIGINT shuts down gracefully.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dir, err := stateDir(state)
			if err != nil {
				return err
			}
			cfg.StateDir = dir
			if cfg.Store, err = storeURL(storeFlagValue, dir); err != nil {
				return err
			}
			if cfg.LSPServers, err = parseLSPServers(lspServers); err != nil {
				return err
			}
			for _, p := range cfg.Export.AllowedRemotes {
				if err := export.ValidRemotePattern(p); err != nil {
					return fmt.Errorf("--export-remote: %w", err)
				}
			}
			for _, c := range allowCIDRs {
				pfx, err := netip.ParsePrefix(c)
				if err != nil {
					return fmt.Errorf("--git-import-allow-cidr %q: %w", c, err)
				}
				cfg.GitImport.AllowCIDRs = append(cfg.GitImport.AllowCIDRs, pfx.Masked())
			}
			level := slog.LevelInfo
			if debug {
				level = slog.LevelDebug
			}
			cfg.Logger = slog.New(slog.NewJSONHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level}))
			cfg.WorkerLog = cmd.ErrOrStderr()
			cfg.SuperviseWorker = cfg.WorkerSocket == "" && os.Geteuid() == 0
			// The machines' default limits, for the supervised worker.
			if memory.set {
				cfg.WorkerArgs = append(cfg.WorkerArgs, "--memory", memory.String())
			}
			if pids != 0 {
				cfg.WorkerArgs = append(cfg.WorkerArgs, "--pids", strconv.FormatInt(pids, 10))
			}
			if cpus != 0 {
				cfg.WorkerArgs = append(cfg.WorkerArgs, "--cpus", strconv.FormatFloat(cpus, 'f', -1, 64))
			}
			if tmp.set {
				cfg.WorkerArgs = append(cfg.WorkerArgs, "--tmp", tmp.String())
			}
			if disk.set {
				cfg.WorkerArgs = append(cfg.WorkerArgs, "--disk", disk.String())
			}
			// Owners may lower them, not lift them.
			cfg.OwnerLimits = api.Limits{Memory: memory.n, Pids: pids, CPUMillis: cpuMillis(cpus), Tmp: tmp.n, Disk: disk.n}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return daemon.Run(ctx, cfg)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&state, "state", "", "state `DIR` (default $XDG_STATE_HOME/corral)")
	storeFlag(fl, &storeFlagValue)
	fl.StringVar(&cfg.Listen, "listen", "", "also serve on this TCP `ADDR` (host:port)")
	fl.StringVar(&cfg.MetricsListen, "metrics-listen", "", "serve GET /metrics alone, unauthenticated, on this TCP `ADDR` (on --listen it needs an administrator's token)")
	fl.StringVar(&cfg.Socket, "socket", "", "serve the API on the Unix socket `PATH` (default STATE/corral.sock; replicas sharing STATE need one each)")
	fl.StringVar(&cfg.Replica, "replica", "", "this daemon's `NAME` among the replicas of one store: its leases' holder, named when another replica is asked for its background processes (default \"pid N on HOST\")")
	fl.StringVar(&cfg.WorkerSocket, "worker-socket", "", "use the running worker at `PATH` instead of starting one")
	fl.StringSliceVar(&cfg.Admins, "admin", nil, "account `NAME` allowed to create accounts and tokens over HTTP (repeatable)")
	fl.BoolVar(&cfg.AllowHostPaths, "allow-host-paths", false, "accept host paths over HTTP (host projects, --from copies, file:// git URLs, trusted members) from accounts granted them (corral account grant host-paths NAME)")
	fl.StringVar(&cfg.Export.TokenFile, "export-token-file", "", "`FILE` holding the token GitHub export pushes with (used only by host git, never inside a machine)")
	fl.StringVar(&cfg.Export.Username, "export-username", "", "user name sent with the export token (default x-access-token)")
	fl.StringArrayVar(&cfg.Export.AllowedRemotes, "export-remote", nil, "allow export to remotes matching `PATTERN` (host[:port]/path, * per segment, /** for any depth, e.g. 'github.com/org/*'; repeatable; none refuses every export)")
	fl.StringArrayVar(&allowCIDRs, "git-import-allow-cidr", nil, "let git imports (project creation from a git URL) reach the non-public address range `CIDR` (repeatable; default public addresses only)")
	fl.BoolVar(&cfg.Export.AllowInsecure, "export-allow-insecure", false, "let export push to http, file:// and local-path remotes")
	fl.StringArrayVar(&lspServers, "lsp-server", nil, "language server `NAME=COMMAND LINE` run inside machines (repeatable; default gopls)")
	fl.StringSliceVar(&cfg.DisabledPlugins, "disable-plugin", nil, "built-in plugin `NAME` not to load: sandbox, sites, editor, lsp (repeatable)")
	fl.StringArrayVar(&cfg.EgressAllowCIDRs, "egress-allow-cidr", nil, "let proxy-mode machines reach the floor range `CIDR` (loopback, private, link-local, CGNAT, metadata and the host's addresses are refused by default; repeatable; e.g. 127.0.0.0/8 for tests)")
	fl.Var(&limitFlag{p: &cfg.Budget.CapturedBytes, size: true}, "max-captured", "captured output `SIZE` all running commands may hold together: the sum of their output limits (default 1GiB; unlimited)")
	fl.Var(&limitFlag{p: &cfg.AccountBudget.CapturedBytes, size: true}, "account-max-captured", "captured output `SIZE` one account's running commands may hold (default 512MiB; unlimited)")
	fl.Var(intLimit(&cfg.Budget.Commands), "max-commands", "concurrent commands of all accounts (`N`, default 256; unlimited)")
	fl.Var(intLimit(&cfg.AccountBudget.Commands), "account-max-commands", "concurrent commands of one account (`N`, default 64; unlimited)")
	fl.Var(intLimit(&cfg.Budget.Sessions), "max-sessions", "concurrent sessions (WebSocket, LSP) of all accounts (`N`, default 1024; unlimited)")
	fl.Var(intLimit(&cfg.AccountBudget.Sessions), "account-max-sessions", "concurrent sessions of one account (`N`, default 128; unlimited)")
	fl.Var(&limitFlag{p: &cfg.MemoryLimit, size: true}, "memory-limit", "Go soft memory `SIZE` limit (default: --max-captured + 256MiB unless GOMEMLIMIT is set; unlimited leaves it alone)")
	fl.DurationVar(&cfg.MaxSessionLifetime, "max-session-lifetime", daemon.DefaultMaxSessionLifetime, "close sessions (WebSocket, LSP, proxied sites) this long after they opened (`DURATION`)")
	fl.IntVar(&cfg.MaxAccountProjects, "account-max-projects", daemon.DefaultMaxAccountProjects, "projects one account that is not an admin may own (`N`; each managed project takes one of the worker's id ranges; negative: unlimited)")
	fl.Var(&memory, "memory", "default memory limit per machine, for the supervised worker (default 1GiB)")
	fl.Int64Var(&pids, "pids", 0, "default task limit per machine, for the supervised worker (default 512)")
	fl.Float64Var(&cpus, "cpus", 0, "default CPU limit per machine in CPUs, for the supervised worker (default 1)")
	fl.Var(&tmp, "tmp", "default size of a machine's /tmp and /dev/shm, for the supervised worker (default 256MiB)")
	fl.Var(&disk, "disk", "default size of a machine's disk (its home), for the supervised worker (default none)")
	fl.StringVar(&cfg.Sites.Domain, "sites-domain", "", "serve site NAME at the origin NAME.`D` (by Host header; /sites/NAME/ paths stay on the Unix socket only)")
	fl.StringVar(&cfg.Sites.Scheme, "sites-scheme", "https", "scheme of signed site URLs: https (TLS in front of the daemon; Secure cookies) or http")
	fl.IntVar(&cfg.Sites.Port, "sites-port", 0, "`PORT` written in signed site URLs (default none: the scheme's)")
	fl.DurationVar(&cfg.Sites.URLTTL, "sites-url-ttl", daemon.DefaultSiteURLTTL, "default lifetime of a signed site URL (at most 1h)")
	fl.BoolVar(&debug, "debug", false, "log at debug level")
	return cmd
}

// parseLSPServers parses --lsp-server NAME=COMMAND LINE values (the command
// line is split on white space; no shell is involved).
func parseLSPServers(vals []string) (map[string][]string, error) {
	if len(vals) == 0 {
		return nil, nil
	}
	out := make(map[string][]string, len(vals))
	for _, v := range vals {
		name, cmdline, ok := strings.Cut(v, "=")
		argv := strings.Fields(cmdline)
		if !ok || strings.TrimSpace(name) == "" || len(argv) == 0 {
			return nil, fmt.Errorf("--lsp-server %q: want NAME=COMMAND LINE", v)
		}
		out[strings.TrimSpace(name)] = argv
	}
	return out, nil
}

// limitFlag is a pflag.Value for a budget: a positive count (or size, with
// size set) or "unlimited" (stored as -1, which daemon.Config reads as no
// limit).
type limitFlag struct {
	p    *int64
	size bool
}

func (f *limitFlag) String() string {
	if f.p == nil || *f.p == 0 {
		return ""
	}
	if *f.p < 0 {
		return "unlimited"
	}
	return strconv.FormatInt(*f.p, 10)
}

func (f *limitFlag) Set(s string) error {
	if s == "unlimited" {
		*f.p = -1
		return nil
	}
	var n int64
	var err error
	if f.size {
		n, err = parseSize(s)
	} else if n, err = strconv.ParseInt(s, 10, 64); err == nil && n <= 0 {
		err = fmt.Errorf("%q is not a positive number", s)
	}
	if err != nil {
		return err
	}
	*f.p = n
	return nil
}

func (f *limitFlag) Type() string {
	if f.size {
		return "size"
	}
	return "count"
}

// intLimit is a limitFlag for an int budget.
type intLimitFlag struct {
	p *int
	v int64
}

func intLimit(p *int) *intLimitFlag { return &intLimitFlag{p: p} }

func (f *intLimitFlag) String() string {
	return (&limitFlag{p: &f.v}).String()
}

func (f *intLimitFlag) Set(s string) error {
	if err := (&limitFlag{p: &f.v}).Set(s); err != nil {
		return err
	}
	*f.p = int(f.v)
	return nil
}

func (f *intLimitFlag) Type() string { return "count" }
