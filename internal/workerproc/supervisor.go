package workerproc

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// SupervisorOptions configure StartSupervisor.
type SupervisorOptions struct {
	// Exe and Args are the worker's program and its arguments (without
	// argv[0]).
	Exe  string
	Args []string
	// Socket is the worker's socket (which Args make it listen on): a
	// worker counts as started once it answers a protocol-2 handshake
	// there, within ReadyTimeout (zero: 60 s; a worker that is not ready
	// by then is killed and restarted).
	Socket       string
	ReadyTimeout time.Duration
	// Stderr receives the worker's stderr; nil means os.Stderr.
	Stderr io.Writer
	// Logger receives the supervisor's events; nil means slog.Default().
	Logger *slog.Logger
	// OnStart, if non-nil, is called each time a worker was started (it
	// answered its socket): metrics.
	OnStart func()
	// MinBackoff and MaxBackoff bound the delay before a restart, which
	// doubles after each quick death. Zero means 100 ms and 10 s. A worker
	// that ran for StableAfter (zero: 30 s) resets the delay.
	MinBackoff  time.Duration
	MaxBackoff  time.Duration
	StableAfter time.Duration
}

// Supervisor keeps one worker process running: it restarts it with
// backoff whenever it dies (the daemon's: its machine gateway reconnects
// by itself). The worker gets SIGTERM if this process dies (Pdeathsig). A
// worker that exits before it answers on its socket counts as a death.
type Supervisor struct {
	opts SupervisorOptions
	log  *slog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex
	proc   *Process
	starts int
}

// StartSupervisor starts the worker and supervises it until Stop.
func StartSupervisor(opts SupervisorOptions) *Supervisor {
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = 100 * time.Millisecond
	}
	if opts.MaxBackoff <= 0 {
		opts.MaxBackoff = 10 * time.Second
	}
	if opts.StableAfter <= 0 {
		opts.StableAfter = 30 * time.Second
	}
	if opts.ReadyTimeout <= 0 {
		opts.ReadyTimeout = 60 * time.Second
	}
	if opts.Stderr == nil {
		opts.Stderr = os.Stderr
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	s := &Supervisor{opts: opts, log: log.With("component", "worker-supervisor"), done: make(chan struct{})}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	go s.loop()
	return s
}

// Starts reports how many times the worker was started.
func (s *Supervisor) Starts() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.starts
}

// Pid returns the running worker's process id, or 0.
func (s *Supervisor) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return 0
	}
	return s.proc.Pid
}

func (s *Supervisor) loop() {
	defer close(s.done)
	backoff := s.opts.MinBackoff
	for s.ctx.Err() == nil {
		started := time.Now()
		p, err := Start(s.ctx, Options{
			Exe:          s.opts.Exe,
			Args:         s.opts.Args,
			Socket:       s.opts.Socket,
			Stdout:       s.opts.Stderr,
			Stderr:       s.opts.Stderr,
			Pdeathsig:    syscall.SIGTERM,
			ReadyTimeout: s.opts.ReadyTimeout,
		})
		if err == nil {
			s.mu.Lock()
			if s.ctx.Err() != nil { // Stop came between the start and now
				s.mu.Unlock()
				_ = p.Stop(context.Background())
				return
			}
			s.proc = p
			s.starts++
			s.mu.Unlock()
			if s.opts.OnStart != nil {
				s.opts.OnStart()
			}
			s.log.Info("worker started", "pid", p.Pid)
			<-p.Done() // Stop ends it
			err = p.Wait()
			s.mu.Lock()
			s.proc = nil
			s.mu.Unlock()
		}
		if s.ctx.Err() != nil {
			return
		}
		if time.Since(started) >= s.opts.StableAfter {
			backoff = s.opts.MinBackoff
		}
		s.log.Error("worker died; restarting", "err", err, "backoff", backoff)
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-s.ctx.Done():
			t.Stop()
			return
		}
		backoff = min(backoff*2, s.opts.MaxBackoff)
	}
}

// Stop stops supervising: it sends the worker SIGTERM (which stops its
// machines), waits for it to exit, and kills it if ctx ends first. It
// blocks until the worker is gone and may be called more than once.
func (s *Supervisor) Stop(ctx context.Context) error {
	s.mu.Lock()
	s.cancel() // a worker still starting is killed by Start
	p := s.proc
	s.mu.Unlock()
	var err error
	if p != nil && p.Stop(ctx) != nil {
		err = errors.New("workerproc: worker did not stop in time; killed")
	}
	<-s.done
	return err
}

// Args is a `corral worker` command line: the one place its flags are
// spelled for the processes that start one (the daemon's supervisor, the
// CLI's shared worker).
type Args struct {
	// Socket, ProjectsRoot, State and Images are the worker's --socket,
	// --projects-root, --state and --images (empty: not passed).
	Socket, ProjectsRoot, State, Images string
	// OwnWorkspaces: --own-workspaces (workspaces belong on the host to
	// their projects' own ids); GrantWorkspaces: --grant-workspaces.
	OwnWorkspaces, GrantWorkspaces bool
	// AllowUID, if not negative, is --allow-uid (a peer besides root).
	AllowUID int
	// ExitIdle, if positive, is --exit-idle, with IdleLock its
	// --idle-lock.
	ExitIdle time.Duration
	IdleLock string
	// Extra are more arguments, appended last (limits).
	Extra []string
}

// Argv returns the arguments (without argv[0]): "worker" and its flags.
func (a Args) Argv() []string {
	argv := []string{"worker"}
	flag := func(name, v string) {
		if v != "" {
			argv = append(argv, name, v)
		}
	}
	flag("--socket", a.Socket)
	flag("--projects-root", a.ProjectsRoot)
	flag("--state", a.State)
	flag("--images", a.Images)
	if a.OwnWorkspaces {
		argv = append(argv, "--own-workspaces")
	}
	if a.GrantWorkspaces {
		argv = append(argv, "--grant-workspaces")
	}
	if a.AllowUID >= 0 {
		flag("--allow-uid", strconv.Itoa(a.AllowUID))
	}
	if a.ExitIdle > 0 {
		flag("--exit-idle", a.ExitIdle.String())
		flag("--idle-lock", a.IdleLock)
	}
	return append(argv, a.Extra...)
}
