package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/core"
	"github.com/corral-sandbox/corral/lease"
	"github.com/corral-sandbox/corral/machine"
)

// InheritedFD is the descriptor on which Start passes the runner its
// connection to the worker (the first of exec.Cmd.ExtraFiles), announced
// with --worker-fd 3.
const InheritedFD = 3

// Exit statuses of `corral runner` (pinned). Usage errors exit 2, as for
// every corral command.
const (
	// ExitOK: every command of the job was run and reported.
	ExitOK = 0
	// ExitFailure: the job could not be run at all — malformed job, a
	// database that is missing or of another schema version, an unusable
	// inherited descriptor, no sandbox provider. The reason is on stderr
	// and nothing was reported on stdout.
	ExitFailure = 1
	// ExitAbandoned: the parent went away (stdin reached EOF, SIGTERM or
	// SIGINT) before the job finished. The running command was cancelled
	// and no further command was started.
	ExitAbandoned = 3
)

var (
	// ErrAbandoned is returned (wrapped) by Run when the job was given up
	// before it finished: stdin reached EOF (the parent is gone) or ctx
	// ended.
	ErrAbandoned = errors.New("runner: job abandoned")
	// ErrBadJob is returned (wrapped) by Run for a job that is not valid
	// JSON, has unknown fields, or exceeds MaxJobBytes.
	ErrBadJob = errors.New("runner: malformed job")
	// errParentGone is the cancellation cause when stdin reaches EOF.
	errParentGone = errors.New("stdin closed: the parent is gone")
)

// Options configure NewCore, Run and Main.
type Options struct {
	// StorePath is the store (a store URL or an SQLite file's path). It
	// must exist with exactly the schema version this binary knows: a
	// runner never migrates.
	StorePath string
	// StateDir is the state directory (core.Options.StateDir).
	StateDir string
	// Transport reaches the worker; a runner's is the inherited connection
	// (see InheritedTransport). If nil, managed commands fail with
	// machine.ErrNoPrivilegedTransport; host commands still run.
	Transport machine.PrivilegedTransport
	// WorkerFD, if positive, is the inherited descriptor holding the
	// worker connection; Main turns it into Transport (InheritedTransport)
	// when Transport is nil. Zero means none: a descriptor is never
	// guessed, since the Go runtime itself opens low descriptors.
	WorkerFD int
	// LeaseTTL is the TTL of the leases the runner acquires: how long its
	// commands may outlive it when it dies without releasing them. Zero
	// means lease.DefaultTTL. Heartbeats are sent every third of it (at
	// most every sandbox.DefaultHeartbeatInterval).
	LeaseTTL time.Duration
	// SelfExe is corral's executable, for the confinement helper of host
	// commands. Empty means os.Executable().
	SelfExe string
	// Logger receives diagnostics; nil means slog.Default().
	Logger *slog.Logger
	// Stdin carries the job, then stays open while the parent lives. Main
	// uses os.Stdin when nil; Run requires it.
	Stdin io.Reader
	// Stdout receives one JSON line per command. Main uses os.Stdout when
	// nil; Run requires it.
	Stdout io.Writer
}

// NewCore builds the core a runner uses: from opts.StorePath, never
// migrating (a schema of another version is refused with an error matching
// store.ErrSchemaMismatch), with opts.Transport as its only way to the
// worker, with no plugin services (Services is nil) and with the sandbox
// plugin alone, so the Sites control and every other domain are absent.
// Its leases are of opts.LeaseTTL and name this process as their holder.
// The caller must Close it.
func NewCore(ctx context.Context, opts Options) (*core.Core, error) {
	ttl := opts.LeaseTTL
	if ttl <= 0 {
		ttl = lease.DefaultTTL
	}
	host, _ := os.Hostname()
	return core.Build(ctx, core.Options{
		StorePath:           opts.StorePath,
		StateDir:            opts.StateDir,
		Migrate:             false,
		PrivilegedTransport: opts.Transport,
		SelfExe:             opts.SelfExe,
		Lease: lease.Options{
			TTL:           ttl,
			SweepInterval: min(lease.DefaultSweepInterval, ttl),
			// A runner holds one lease at a time: nothing to batch, and a
			// short TTL must not wait for a batching window.
			HeartbeatWindow: -1,
			Holder:          fmt.Sprintf("corral runner pid %d on %s", os.Getpid(), host),
		},
		Logger:  opts.Logger,
		Plugins: []core.PluginFactory{core.SandboxPlugin},
	})
}

// InheritedTransport returns the transport over the worker connection
// inherited on descriptor fd, taking ownership of that descriptor (it is
// closed; the transport holds a close-on-exec copy, so commands the runner
// starts never inherit it). A descriptor that is not open, or not a
// connected SOCK_SEQPACKET Unix socket, is an error.
func InheritedTransport(fd int) (machine.PrivilegedTransport, error) {
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
		return nil, fmt.Errorf("runner: worker connection on descriptor %d: %w", fd, err)
	}
	t, err := machine.ConnTransportFromFile(os.NewFile(uintptr(fd), "worker-connection"))
	if err != nil {
		return nil, fmt.Errorf("runner: descriptor %d: %w", fd, err)
	}
	return t, nil
}

// Run reads one job from opts.Stdin, builds the runner core (NewCore) and
// runs the job's commands in order through the sandbox control's
// RunCommand with lease kind "runner", writing one Result line per command
// to opts.Stdout as soon as it settles. It returns nil when every command
// was reported.
//
// After the job, Run keeps reading opts.Stdin: EOF (or a read error) means
// the parent is gone. Then, or when ctx ends, Run cancels the running
// command (RunCommand cancels it and releases its lease), writes nothing
// more, starts nothing more and returns an error wrapping ErrAbandoned.
// The goroutine reading opts.Stdin ends only at EOF or a read error; Run
// does not wait for it.
//
// Errors before any command ran wrap ErrBadJob (malformed job),
// ErrAbandoned (stdin closed before a whole job arrived),
// store.ErrSchemaMismatch (a database of another version) or
// sandbox.ErrUnavailable; nothing is written to opts.Stdout then.
func Run(ctx context.Context, opts Options) error {
	if opts.Stdin == nil || opts.Stdout == nil {
		return errors.New("runner: Run needs Stdin and Stdout")
	}
	job, rest, err := readJob(opts.Stdin)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		_, _ = io.Copy(io.Discard, rest)
		cancel(errParentGone)
	}()

	c, err := NewCore(ctx, opts)
	if err != nil {
		if ctx.Err() != nil {
			return abandoned(ctx, err)
		}
		return err
	}
	defer c.Close()
	ctl, err := c.Sandbox()
	if err != nil {
		return fmt.Errorf("runner: %w", err)
	}
	enc := json.NewEncoder(opts.Stdout)
	enc.SetEscapeHTML(false)
	for i, jc := range job.Commands {
		if ctx.Err() != nil {
			return abandoned(ctx, fmt.Errorf("%d of %d commands reported", i, len(job.Commands)))
		}
		res, err := ctl.RunCommand(ctx, job.input(jc), &job.Actor, jc.options())
		if ctx.Err() != nil {
			// The parent is gone: nobody reads this result.
			return abandoned(ctx, fmt.Errorf("command %d cancelled", i+1))
		}
		if err := enc.Encode(resultOf(res, err)); err != nil {
			return fmt.Errorf("%w: write result %d: %w", ErrAbandoned, i+1, err)
		}
	}
	return nil
}

// abandoned wraps ErrAbandoned with why.
func abandoned(ctx context.Context, detail error) error {
	return fmt.Errorf("%w (%v): %w", ErrAbandoned, context.Cause(ctx), detail)
}

// readJob decodes one JSON job from r and returns the reader of whatever
// follows it.
func readJob(r io.Reader) (*Job, io.Reader, error) {
	dec := json.NewDecoder(io.LimitReader(r, MaxJobBytes))
	dec.DisallowUnknownFields()
	var job Job
	if err := dec.Decode(&job); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, nil, fmt.Errorf("%w: stdin closed before a whole job arrived", ErrAbandoned)
		}
		return nil, nil, fmt.Errorf("%w: %w", ErrBadJob, err)
	}
	return &job, io.MultiReader(dec.Buffered(), r), nil
}

// Main is the body of `corral runner`: it runs Run with the inherited
// worker connection (InheritedTransport of opts.WorkerFD, unless
// opts.Transport is set or WorkerFD is zero) and
// os.Stdin/os.Stdout (unless set), writes a failure's reason to os.Stderr,
// and returns the exit status (ExitOK, ExitFailure or ExitAbandoned).
//
// For its duration SIGTERM and SIGINT abandon the job — SIGTERM is the
// parent-death signal Start arranges — and SIGPIPE is caught, so a write to
// a parent that is gone fails instead of killing the runner before it
// cleaned up. Commands the runner starts get default signal dispositions.
func Main(ctx context.Context, opts Options) int {
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	pipe := make(chan os.Signal, 1)
	signal.Notify(pipe, syscall.SIGPIPE)
	defer signal.Stop(pipe)

	if opts.Transport == nil && opts.WorkerFD > 0 {
		t, err := InheritedTransport(opts.WorkerFD)
		if err != nil {
			fmt.Fprintf(os.Stderr, "corral runner: %v\n", err)
			return ExitFailure
		}
		opts.Transport = t
	}
	if opts.Stdin == nil {
		opts.Stdin = os.Stdin
	}
	if opts.Stdout == nil {
		opts.Stdout = os.Stdout
	}
	err := Run(ctx, opts)
	switch {
	case err == nil:
		return ExitOK
	case errors.Is(err, ErrAbandoned):
		fmt.Fprintf(os.Stderr, "corral runner: %v\n", err)
		return ExitAbandoned
	default:
		fmt.Fprintf(os.Stderr, "corral runner: %v\n", err)
		return ExitFailure
	}
}
