package sandbox

import (
	"context"
	"fmt"
	"strings"

	"github.com/corral-sandbox/corral/api"
	"github.com/corral-sandbox/corral/internal/layout"
)

// LeaseKind says what a lease covers; see [api.LeaseKind]. Only the
// kinds declared there are accepted; any other is refused before a
// provider is contacted.
type LeaseKind = api.LeaseKind

// The lease kinds corral knows.
const (
	LeaseEditor   = api.LeaseEditor
	LeaseFiles    = api.LeaseFiles
	LeaseTerminal = api.LeaseTerminal
	LeaseGitHub   = api.LeaseGitHub
	LeaseLSP      = api.LeaseLSP
	LeaseRunner   = api.LeaseRunner
	LeaseProcess  = api.LeaseProcess
)

// ProjectKind says where a project's commands run.
type ProjectKind string

const (
	// ProjectManaged projects run inside their own machine, through the
	// privileged worker.
	ProjectManaged ProjectKind = "managed"
	// ProjectHost projects run on the host, rooted at a host directory,
	// confined by default.
	ProjectHost ProjectKind = "host"
)

// ProjectRef names the project a command runs in.
type ProjectRef struct {
	Kind      ProjectKind `json:"kind"`
	ProjectID int64       `json:"projectId"`
}

// The guest layout (one fact, package internal/layout): a project's root
// as its commands see it — where its workspace is mounted inside a managed
// project's machine, and what a host project's root is shown as
// (DisplayCwd, sanitized output) — and the home inside a machine.
const (
	GuestWorkspace = layout.Workspace
	GuestHome      = layout.Home
)

// CommandTypeArgv is the only command type: an executable and its arguments,
// never interpreted by a shell.
const CommandTypeArgv = api.CommandTypeArgv

// Command is what to run; see [api.Command].
type Command = api.Command

// ExecInput is one request to run a command in a project.
//
// Cwd is the working directory: for a host project a host path inside the
// project root or one of the actor's roots; for a managed project a guest
// path (an empty Cwd means the project's root, /workspace in a machine).
//
// User is who the command runs as in a managed project's machine: a user
// name of the machine's /etc/passwd or a numeric uid, optionally followed
// by ":" and a group name or gid. Empty means the machine's default user.
// Guest root holds at most Docker's default capabilities (without
// CAP_SETFCAP); every other user holds none. An unknown user fails the
// command's start (KindStart, nothing ran); a host project refuses a
// non-empty User at preparation (KindPrepare): host commands run as the
// caller.
//
// Env holds environment variables for the command, merged over the
// sandbox's defaults: for a managed project the machine's (PATH, HOME,
// LANG, TERM, USER, then the operator's), for a host project the minimal
// host environment (PATH, HOME, LANG, TERM, then the operator's). A
// variable given here wins over a default of the same name, PATH and HOME
// included: naming PATH changes where a bare program name is looked up.
// Nil or empty means the defaults alone. Names must be POSIX portable
// names ([A-Za-z_][A-Za-z0-9_]*), values must not contain NUL, and the
// names and values together must not exceed MaxEnvBytes; Validate refuses
// anything else. A provider may refuse names it cannot pass safely (a
// confined host command refuses the dynamic loader's LD_* variables).
type ExecInput struct {
	Command   Command           `json:"command"`
	Cwd       string            `json:"cwd"`
	User      string            `json:"user,omitempty"`
	LeaseKind LeaseKind         `json:"leaseKind"`
	Project   ProjectRef        `json:"project"`
	Env       map[string]string `json:"env,omitempty"`
	// TTY, when set, runs the command on a terminal of this initial size
	// (a managed project's: a pseudo-terminal inside its machine; a host
	// project's: one on the host): the session's Stdin and Stdout are the
	// terminal, its Stderr is empty, and Session.Resize (for a managed
	// preparation, ManagedExecutionSession.Resize) resizes it. It is for
	// sessions (Control.Open, see SessionOptions.TTY); RunCommand callers
	// leave it nil.
	TTY *TTYSize `json:"tty,omitempty"`
}

// TTYSize is a terminal's size in character cells.
type TTYSize = api.TTYSize

// MaxEnvBytes bounds ExecInput.Env: the sum over its variables of
// len(name)+len(value)+2. A managed command's whole request (argv, cwd and
// environment) must also fit one protocol frame (64 KiB).
const MaxEnvBytes = 32 << 10

// ValidEnvName reports whether name is a POSIX portable environment
// variable name: a letter or underscore, then letters, digits or
// underscores.
func ValidEnvName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c == '_', c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// validateEnv checks env's names, values and size.
func validateEnv(env map[string]string) error {
	n := 0
	for k, v := range env {
		if !ValidEnvName(k) {
			return fmt.Errorf("environment variable name %q is not valid (letters, digits and _, not starting with a digit)", k)
		}
		if strings.IndexByte(v, 0) >= 0 {
			return fmt.Errorf("environment variable %s contains a NUL byte", k)
		}
		n += len(k) + len(v) + 2
	}
	if n > MaxEnvBytes {
		return fmt.Errorf("environment is %d bytes, more than %d", n, MaxEnvBytes)
	}
	return nil
}

// Validate checks the input's shape. It does not check tenancy or paths;
// that is preparation's job.
func (in ExecInput) Validate() error {
	if in.Command.Type != CommandTypeArgv {
		return fmt.Errorf("command type %q is not supported (only %q)", in.Command.Type, CommandTypeArgv)
	}
	if in.Command.File == "" {
		return fmt.Errorf("command file is empty")
	}
	for _, s := range in.Command.Argv() {
		if strings.IndexByte(s, 0) >= 0 {
			return fmt.Errorf("command contains a NUL byte")
		}
	}
	if strings.IndexByte(in.Cwd, 0) >= 0 {
		return fmt.Errorf("cwd contains a NUL byte")
	}
	if strings.ContainsAny(in.User, "\x00\n") {
		return fmt.Errorf("user contains a NUL byte or a newline")
	}
	if err := validateEnv(in.Env); err != nil {
		return err
	}
	if !in.LeaseKind.Valid() {
		return fmt.Errorf("lease kind %q is not allowed", in.LeaseKind)
	}
	switch in.Project.Kind {
	case ProjectManaged, ProjectHost:
	default:
		return fmt.Errorf("project kind %q is not supported", in.Project.Kind)
	}
	if in.Project.ProjectID <= 0 {
		return fmt.Errorf("project id %d is not valid", in.Project.ProjectID)
	}
	return nil
}

// Actor is the account on whose behalf a command runs.
//
// Roots are additional host directories the actor may use as a working
// directory and write to, beyond the project root (host projects only).
// An explicit actor still passes preparation's confinement and tenancy
// rules: naming an actor grants nothing by itself.
type Actor struct {
	AccountUserID int64    `json:"accountUserId"`
	Roots         []string `json:"roots"`
}

type turnKey struct{}

// WithTurn returns a context whose turn scope is actor: RunCommand and
// PrepareExecution called with a nil actor act as this actor.
func WithTurn(ctx context.Context, actor Actor) context.Context {
	return context.WithValue(ctx, turnKey{}, actor)
}

// TurnActor returns the actor of ctx's turn scope, if any.
func TurnActor(ctx context.Context) (Actor, bool) {
	a, ok := ctx.Value(turnKey{}).(Actor)
	return a, ok
}

// resolveActor applies the actor rule: an explicit actor wins; a nil actor
// means the turn scope; no actor at all is refused.
func resolveActor(ctx context.Context, actor *Actor) (Actor, error) {
	if actor != nil {
		if actor.AccountUserID <= 0 {
			return Actor{}, fmt.Errorf("%w: actor account %d is not valid", ErrNoActor, actor.AccountUserID)
		}
		return *actor, nil
	}
	if a, ok := TurnActor(ctx); ok && a.AccountUserID > 0 {
		return a, nil
	}
	return Actor{}, ErrNoActor
}
