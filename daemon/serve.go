package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"time"

	"github.com/corral-sandbox/corral/api"
	"github.com/corral-sandbox/corral/core"
	"github.com/corral-sandbox/corral/egress"
	"github.com/corral-sandbox/corral/export"
	"github.com/corral-sandbox/corral/internal/workerproc"
	"github.com/corral-sandbox/corral/lease"
	"github.com/corral-sandbox/corral/machine"
	"github.com/corral-sandbox/corral/plugin"
	"github.com/corral-sandbox/corral/projects"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/store"
)

// ShutdownTimeout bounds the graceful shutdown of Serve: requests in
// flight get this long to finish before their connections are closed.
const ShutdownTimeout = 30 * time.Second

// SocketMode is the mode of the daemon's Unix socket.
const SocketMode os.FileMode = 0o660

// ListenUnix listens on the Unix stream socket path with the given mode,
// replacing a stale socket file (one nobody accepts on). A socket some
// process still serves is refused.
func ListenUnix(path string, mode os.FileMode) (*net.UnixListener, error) {
	if st, err := os.Lstat(path); err == nil {
		if st.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("daemon: %s exists and is not a socket", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("daemon: %s is in use by a running daemon", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("daemon: remove stale socket: %w", err)
		}
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("daemon: %w", err)
	}
	if err := os.Chmod(path, mode); err != nil {
		ln.Close()
		return nil, fmt.Errorf("daemon: %w", err)
	}
	return ln, nil
}

// Serve serves h on every listener until ctx ends, then shuts down
// gracefully: it stops accepting, waits up to ShutdownTimeout for requests
// in flight, and closes the listeners. It returns nil after a shutdown
// caused by ctx, or the first listener's failure (after shutting the others
// down). Hijacked connections (sessions, proxied WebSockets) are not waited
// for: close the App for that.
func Serve(ctx context.Context, h http.Handler, lns []net.Listener, log *slog.Logger) error {
	if log == nil {
		log = slog.Default()
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	errc := make(chan error, len(lns))
	var wg sync.WaitGroup
	for _, ln := range lns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			log.Info("daemon listening", "addr", ln.Addr().String(), "network", ln.Addr().Network())
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("daemon: serve %s: %w", ln.Addr(), err)
			}
		}()
	}
	var serveErr error
	select {
	case <-ctx.Done():
		log.Info("daemon shutting down")
	case serveErr = <-errc:
		log.Error("daemon listener failed; shutting down", "err", serveErr)
	}
	sctx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn("graceful shutdown incomplete", "err", err)
		_ = srv.Close()
	}
	wg.Wait()
	return serveErr
}

// Config configures Run: the whole daemon process.
type Config struct {
	// StateDir holds corral.db, corral.sock, projects/ and worker/.
	// Required; it is created if missing and made mode 0700 (projects.StateDirMode)
	// either way.
	StateDir string
	// Store is the store URL (store.Open): "sqlite:PATH" or
	// "postgres://…". Empty means STATE/corral.db (store.DefaultURL).
	// Several daemons ("replicas") may serve one store: see
	// docs/daemon.md, "Replicas".
	Store string
	// Socket is the API's Unix socket. Empty means STATE/corral.sock.
	// Replicas sharing a state directory need one each.
	Socket string
	// Replica names this daemon in the leases it holds (their holder) and
	// in the answers other replicas give for what it owns (its background
	// processes). Empty means "pid N on HOST".
	Replica string
	// Listen, if non-empty, is a TCP address served besides the socket.
	// There, /metrics needs an administrator's bearer token.
	Listen string
	// MetricsListen, if non-empty, is a TCP address that serves GET
	// /metrics only, without authentication (bind it to a private
	// interface for Prometheus).
	MetricsListen string
	// WorkerSocket, if non-empty, is the socket of a running worker: the
	// daemon uses it and starts none.
	WorkerSocket string
	// SuperviseWorker starts and supervises `WorkerExe worker …` when
	// WorkerSocket is empty (the daemon must be root). If false and
	// WorkerSocket is empty, the daemon has no privileged transport:
	// host projects work, managed calls answer 503.
	SuperviseWorker bool
	// WorkerArgs are more arguments for the supervised worker (the
	// machines' default limits: --memory, --pids, --cpus, --tmp).
	WorkerArgs []string
	// WorkerExe is the corral executable run as the worker; empty means
	// os.Executable().
	WorkerExe string
	// Admins and AllowHostPaths are passed to AppOptions.
	Admins         []string
	AllowHostPaths bool
	// OwnerLimits are the machines' default limits (those WorkerArgs
	// give the supervised worker): the most a project owner who is not an
	// admin may set (AppOptions.OwnerLimits).
	OwnerLimits api.Limits
	// MaxAccountProjects is AppOptions.MaxAccountProjects.
	MaxAccountProjects int
	// Export configures GitHub export (the host-side push credential, the
	// allowed remotes).
	Export export.Options
	// GitImport configures clones of projects created from git URLs.
	GitImport projects.GitImportOptions
	// Sites configures sites on their own origins (AppOptions.Sites).
	Sites SitesOptions
	// LSPServers configures language servers by name (core.Options).
	LSPServers map[string][]string
	// EgressAllowCIDRs open ranges of the egress floor (core.EgressOptions).
	EgressAllowCIDRs []string
	// DisabledPlugins names built-in plugins not to load (their domains
	// resolve as absent: "sandbox" makes every command answer 503, "sites"
	// makes the Sites gateway answer 503 with that reason).
	DisabledPlugins []string
	// Lease tunes the lease manager (TTL, sweep interval); the zero value
	// means the defaults (15 s, 3 s). A shorter TTL shortens the heartbeat
	// interval of commands and sessions to a third of it.
	Lease lease.Options
	// Logger receives the daemon's logs (JSON in production); nil means
	// slog.Default(). WorkerLog receives the supervised worker's stderr;
	// nil means os.Stderr.
	Logger    *slog.Logger
	WorkerLog io.Writer
	// Ready, if non-nil, is called once the daemon listens.
	Ready func(socket string)

	// MaxSessionLifetime ends a session (WebSocket, LSP, proxied site
	// connection) this long after it opened, with close code 1008. Zero
	// means DefaultMaxSessionLifetime (24 h). Sessions also end within
	// about a second of their token's revocation, their account's
	// deletion or removal from the project.
	MaxSessionLifetime time.Duration

	// Budget bounds what every account together may have in flight (see
	// sandbox.Budget): the captured bytes of running commands (the sum of
	// their output limits), concurrent commands and concurrent sessions.
	// A zero field means its default (DefaultBudget: 1 GiB, 256 commands,
	// 1024 sessions); a negative field means unlimited. Work over the
	// budget is refused with 429 and Retry-After (in process: a prepare
	// error wrapping sandbox.ErrBusy), never queued.
	Budget sandbox.Budget
	// AccountBudget is the same per account. Zero fields mean
	// DefaultAccountBudget (512 MiB, 64 commands, 128 sessions).
	AccountBudget sandbox.Budget
	// MemoryLimit is the Go runtime's soft memory limit
	// (runtime/debug.SetMemoryLimit) that keeps garbage from doubling the
	// budgeted captured bytes. Zero means Budget.CapturedBytes plus
	// DefaultMemoryMargin (256 MiB) when the captured bytes are bounded and
	// GOMEMLIMIT is not set; negative leaves the runtime's limit alone.
	MemoryLimit int64
}

// Defaults of Config's budgets.
var (
	DefaultBudget        = sandbox.Budget{CapturedBytes: 1 << 30, Commands: 256, Sessions: 1024}
	DefaultAccountBudget = sandbox.Budget{CapturedBytes: 512 << 20, Commands: 64, Sessions: 128}
)

// DefaultMemoryMargin is what Config.MemoryLimit allows beyond the
// captured-bytes budget: the daemon's own heap, buffers, goroutines.
const DefaultMemoryMargin = 256 << 20

// budget applies the defaults: zero fields take def's, negative ones
// become unlimited (zero in sandbox.Budget).
func budget(b, def sandbox.Budget) sandbox.Budget {
	pick64 := func(v, d int64) int64 {
		switch {
		case v == 0:
			return d
		case v < 0:
			return 0
		}
		return v
	}
	pick := func(v, d int) int { return int(pick64(int64(v), int64(d))) }
	return sandbox.Budget{
		CapturedBytes: pick64(b.CapturedBytes, def.CapturedBytes),
		Commands:      pick(b.Commands, def.Commands),
		Sessions:      pick(b.Sessions, def.Sessions),
	}
}

// Run runs the daemon until ctx ends (SIGTERM in the CLI), then shuts
// down gracefully: stop accepting, let requests finish, cancel sessions,
// close the core, stop the supervised worker.
func Run(ctx context.Context, cfg Config) (err error) {
	if cfg.StateDir == "" {
		return errors.New("daemon: a state directory is required")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	state, err := filepath.Abs(cfg.StateDir)
	if err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	if err := projects.PrepareStateDir(state); err != nil {
		return err
	}
	metrics := NewMetrics()

	var transport machine.PrivilegedTransport
	var sup *workerproc.Supervisor
	switch {
	case cfg.WorkerSocket != "":
		transport = machine.SocketTransport{Path: cfg.WorkerSocket}
	case cfg.SuperviseWorker:
		if os.Geteuid() != 0 {
			return errors.New("daemon: supervising the worker needs root; pass --worker-socket instead")
		}
		exe := cfg.WorkerExe
		if exe == "" {
			if exe, err = os.Executable(); err != nil {
				return fmt.Errorf("daemon: %w", err)
			}
		}
		sock := filepath.Join(state, "worker.sock")
		if err := os.MkdirAll(projects.WorkspacesDir(state), 0o711); err != nil {
			return fmt.Errorf("daemon: %w", err)
		}
		sup = workerproc.StartSupervisor(workerproc.SupervisorOptions{
			Exe:    exe,
			Socket: sock,
			// Images beside the worker's state, where `corral image import
			// --state STATE` puts them; the daemon's workspaces belong to
			// their projects' own ids (--own-workspaces).
			Args: workerproc.Args{Socket: sock, ProjectsRoot: projects.WorkspacesDir(state), State: filepath.Join(state, "worker"),
				Images: filepath.Join(state, "images"), OwnWorkspaces: true, AllowUID: os.Geteuid(), Extra: cfg.WorkerArgs}.Argv(),
			Logger:  log,
			Stderr:  cfg.WorkerLog,
			OnStart: metrics.WorkerStarted,
		})
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err = errors.Join(err, sup.Stop(sctx))
		}()
		transport = machine.SocketTransport{Path: sock}
	default:
		log.Warn("no privileged transport in this process: managed projects answer 503 (run as root, or pass --worker-socket)")
	}

	limiter := &reclaimer{Limiter: sandbox.NewLimiter(budget(cfg.Budget, DefaultBudget), budget(cfg.AccountBudget, DefaultAccountBudget))}
	defer limiter.stop()
	if ml := cfg.MemoryLimit; ml >= 0 && os.Getenv("GOMEMLIMIT") == "" {
		if ml == 0 && limiter.Global.CapturedBytes > 0 {
			ml = limiter.Global.CapturedBytes + DefaultMemoryMargin
		}
		if ml > 0 {
			old := debug.SetMemoryLimit(ml)
			defer debug.SetMemoryLimit(old)
		}
	}
	log.Info("admission budgets", "global", limiter.Global, "perAccount", limiter.PerAccount)

	storeURL := cfg.Store
	if storeURL == "" {
		storeURL = store.DefaultURL(state)
	}
	if cfg.Replica != "" {
		cfg.Lease.Holder = cfg.Replica
	}
	c, err := core.Build(ctx, core.Options{
		StorePath:           storeURL,
		StateDir:            state,
		Migrate:             true,
		PrivilegedTransport: transport,
		Logger:              log,
		Control:             sandbox.ControlOptions{Observe: metrics.Observe, Admitter: limiter},
		Lease:               cfg.Lease,
		LSPServers:          cfg.LSPServers,
		PluginConfig:        plugin.Config{Disabled: cfg.DisabledPlugins},
		Egress: core.EgressOptions{AllowCIDRs: cfg.EgressAllowCIDRs,
			Service: egress.Options{Audit: metrics.ObserveEgress}},
	})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, c.Close()) }()
	app, err := BuildApp(c, AppOptions{StateDir: state, Logger: log, Metrics: metrics, Admins: cfg.Admins, AllowHostPaths: cfg.AllowHostPaths, OwnerLimits: cfg.OwnerLimits, MaxAccountProjects: cfg.MaxAccountProjects, Export: cfg.Export, GitImport: cfg.GitImport, Sites: cfg.Sites, MaxSessionLifetime: cfg.MaxSessionLifetime})
	if err != nil {
		return err
	}
	defer app.Close()

	sock := cfg.Socket
	if sock == "" {
		sock = filepath.Join(state, "corral.sock")
	}
	uln, err := ListenUnix(sock, SocketMode)
	if err != nil {
		return err
	}
	lns := []net.Listener{uln}
	if cfg.Listen != "" {
		tln, err := net.Listen("tcp", cfg.Listen)
		if err != nil {
			uln.Close()
			return fmt.Errorf("daemon: %w", err)
		}
		lns = append(lns, tln)
	}
	var metricsDone chan error
	if cfg.MetricsListen != "" {
		mln, err := net.Listen("tcp", cfg.MetricsListen)
		if err != nil {
			for _, ln := range lns {
				ln.Close()
			}
			return fmt.Errorf("daemon: metrics: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", metrics.Handler())
		metricsDone = make(chan error, 1)
		mctx, stop := context.WithCancel(ctx)
		defer stop()
		go func() { metricsDone <- Serve(mctx, mux, []net.Listener{mln}, log) }()
		defer func() {
			stop()
			err = errors.Join(err, <-metricsDone)
		}()
	}
	if cfg.Ready != nil {
		cfg.Ready(sock)
	}
	err = Serve(ctx, app, lns, log)
	app.Close()
	return err
}
