package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// DefaultHeartbeatInterval is how often RunCommand and a Session heartbeat
// a lease.
const DefaultHeartbeatInterval = 5 * time.Second

// ControlOptions tunes a Control. The zero value means the documented
// defaults.
type ControlOptions struct {
	// HeartbeatInterval is the lease heartbeat period of every command and
	// session. Zero means DefaultHeartbeatInterval (5 s). Tests shorten it.
	HeartbeatInterval time.Duration
	// CancelWait bounds how long RunCommand (or a Session's teardown)
	// waits for a cancelled command to end before it gives up, releases
	// the lease and reports a cleanup failure. Zero means 5 s.
	CancelWait time.Duration
	// DrainTimeout bounds how long RunCommand keeps reading output after the
	// main process ended, for descendants that still hold a stream open
	// (like exec.Cmd.WaitDelay), and how long a Session waits for its
	// caller to read its streams to their end before it closes them. Zero
	// means 2 s.
	DrainTimeout time.Duration
	// Domain is stamped on every Record (the registry's owner domain).
	Domain string
	// Observe, if non-nil, is called once for every RunCommand call that
	// reached preparation, after it settled: journal, metrics, audit.
	// Sessions (Open) are not observed: they are not commands.
	Observe func(Record)
	// Journal, if non-nil, is called for every RunCommand that was
	// validated and admitted, before its preparation (the record has no
	// lease yet); the entry it returns (if non-nil) records the command:
	// its start once the preparation was accepted (the lease is known),
	// before anything starts, and its end (see JournalEntry). It lets the
	// journal show commands in flight, so a crash leaves a trace.
	Journal func(Record) *JournalEntry
	// Logger receives diagnostics; nil means slog.Default().
	Logger *slog.Logger
	// Admitter, if non-nil, is asked before every RunCommand, Open and
	// PrepareExecution (see Admitter); it must be comparable (a pointer,
	// such as a *Limiter). Nil admits everything.
	Admitter Admitter
}

// JournalEntry records the end of a command whose start
// ControlOptions.Journal recorded.
type JournalEntry struct {
	// Intent, if non-nil, is carried by the preparation's context (see
	// JournalIntent): a provider that knows what it is may record the
	// command's start together with the lease it mints (one store write
	// instead of two).
	Intent any
	// Start, if non-nil, is called once the preparation was accepted (the
	// lease is known), before anything starts.
	Start func(Record)
	// Finish, if non-nil, is called once the command settled, whether or
	// not it was prepared, after its lease was released (or its release
	// failed), unless Release recorded the end.
	Finish func(Record)
	// Release, if non-nil, is used instead of Lease.Release for a command
	// that exited: it releases the lease l and records the end rec in one
	// step (one store write instead of two). rec is the settled result
	// without its output (Result's Stdout and Stderr are empty; the sizes
	// are set). journaled reports that rec was recorded: Finish is then
	// not called. err is the release's failure, as from Lease.Release
	// (the command then ends with a KindCleanup error, which Finish
	// records).
	Release func(ctx context.Context, l Lease, rec Record) (journaled bool, err error)
}

// journalKey is the context key of a JournalEntry's Intent.
type journalKey struct{}

// JournalIntent returns the journal's intent for the command whose
// preparation ctx is (JournalEntry.Intent), or nil. A provider that knows
// its type records the command's start with the command's lease.
func JournalIntent(ctx context.Context) any { return ctx.Value(journalKey{}) }

// Record describes one settled RunCommand call.
type Record struct {
	Domain      string
	Actor       Actor
	Input       ExecInput
	LeaseID     string
	Timeout     time.Duration
	Limit       OutputLimit
	Started     time.Time // zero if the command never started
	Ended       time.Time
	Result      *CommandResult
	Err         *CommandError
	StdoutBytes int64
	StderrBytes int64
}

// Control is the sandbox control consumers resolve: the provider's
// preparation plus core's RunCommand and Open. It is safe for concurrent
// use.
type Control struct {
	provider Provider
	opts     ControlOptions
}

// NewControl returns the control over provider p.
func NewControl(p Provider, opts ControlOptions) *Control {
	if opts.HeartbeatInterval <= 0 {
		opts.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if opts.CancelWait <= 0 {
		opts.CancelWait = 5 * time.Second
	}
	if opts.DrainTimeout <= 0 {
		opts.DrainTimeout = 2 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Control{provider: p, opts: opts}
}

// WithDomain returns a copy of c whose records are stamped with domain.
func (c *Control) WithDomain(domain string) *Control {
	cp := *c
	cp.opts.Domain = domain
	return &cp
}

// PrepareExecution resolves the actor (explicit, else the turn scope),
// validates the input, admits a session (ControlOptions.Admitter: a
// refusal is a KindPrepare error wrapping ErrBusy; the reservation is given
// back when the lease is first released), asks the provider to prepare and checks the returned
// target. On success the caller owns the prepared execution: it must
// heartbeat and release the lease, and cancel what it started. On a target
// mismatch the lease is released and an error returned.
func (c *Control) PrepareExecution(ctx context.Context, in ExecInput, actor *Actor) (Prepared, error) {
	a, err := resolveActor(ctx, actor)
	if err != nil {
		return nil, newError(KindPrepare, err, "%v", err)
	}
	if err := in.Validate(); err != nil {
		return nil, newError(KindPrepare, err, "%v", err)
	}
	release, ce := c.admit(ctx, Admission{Kind: AdmitSession, Account: a.AccountUserID})
	if ce != nil {
		return nil, ce
	}
	prep, err := c.provider.PrepareExecution(ctx, in, a)
	if err != nil {
		release()
		return nil, newError(KindPrepare, err, "preparation refused: %v", err)
	}
	if err := CheckTarget(in, a, prep); err != nil {
		release()
		ce := newError(KindPrepare, err, "%v", err)
		if prep != nil && prep.Common().Lease != nil {
			ce.Cleanup = releaseLease(ctx, prep.Common().Lease)
		}
		return nil, ce
	}
	// The session's reservation is given back with its lease.
	prep.Common().Lease = wrapAdmitted(prep.Common().Lease, release)
	return prep, nil
}

// CheckTarget validates a prepared execution against its request: the
// branch matches the project kind, the project is the one asked for, the
// lease exists, belongs to the actor and has the requested kind, and the
// branch is complete.
func CheckTarget(in ExecInput, actor Actor, p Prepared) error {
	if p == nil {
		return errors.New("provider returned no prepared execution")
	}
	c := p.Common()
	switch t := p.(type) {
	case *LocalPrepared:
		if in.Project.Kind != ProjectHost {
			return fmt.Errorf("provider prepared a local execution for a %s project", in.Project.Kind)
		}
		if t.Launch.Path == "" || len(t.Launch.Args) == 0 {
			return errors.New("provider prepared an empty launch")
		}
		if t.Mode != LocalConfined && t.Mode != LocalDirect {
			return fmt.Errorf("provider prepared unknown local mode %q", t.Mode)
		}
		if c := t.Launch.Confine; c != nil {
			if t.Mode != LocalConfined {
				return fmt.Errorf("provider prepared a %s launch with a confinement", t.Mode)
			}
			if c.Path == "" || len(c.Args) == 0 || len(c.Writable) == 0 {
				return errors.New("provider prepared an incomplete confinement")
			}
		}
	case *ManagedPrepared:
		if in.Project.Kind != ProjectManaged {
			return fmt.Errorf("provider prepared a managed execution for a %s project", in.Project.Kind)
		}
		if t.Start == nil || t.Cancel == nil {
			return errors.New("provider prepared a managed execution without Start and Cancel")
		}
	default:
		return fmt.Errorf("provider returned unknown prepared type %T", p)
	}
	if c.Project != in.Project {
		return fmt.Errorf("provider prepared project %s/%d, not %s/%d", c.Project.Kind, c.Project.ProjectID, in.Project.Kind, in.Project.ProjectID)
	}
	if c.Lease == nil {
		return errors.New("provider prepared no lease")
	}
	if c.Lease.AccountUserID() != actor.AccountUserID {
		return fmt.Errorf("lease %s belongs to account %d, not the actor %d", c.Lease.ID(), c.Lease.AccountUserID(), actor.AccountUserID)
	}
	if c.Lease.Kind() != in.LeaseKind {
		return fmt.Errorf("lease %s has kind %q, not %q", c.Lease.ID(), c.Lease.Kind(), in.LeaseKind)
	}
	return nil
}

func releaseLease(ctx context.Context, l Lease) error { return releaseWith(ctx, l, l.Release) }

// releaseWith releases l through release, which is given ctx without its
// cancellation and with a bound of its own.
func releaseWith(ctx context.Context, l Lease, release func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := release(ctx); err != nil {
		return fmt.Errorf("release lease %s: %w", l.ID(), err)
	}
	return nil
}
