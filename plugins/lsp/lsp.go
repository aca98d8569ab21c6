// Package lsp is the built-in plugin that owns the "lsp" domain:
// language servers run inside a managed project's machine, one raw
// session each, exchanging LSP JSON-RPC messages with their caller.
//
// A session is opened with [Control.Open]: the plugin resolves the sandbox
// control through its registry consumer (at every call, never cached) and
// opens the configured command line with lease kind "lsp" in /workspace
// as a [sandbox.Session] ([sandbox.Control.Open], which checks that the
// target is a managed one, starts it, and keeps the lease alive: the one
// session lifecycle, owned by package sandbox). The plugin holds only the
// framing: the server's standard output is read as Content-Length framed
// messages ([Session.ReadMessage]); messages given to [Session.Send] are
// framed onto its standard input. The server's standard error is logged at
// debug level, up to a bound, and otherwise dropped.
//
// A session ends for one reason, reported as a [*CloseError] by
// [Session.Err]: the caller closed it, the server exited, the server broke
// the framing, the caller sent something that is not a JSON-RPC message,
// the lease heartbeat failed, or the server's input could not be written.
// Whatever the reason, the session then tears the server down — cancels
// its whole process tree (unless it exited by itself) and releases the
// lease — before [Session.Done] is closed.
//
// Host projects are refused ([ErrUnsupportedProject]): a language server
// is a long-lived process, and only a machine bounds what it may touch
// for as long as it runs.
package lsp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/corral-sandbox/corral/internal/errdefs"
	"github.com/corral-sandbox/corral/plugin"
	"github.com/corral-sandbox/corral/sandbox"
)

// Name is the plugin's name.
const Name = "lsp"

// Workspace is the working directory of every language server: the
// project's root inside its machine.
const Workspace = sandbox.GuestWorkspace

// DefaultGopls is gopls's default command line. The machine's environment
// is minimal, so it goes through env(1) to find the Go toolchain where the
// official distribution installs it (/usr/local/go, visible read-only in
// machines), to use that toolchain only (GOTOOLCHAIN=local) and never the
// network (GOPROXY=off; machines have none). Caches go under the
// machine's home (HOME is set by the provider).
var DefaultGopls = []string{
	"env",
	"PATH=/usr/local/go/bin:/usr/local/bin:/usr/bin:/bin",
	"GOTOOLCHAIN=local",
	"GOPROXY=off",
	"gopls", "serve",
}

// DefaultServers returns the servers configured when Options.Servers is
// nil: gopls only, as DefaultGopls.
func DefaultServers() map[string][]string {
	return map[string][]string{"gopls": slices.Clone(DefaultGopls)}
}

// Errors of Open. They are wrapped; test with errors.Is.
var (
	// ErrUnknownServer: no server of that name is configured.
	ErrUnknownServer = errdefs.New(errdefs.NotFound, "lsp: unknown language server")
	// ErrUnsupportedProject: the project is not a managed one (or the
	// provider did not prepare a managed execution for it).
	ErrUnsupportedProject = errdefs.New(errdefs.Invalid, "lsp: language servers run only in managed projects")
)

// Options configure the plugin. The zero value means the documented
// defaults.
type Options struct {
	// Servers maps a server's name to its command line (program, then
	// arguments; the program is looked up in the machine's PATH). Nil means
	// DefaultServers(); a non-nil map replaces the defaults entirely.
	// Names are 1 to 64 of [A-Za-z0-9._-]. An invalid entry fails the
	// plugin's registration.
	Servers map[string][]string
	// Cwd is the servers' working directory inside the machine. Empty
	// means Workspace (/workspace).
	Cwd string
	// MaxMessage bounds one message's content, both ways, in bytes. Zero
	// means DefaultMaxMessage (16 MiB).
	MaxMessage int
	// Drain bounds how long a server that closed its output (or its
	// input) is given to exit before the session ends for that reason.
	// Zero means 2 s. (The lease's heartbeat, the bounded drain of the
	// output after an exit and the wait after a cancel are the sandbox
	// control's: sandbox.ControlOptions.)
	Drain time.Duration
	// StderrLimit bounds how many bytes of a server's standard error are
	// logged (at debug level); the rest is read and dropped. Zero means
	// 64 KiB; negative logs nothing.
	StderrLimit int
	// Logger receives diagnostics; nil means slog.Default().
	Logger *slog.Logger
}

// Registration returns the plugin's registration: it provides the "lsp"
// domain (a *Control, requiring the "sandbox" domain, so it resolves as
// absent without a sandbox) and consumes "sandbox". Registering starts
// nothing.
func Registration(opts Options) plugin.Registration {
	return plugin.Registration{
		Manifest: plugin.Manifest{
			Name:     Name,
			Version:  "1",
			Provides: []plugin.Domain{plugin.DomainLSP},
			Consumes: []plugin.Domain{plugin.DomainSandbox},
		},
		Register: func(ctx *plugin.Context) error {
			c, err := newControl(ctx.Consumer(), opts)
			if err != nil {
				return err
			}
			if ctx.Logger() != nil && opts.Logger == nil {
				c.log = ctx.Logger()
			}
			return ctx.Provide(plugin.DomainLSP, c, plugin.Requires(plugin.DomainSandbox))
		},
	}
}

// Domain is the "lsp" domain's contract: what the daemon resolves and
// calls. *Control implements it.
type Domain interface {
	// Servers lists the configured server names, sorted.
	Servers() []string
	// HasServer reports whether name is configured.
	HasServer(name string) bool
	// MaxMessage is the largest message a session carries, in bytes.
	MaxMessage() int
	// Open starts server in project for actor (see Control.Open).
	Open(ctx context.Context, actor sandbox.Actor, project sandbox.ProjectRef, server string) (*Session, error)
}

var _ Domain = (*Control)(nil)

// Control is the "lsp" domain's control: it opens language-server
// sessions. It is safe for concurrent use.
type Control struct {
	consumer *plugin.Consumer
	servers  map[string][]string
	opts     Options
	log      *slog.Logger
}

func newControl(consumer *plugin.Consumer, opts Options) (*Control, error) {
	servers := opts.Servers
	if servers == nil {
		servers = DefaultServers()
	}
	c := &Control{consumer: consumer, servers: make(map[string][]string, len(servers)), opts: opts, log: opts.Logger}
	for name, argv := range servers {
		if !ValidServerName(name) {
			return nil, fmt.Errorf("lsp: server name %q: must be 1-64 of [A-Za-z0-9._-]", name)
		}
		if len(argv) == 0 || argv[0] == "" {
			return nil, fmt.Errorf("lsp: server %q: empty command line", name)
		}
		for _, a := range argv {
			if strings.IndexByte(a, 0) >= 0 {
				return nil, fmt.Errorf("lsp: server %q: command line contains a NUL byte", name)
			}
		}
		c.servers[name] = slices.Clone(argv)
	}
	if c.opts.Cwd == "" {
		c.opts.Cwd = Workspace
	}
	if c.opts.MaxMessage <= 0 {
		c.opts.MaxMessage = DefaultMaxMessage
	}
	if c.opts.Drain <= 0 {
		c.opts.Drain = 2 * time.Second
	}
	if c.opts.StderrLimit == 0 {
		c.opts.StderrLimit = 64 << 10
	}
	if c.log == nil {
		c.log = slog.Default()
	}
	return c, nil
}

// ValidServerName reports whether name can name a server: 1 to 64 ASCII
// letters, digits, '.', '_' or '-'.
func ValidServerName(name string) bool {
	if len(name) == 0 || len(name) > 64 {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// Servers returns the configured servers' names, sorted.
func (c *Control) Servers() []string {
	return slices.Sorted(maps.Keys(c.servers))
}

// HasServer reports whether a server named name is configured.
func (c *Control) HasServer(name string) bool {
	_, ok := c.servers[name]
	return ok
}

// MaxMessage returns the bound on one message's content, in bytes.
func (c *Control) MaxMessage() int { return c.opts.MaxMessage }

// Open starts language server server in project on behalf of actor and
// returns its session, which the caller must Close.
//
// Nothing is prepared when server is not configured (an error wrapping
// ErrUnknownServer) or project is not managed (ErrUnsupportedProject).
// Otherwise Open resolves the sandbox control (an error wrapping
// plugin.ErrAbsent and sandbox.ErrUnavailable when there is none) and
// opens the server's command line with lease kind "lsp" in Options.Cwd
// (sandbox.Control.Open); a refusal, a target that is not managed among
// them, is the control's *sandbox.CommandError of kind "prepare". A server
// that cannot be started is cancelled and its lease released; the error
// wraps sandbox.ErrNotStarted or sandbox.ErrTransport as the provider
// reported it.
//
// ctx bounds the preparation and the start only: the session lives until
// it is closed or ends by itself.
func (c *Control) Open(ctx context.Context, actor sandbox.Actor, project sandbox.ProjectRef, server string) (*Session, error) {
	argv, ok := c.servers[server]
	if !ok {
		return nil, fmt.Errorf("%w: %q (configured: %s)", ErrUnknownServer, server, strings.Join(c.Servers(), ", "))
	}
	if project.Kind != sandbox.ProjectManaged {
		return nil, fmt.Errorf("%w: project %d is a %s project", ErrUnsupportedProject, project.ProjectID, project.Kind)
	}
	ctl, err := plugin.ResolveAs[*sandbox.Control](c.consumer, plugin.DomainSandbox)
	if err != nil {
		return nil, fmt.Errorf("lsp: resolve sandbox: %w", err)
	}
	in := sandbox.ExecInput{
		Command:   sandbox.Command{Type: sandbox.CommandTypeArgv, File: argv[0], Args: argv[1:]},
		Cwd:       c.opts.Cwd,
		LeaseKind: sandbox.LeaseLSP,
		Project:   project,
	}
	// ctx bounds the preparation and the start; then the session lives
	// until it is closed (its own context, which teardown ends).
	sctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	unbind := context.AfterFunc(ctx, stop)
	sess, err := ctl.Open(sctx, in, &actor, nil)
	unbind()
	if err != nil {
		stop()
		if errors.Is(err, sandbox.ErrNotStarted) || errors.Is(err, sandbox.ErrTransport) {
			return nil, fmt.Errorf("lsp: start %s: %w", server, err)
		}
		return nil, err
	}
	s := newSession(c, server, sess, stop)
	c.log.Debug("lsp: session started", "server", server, "project", project.ProjectID, "account", actor.AccountUserID, "lease", s.LeaseID())
	return s, nil
}
