// Package editor is the built-in "editor" plugin: the editor's Git
// reads (status, log, diff, show) of a project, run inside the project's
// sandbox through the sandbox control's RunCommand with lease kind
// "editor", and parsed into JSON-ready values.
//
// The plugin provides the [*Editor] control in the "editor" domain and
// consumes "sandbox", which it resolves through its registry consumer at
// every call: an Editor never holds a sandbox control, so a sandbox plugin
// that is disabled or reloaded takes effect at once. [Serve] runs the read
// an HTTP request names, for the daemon, which answers its result and
// translates its classified errors ([Error]) at its edge.
//
// # Hardening
//
// Every git call runs as
//
//	env GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null ... \
//	    git -c core.fsmonitor=false -c core.hooksPath=/dev/null -c core.pager=cat \
//	        -c diff.external= -c core.sshCommand=false -c protocol.allow=never ... \
//	        -C <dir> --git-dir=.git --work-tree=. --no-pager --literal-pathspecs \
//	        --no-optional-locks <command> ...
//
// where <dir> is /workspace for a managed project and "." (the project root,
// the command's working directory) for a host project. The environment
// ignores the system and global configuration (a host project's HOME is its
// root, so a global ~/.gitconfig would be the project's own file), and the
// command-line configuration, which outranks the repository's, disables
// every setting that makes a read run a program: the file-system monitor,
// hooks, pagers, external diff, signature verification (log.showSignature),
// SSH and every transport. Diff and log pass --no-ext-diff and
// --no-textconv. Reads that compare the working tree (status, working-tree
// diffs) may run clean filters, so they first list the filter drivers
// configured for the repository (git config --get-regexp) and override each
// one's clean, smudge and process commands with nothing. The repository is
// the .git of the project directory itself (--git-dir): git never discovers
// a repository above the project root, and core.worktree cannot point a
// read outside it. Pathspecs are literal (--literal-pathspecs) and refs are
// passed after --end-of-options.
//
// Every output, including error messages, passes through corral's redactor
// (internal/redact), which removes among others the userinfo of anything
// URL-like (https://user:secret@host becomes https://[REDACTED]@host,
// https://bob:p@ss@host too), so credentials in remote URLs never
// reach a response. This also applies to file contents and diffs; Show and
// Diff report when it changed something.
//
// # Errors
//
// Methods return errors that wrap, for callers to branch on:
//   - [sandbox.ErrUnavailable]: no sandbox provider is loaded (HTTP 503);
//   - [sandbox.ErrDenied]: the actor is not a member of the project (403);
//   - [sandbox.ErrNotFound]: the project does not exist (404);
//   - [ErrBadInput]: an invalid ref, path, or option (400);
//   - [ErrUnknownRevision]: a ref or path that does not name an object (404);
//   - a [*sandbox.CommandError] of kind timeout, abort, transport or cleanup
//     when running git failed, and a [*GitError] when git itself failed.
//
// A project directory that is not a Git repository is a result, not an
// error: every result then has IsRepo false and nothing else.
package editor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/corral-sandbox/corral/plugin"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/store"
)

// Name is the plugin's name.
const Name = "editor"

// DefaultTimeout bounds each git command when Options.Timeout is zero.
const DefaultTimeout = 30 * time.Second

// Errors of the editor's reads.
var (
	// ErrBadInput reports an invalid ref, path or option given by the
	// caller. Nothing was run.
	ErrBadInput = errors.New("editor: bad input")
	// ErrUnknownRevision reports a ref that does not resolve, or a path
	// that does not exist at a ref.
	ErrUnknownRevision = errors.New("editor: unknown revision or path")
	// ErrNotFile reports a Show of a path that is not a file (a directory
	// or a submodule) at its ref.
	ErrNotFile = errors.New("editor: not a file")
)

// GitError reports a git command that exited unsuccessfully for a reason
// the editor does not translate. Stderr is redacted.
type GitError struct {
	// Command is the git subcommand ("status", "log", ...).
	Command string
	// Code is git's exit code; Signal the signal that ended it (exactly
	// one is set).
	Code   *int
	Signal string
	// Stderr is what git wrote to its standard error, redacted.
	Stderr string
}

func (e *GitError) Error() string {
	how := "was killed by " + e.Signal
	if e.Code != nil {
		how = "exited with code " + strconv.Itoa(*e.Code)
	}
	msg := strings.TrimSpace(e.Stderr)
	if len(msg) > 512 {
		msg = msg[:512] + "…"
	}
	return fmt.Sprintf("editor: git %s %s: %s", e.Command, how, msg)
}

// ProjectKindFunc looks up a project's kind. It returns an error wrapping
// sandbox.ErrNotFound when the project does not exist.
type ProjectKindFunc func(ctx context.Context, project int64) (sandbox.ProjectKind, error)

// StoreProjectKind returns a ProjectKindFunc reading projects from st.
func StoreProjectKind(st store.Store) ProjectKindFunc {
	return func(ctx context.Context, id int64) (sandbox.ProjectKind, error) {
		p, err := st.GetProject(ctx, id)
		if errors.Is(err, store.ErrNotFound) {
			return "", fmt.Errorf("editor: project %d: %w", id, sandbox.ErrNotFound)
		}
		if err != nil {
			return "", fmt.Errorf("editor: look up project %d: %w", id, err)
		}
		return sandbox.ProjectKind(p.Kind), nil
	}
}

// Options configure the plugin.
type Options struct {
	// ProjectKind tells a managed project from a host project, which the
	// editor must know to address the sandbox. Required: core passes
	// StoreProjectKind over its store.
	ProjectKind ProjectKindFunc
	// Timeout bounds each git command. Zero means DefaultTimeout.
	Timeout time.Duration
	// Logger receives diagnostics; nil means the registry's logger.
	Logger *slog.Logger
}

// ForStore returns the plugin's registration with project kinds read from
// st (core's factory).
func ForStore(st store.Store, log *slog.Logger) plugin.Registration {
	return Registration(Options{ProjectKind: StoreProjectKind(st), Logger: log})
}

// Registration returns the plugin's registration: manifest Provides
// [editor], Consumes [sandbox]. Register fails if opts.ProjectKind is nil.
func Registration(opts Options) plugin.Registration {
	return plugin.Registration{
		Manifest: plugin.Manifest{
			Name:     Name,
			Version:  "1",
			Provides: []plugin.Domain{plugin.DomainEditor},
			Consumes: []plugin.Domain{plugin.DomainSandbox},
		},
		Register: func(ctx *plugin.Context) error {
			if opts.ProjectKind == nil {
				return errors.New("editor: no project kind lookup")
			}
			log := opts.Logger
			if log == nil {
				log = ctx.Logger()
			}
			e := &Editor{
				consumer: ctx.Consumer(),
				kind:     opts.ProjectKind,
				timeout:  opts.Timeout,
				log:      log,
			}
			if e.timeout <= 0 {
				e.timeout = DefaultTimeout
			}
			return ctx.Provide(plugin.DomainEditor, e)
		},
	}
}

// Domain is the "editor" domain's contract: what the daemon resolves and
// calls. *Editor implements it.
type Domain interface {
	Status(ctx context.Context, actor sandbox.Actor, project int64) (*Status, error)
	Log(ctx context.Context, actor sandbox.Actor, project int64, opts LogOptions) (*Log, error)
	Diff(ctx context.Context, actor sandbox.Actor, project int64, opts DiffOptions) (*Diff, error)
	Show(ctx context.Context, actor sandbox.Actor, project int64, ref, path string, max int64) (*File, error)
}

var _ Domain = (*Editor)(nil)

// Editor is the editor control: Git reads of a project through the sandbox.
// It is safe for concurrent use. Every method resolves the sandbox control
// anew, looks the project's kind up, and runs one to three bounded git
// commands, each under its own lease of kind "editor"; a method blocks until
// they ended or ctx is cancelled (which cancels the running command).
type Editor struct {
	consumer *plugin.Consumer
	kind     ProjectKindFunc
	timeout  time.Duration
	log      *slog.Logger
}

// Logger returns the editor's logger.
func (e *Editor) Logger() *slog.Logger { return e.log }

// sandboxControl resolves the sandbox control at call time.
func (e *Editor) sandboxControl() (*sandbox.Control, error) {
	ctl, err := plugin.ResolveAs[*sandbox.Control](e.consumer, plugin.DomainSandbox)
	if err != nil {
		if !errors.Is(err, sandbox.ErrUnavailable) {
			err = fmt.Errorf("%w: %w", sandbox.ErrUnavailable, err)
		}
		return nil, err
	}
	return ctl, nil
}

// session prepares the git runner of one method call.
func (e *Editor) session(ctx context.Context, actor sandbox.Actor, project int64) (*gitRunner, error) {
	if project <= 0 {
		return nil, fmt.Errorf("%w: project id %d", ErrBadInput, project)
	}
	ctl, err := e.sandboxControl()
	if err != nil {
		return nil, err
	}
	kind, err := e.kind(ctx, project)
	if err != nil {
		return nil, err
	}
	dir := "."
	switch kind {
	case sandbox.ProjectManaged:
		dir = sandbox.GuestWorkspace
	case sandbox.ProjectHost:
	default:
		return nil, fmt.Errorf("editor: project %d has unknown kind %q", project, kind)
	}
	return &gitRunner{
		ctl:     ctl,
		actor:   actor,
		project: sandbox.ProjectRef{Kind: kind, ProjectID: project},
		dir:     dir,
		timeout: e.timeout,
	}, nil
}
