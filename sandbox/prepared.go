package sandbox

import (
	"context"
	"io"
	"sync"
	"syscall"
	"time"

	"github.com/corral-sandbox/corral/confine"
)

// Lease is a provider-side claim on a project for one piece of work. It is
// minted by preparation before anything starts; whoever holds the work
// heartbeats it (RunCommand and a Session do, every five seconds); a lease whose
// heartbeats stop for its TTL is expired and its work cancelled.
type Lease interface {
	ID() string
	AccountUserID() int64
	Kind() LeaseKind
	// Heartbeat extends the lease. It fails if the lease expired or was
	// released, or the lease store cannot be reached.
	Heartbeat(ctx context.Context) error
	// Release ends the lease. It is idempotent; releasing a lease that
	// already expired reports an error rather than hiding it.
	Release(ctx context.Context) error
}

// KeepAliver is implemented by leases that can heartbeat themselves more
// cheaply than one call per interval from each holder (the lease manager
// batches all of its leases in one loop). RunCommand uses it when the lease
// has it.
type KeepAliver interface {
	// KeepAlive heartbeats the lease every interval until stop is called.
	// If a heartbeat fails, failed is called once and the lease is no
	// longer kept alive; failed must not block or call stop. stop blocks
	// until failed is no longer running and will not be called.
	KeepAlive(interval time.Duration, failed func(error)) (stop func())
}

// Provider prepares executions. It checks tenancy and confinement, mints a
// lease and describes what to run; it never runs anything itself.
type Provider interface {
	// PrepareExecution returns a *LocalPrepared for a host project or a
	// *ManagedPrepared for a managed project. A refusal is an error; the
	// caller starts nothing and there is nothing to clean up.
	PrepareExecution(ctx context.Context, in ExecInput, actor Actor) (Prepared, error)
}

// Prepared is the sealed union of prepared executions: *LocalPrepared or
// *ManagedPrepared. No other type implements it.
type Prepared interface {
	Common() *PreparedCommon
	sealed()
}

// PreparedCommon is the part every prepared execution carries.
type PreparedCommon struct {
	// Project is the project the provider prepared for; it must equal the
	// requested one.
	Project ProjectRef
	// Cwd is the working directory as the sandbox sees it (a host path for
	// host projects, a guest path for managed ones).
	Cwd string
	// DisplayCwd is Cwd as it may be shown to the actor (no host paths).
	DisplayCwd string
	// Lease covers the execution. It must belong to the actor and have the
	// requested kind.
	Lease Lease
	// Sanitize, if non-nil, is applied to decoded output before it leaves
	// RunCommand (results and partial output alike): host paths become
	// display paths, known secrets are redacted.
	Sanitize func(string) string
	// SanitizeHold, if non-nil, supports live output (RunOptions.OnOutput)
	// with a Sanitize: it returns how many trailing bytes of s might begin
	// text that Sanitize would rewrite once more bytes follow (a proper
	// prefix of a host path, or a whole one whose next byte decides), at
	// most len(s). Live output holds those bytes back until more arrive or
	// the stream ends. Nil with a non-nil Sanitize holds a stream's whole
	// live output until the stream ends.
	//
	// RunCommand also checks large results as they arrive, cut the same
	// way: if Sanitize returns every piece unchanged, the whole result is
	// taken to be unchanged and Sanitize is not called on it again (any
	// other result is sanitized whole). Sanitize must therefore rewrite
	// only text it finds, as a host path replacement does, never because
	// of text elsewhere in the output.
	SanitizeHold func(s string) int
}

// LocalMode says how a host command is launched.
type LocalMode string

const (
	// LocalConfined launches through corral's confinement (package
	// confine): Landlock restricts reads and writes to the system
	// directories and the roots, and, when corral is root, the command
	// runs as the project's own unprivileged user in namespaces of its own.
	LocalConfined LocalMode = "confined"
	// LocalDirect launches the program unconfined (trusted actors only).
	LocalDirect LocalMode = "direct"
)

// Launch describes a host process. Path is the executable; Args is the full
// argv including argv[0]; Env is the complete environment (nothing is
// inherited); Dir is the working directory.
type Launch struct {
	Path string
	Args []string
	Env  []string
	Dir  string
	// ExecStatus says the launched program is corral's confinement helper,
	// which reports a failure to execute the target program as a message on
	// file descriptor 3 and closes it (close-on-exec) when exec succeeds.
	// Core then reports that failure as KindStart, never as an exit code.
	ExecStatus bool
	// Confine, if non-nil, describes the confinement of a confined launch
	// and the program it confines. Path, Args and ExecStatus still describe
	// the helper's invocation, for a consumer that starts Launch as a
	// process; RunCommand and Open instead start Confine's program, forked
	// from a thread restricted exactly as the helper restricts itself
	// (confine.Start), which saves the helper's start of a Go runtime. Set
	// only with LocalConfined.
	Confine *Confinement
}

// Confinement is a program and what it may do, as corral's confinement
// helper (package confine) enforces it: read and execute beneath the
// system directories, Readable and Writable, write beneath Writable and to
// the harmless devices, no TCP unless Network, and, with User, run as that
// unprivileged user with no capability in a pid namespace of its own.
type Confinement struct {
	// Path is the program, already resolved as the helper would resolve
	// Args[0] with the launch's PATH.
	Path string
	// Args is the program's full argv.
	Args []string
	// Writable are absolute directories.
	Writable []string
	// Readable are further absolute directories it may read.
	Readable []string
	// Network lets it use the host's network.
	Network bool
	// User, if non-nil, is the unprivileged host user it runs as (the
	// starting process must be root); Init is then corral's executable,
	// the init of its pid namespace (see confine.Policy).
	User *confine.User
	Init string
}

// Policy returns c as a confine.Policy.
func (c *Confinement) Policy() confine.Policy {
	return confine.Policy{Writable: c.Writable, Readable: c.Readable, Network: c.Network, User: c.User, Init: c.Init}
}

// LocalPrepared is a host project's prepared execution (direct or
// confined). Core starts Launch in its own process group; cancelling kills
// the group (and, for a confined launch with a User, its whole pid
// namespace) and then calls Cancel.
type LocalPrepared struct {
	PreparedCommon
	Mode   LocalMode
	Launch Launch
	// Stdin is written to the command's standard input before
	// RunOptions.Stdin, if any; then the input is closed. Nil means an
	// empty input.
	Stdin []byte
	// Cancel, if non-nil, releases whatever the provider holds for this
	// execution beyond the process group (which core kills itself). It is
	// called at most once, only when the command is cancelled.
	Cancel func(ctx context.Context) error
}

// ManagedPrepared is a managed project's prepared execution: nothing runs
// until Start.
type ManagedPrepared struct {
	PreparedCommon
	// Start starts the command inside the project's machine and returns its
	// session. A program that cannot be executed fails with an error
	// wrapping ErrNotStarted (from Start or from the session's Wait).
	Start func(ctx context.Context) (*ManagedExecutionSession, error)
	// Cancel kills the session's whole process tree. It is idempotent and
	// may be called before Start.
	Cancel func(ctx context.Context) error
	// Stdin is written to the session's standard input before
	// RunOptions.Stdin, if any; then the input is closed. Nil means an
	// empty input.
	Stdin []byte
}

// Common returns the common part.
func (p *LocalPrepared) Common() *PreparedCommon { return &p.PreparedCommon }

// Common returns the common part.
func (p *ManagedPrepared) Common() *PreparedCommon { return &p.PreparedCommon }

func (*LocalPrepared) sealed()   {}
func (*ManagedPrepared) sealed() {}

// ManagedExecutionSession is a running managed command: its standard
// streams and its settlement. Managed consumers use only this contract.
type ManagedExecutionSession struct {
	// Stdin is the command's standard input; closing it delivers EOF.
	Stdin io.WriteCloser
	// Stdout and Stderr are the command's output streams; they reach EOF
	// when every process holding them has ended.
	Stdout io.ReadCloser
	Stderr io.ReadCloser
	// Resize, set for a terminal session (ExecInput.TTY), changes the
	// terminal's size; nil otherwise.
	Resize func(rows, cols uint16) error
	// Signal, if non-nil, sends sig to every process of the command's
	// tree (the main process and whatever it forked, wherever they moved
	// to in its process group or pid namespace), not only the main
	// process; it does not wait for them to end. Nil means the provider
	// cannot signal a tree (cancelling still kills it).
	Signal func(sig syscall.Signal) error

	done   <-chan struct{}
	result func() (Exit, error) // NewManagedSessionOn's; nil: settle sets exit and err
	once   sync.Once
	exit   Exit
	err    error
}

// NewManagedSession returns a session over the given streams and the
// function that settles it. Providers call settle exactly once, with the
// observed exit or an error (wrapping ErrNotStarted or ErrTransport); later
// calls are ignored.
func NewManagedSession(stdin io.WriteCloser, stdout, stderr io.ReadCloser) (s *ManagedExecutionSession, settle func(Exit, error)) {
	done := make(chan struct{})
	s = &ManagedExecutionSession{Stdin: stdin, Stdout: stdout, Stderr: stderr, done: done}
	return s, func(e Exit, err error) {
		s.once.Do(func() {
			s.exit, s.err = e, err
			close(done)
		})
	}
}

// NewManagedSessionOn returns a session over the given streams that settles
// when done is closed: result then says how it ended (the observed exit, or
// an error wrapping ErrNotStarted or ErrTransport). result is called once,
// by the first Wait after done is closed; core calls Wait once done is
// closed on every path, whatever ended the session, so result may also
// release what the provider holds for the session. Unlike NewManagedSession
// it needs no goroutine of the provider's waiting to settle the session.
func NewManagedSessionOn(stdin io.WriteCloser, stdout, stderr io.ReadCloser, done <-chan struct{}, result func() (Exit, error)) *ManagedExecutionSession {
	return &ManagedExecutionSession{Stdin: stdin, Stdout: stdout, Stderr: stderr, done: done, result: result}
}

// Done is closed when the session has settled.
func (s *ManagedExecutionSession) Done() <-chan struct{} { return s.done }

// Wait blocks until the session settles and returns how its main process
// ended, or why that cannot be known. It may be called any number of times.
// Whoever started the session (core, for every session it runs) calls it
// once the session is done, on every path: a session made by
// NewManagedSessionOn releases the provider's resources then.
func (s *ManagedExecutionSession) Wait() (Exit, error) {
	<-s.done
	if s.result != nil {
		s.once.Do(func() { s.exit, s.err = s.result() })
	}
	return s.exit, s.err
}
