// Package export pushes a branch of a managed project to a Git remote with
// the host's credentials, which never enter the project's machine.
//
// # Flow
//
// An [Exporter.Export] runs these steps, each inside the project's machine
// through the core's sandbox control (RunCommand, lease kind "github",
// acting as the caller) unless it says "host":
//
//  1. git -c core.fsmonitor=false -C /workspace rev-parse --verify --quiet
//     refs/heads/B^{commit}: the branch head must be the caller's
//     ExpectedHead, else [*HeadMovedError] (nothing else ran).
//  2. git -c core.fsmonitor=false -C /workspace bundle create -q
//     /tmp/corral-export-<uuid>.bundle refs/heads/B, with an OnStart that
//     records the bundle's ownership (store.RecordArtifact) under the
//     command's lease. OnStart runs only after preparation was accepted,
//     so a refused preparation records nothing and leaves nothing.
//  3. The bundle is read out through the core-only sandboxArtifacts
//     control (size-capped by Options.MaxBundle) and deleted from the
//     machine at once (Artifacts.Delete, store.MarkArtifactDeleted). If
//     the deletion fails, or the process dies before it, the recorded
//     ownership lets a [Sweeper] delete it later.
//  4. host: git init --bare in a private temporary directory, git fetch of
//     the bundle into it (with fsckObjects), and a check that the fetched
//     head is still the one checked in step 1 (else [*HeadMovedError]:
//     the branch moved between the check and the bundle).
//  5. host: git push of refs/heads/B to the remote. The token
//     (Options.Token or Options.TokenFile) reaches git only through a
//     credential helper given on git's command line, scoped to the
//     remote's exact URL (credential.<url>.helper with
//     credential.useHttpPath, every other helper reset, redirects not
//     followed), which reads it from an environment variable set for that
//     host git process alone. The token never appears in the machine, in
//     any guest command's arguments or environment, in any file, or in a
//     response.
//
// Before step 1, the remote must match one of the daemon's allowed
// patterns (Options.AllowedRemotes) and, if the project has export
// remotes of its own (store.ExportRemotes), one of those: otherwise
// [ErrRemoteNotAllowed], before anything runs or touches the network.
//
// The host git runs with the system and global configuration ignored, no
// terminal prompts, hooks disabled, and only the transports the remote
// needs allowed.
package export

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/corral-sandbox/corral/core"
	"github.com/corral-sandbox/corral/internal/errdefs"
	"github.com/corral-sandbox/corral/internal/redact"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/store"
)

// Defaults of Options.
const (
	DefaultMaxBundle     = 128 << 20
	DefaultBundleTimeout = 5 * time.Minute
	DefaultPushTimeout   = 5 * time.Minute
	DefaultUsername      = "x-access-token"
)

// BundlePrefix starts the guest path of every bundle an Exporter creates;
// the Sweeper deletes only artifacts whose path starts with it.
const BundlePrefix = "/tmp/corral-export-"

// guestWorkspace is where a managed project's workspace is inside its
// machine.
const guestWorkspace = sandbox.GuestWorkspace

// Errors callers branch on. Errors of the sandbox (sandbox.ErrUnavailable,
// sandbox.ErrDenied, sandbox.ErrNotFound, *sandbox.CommandError) pass
// through wrapped.
var (
	// ErrInvalid reports a malformed request: a remote, branch or head
	// that is not acceptable, or a project that is not managed. Nothing
	// was run.
	ErrInvalid = errdefs.New(errdefs.Invalid, "export: invalid request")
	// ErrNoBranch reports that the branch does not exist in the project.
	ErrNoBranch = errdefs.New(errdefs.NotFound, "export: no such branch")
	// ErrNotRepository reports that the project's workspace is not a Git
	// repository.
	ErrNotRepository = errors.New("export: not a git repository")
	// ErrRejected reports that the remote refused the push (for example a
	// non-fast-forward update).
	ErrRejected = errors.New("export: push rejected by the remote")
	// ErrPush reports that the push failed for another reason (the
	// remote could not be reached, authentication failed).
	ErrPush = errors.New("export: push failed")
	// ErrTooLarge reports a bundle larger than Options.MaxBundle.
	ErrTooLarge = errdefs.New(errdefs.TooLarge, "export: bundle too large")
)

// HeadMovedError reports that the branch head is not the one the caller
// expected. It wraps nothing; test for it with errors.As.
type HeadMovedError struct {
	Branch   string
	Expected string
	// Actual is the head found.
	Actual string
}

func (e *HeadMovedError) Error() string {
	return fmt.Sprintf("export: branch %s is at %s, not at the expected %s", e.Branch, e.Actual, e.Expected)
}

// GitError is a git command (in the machine or on the host) that exited
// unsuccessfully. Stderr is redacted.
type GitError struct {
	Where   string // "machine" or "host"
	Command string // the git subcommand
	Code    *int
	Signal  string
	Stderr  string
	err     error // a sentinel it wraps, if any
}

func (e *GitError) Error() string {
	how := "was killed by " + e.Signal
	if e.Code != nil {
		how = fmt.Sprintf("exited with code %d", *e.Code)
	}
	msg := strings.TrimSpace(e.Stderr)
	if len(msg) > 1024 {
		msg = msg[:1024] + "…"
	}
	return fmt.Sprintf("export: git %s (%s) %s: %s", e.Command, e.Where, how, msg)
}

func (e *GitError) Unwrap() error { return e.err }

// Options configure an Exporter. The zero value means the documented
// defaults, with no token and only https remotes.
type Options struct {
	// Token is the credential pushed with (a GitHub token, say). It is
	// offered to https remotes only. Empty means TokenFile, and if that is
	// empty too, no credential: the push then fails if the remote needs
	// one.
	Token string
	// TokenFile names a file holding the token (surrounding white space
	// is trimmed); it is read at each export, so a rotated token takes
	// effect at once. Ignored when Token is set.
	TokenFile string
	// Username goes with the token. Empty means DefaultUsername
	// ("x-access-token", which GitHub accepts with any token).
	Username string
	// AllowedRemotes are the patterns (see ValidRemotePattern) of the
	// remotes exports may push to; a project's own export remotes
	// (store.ExportRemotes) narrow them further. Empty refuses every export
	// with ErrRemoteNotAllowed.
	AllowedRemotes []string
	// AllowInsecure also accepts remotes that are absolute host paths,
	// file:// URLs and plain http:// URLs (to which the token is offered
	// too). Meant for tests and trusted local setups; false refuses them.
	AllowInsecure bool
	// MaxBundle caps the bundle's size in bytes. Zero means
	// DefaultMaxBundle (128 MiB).
	MaxBundle int64
	// BundleTimeout bounds git bundle create in the machine. Zero means
	// DefaultBundleTimeout.
	BundleTimeout time.Duration
	// PushTimeout bounds the host's fetch and push. Zero means
	// DefaultPushTimeout.
	PushTimeout time.Duration
	// TempDir is where the host's temporary repositories are made. Empty
	// means os.TempDir().
	TempDir string
	// Git is the host's git executable. Empty means "git" in PATH.
	Git string
	// Logger receives diagnostics; nil means slog.Default().
	Logger *slog.Logger
}

// Request is one export.
type Request struct {
	// Actor is the account the machine-side commands run as; preparation
	// refuses (sandbox.ErrDenied) an actor that is not a member.
	Actor sandbox.Actor
	// Project is the store id of a managed project.
	Project int64
	// Remote is the URL pushed to: https://… (and, with
	// Options.AllowInsecure, http://…, file://… or an absolute path).
	Remote string
	// Branch is the branch name (without refs/heads/).
	Branch string
	// ExpectedHead is the full hexadecimal object name the caller
	// expects the branch to point at.
	ExpectedHead string
}

// Result is a completed export.
type Result struct {
	Pushed bool   `json:"pushed"`
	Head   string `json:"head"`
	// Remote is the remote URL without its user information.
	Remote string `json:"remote"`
}

// Exporter exports branches of managed projects. It is safe for
// concurrent use.
type Exporter struct {
	core *core.Core
	opts Options
	log  *slog.Logger

	mu       sync.Mutex
	inFlight map[int64]bool // artifact ids of exports still running
}

// New returns an Exporter over c.
func New(c *core.Core, opts Options) (*Exporter, error) {
	if c == nil {
		return nil, errors.New("export: New needs a core")
	}
	if opts.MaxBundle <= 0 {
		opts.MaxBundle = DefaultMaxBundle
	}
	if opts.BundleTimeout <= 0 {
		opts.BundleTimeout = DefaultBundleTimeout
	}
	if opts.PushTimeout <= 0 {
		opts.PushTimeout = DefaultPushTimeout
	}
	if opts.Username == "" {
		opts.Username = DefaultUsername
	}
	if opts.Git == "" {
		opts.Git = "git"
	}
	if opts.TempDir == "" {
		opts.TempDir = os.TempDir()
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Exporter{core: c, opts: opts, log: log, inFlight: make(map[int64]bool)}, nil
}

var hexHead = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^(?:[0-9a-f]{40}|[0-9a-f]{64})$`) })

// Export pushes req.Branch of req.Project to req.Remote, as described in
// the package documentation. It blocks until the push completed or failed;
// cancelling ctx cancels the running command or git process.
//
// Errors: ErrInvalid (nothing ran); ErrRemoteNotAllowed (nothing ran, no
// network used); sandbox.ErrUnavailable (no sandbox
// provider); an error wrapping sandbox.ErrNotFound (no such project) or
// sandbox.ErrDenied (not a member) from the first preparation, before
// anything was recorded; ErrNotRepository, ErrNoBranch, *HeadMovedError;
// ErrTooLarge; a *sandbox.CommandError (timeout, abort, transport, …) or a
// *GitError for a command that failed; ErrRejected or ErrPush (both
// *GitError) for the push. On every failure after the bundle was created
// its guest file is deleted, or left to the Sweeper if that fails.
func (x *Exporter) Export(ctx context.Context, req Request) (*Result, error) {
	remote, shown, err := x.checkRemote(req.Remote)
	if err != nil {
		return nil, err
	}
	if err := x.allowRemote(remote, shown, nil); err != nil {
		return nil, err
	}
	req.ExpectedHead = strings.ToLower(req.ExpectedHead)
	if !hexHead().MatchString(req.ExpectedHead) {
		return nil, fmt.Errorf("%w: expectedHead %q is not a full hexadecimal object name", ErrInvalid, req.ExpectedHead)
	}
	if err := x.checkBranch(ctx, req.Branch); err != nil {
		return nil, err
	}
	ref, err := x.projectRef(ctx, req.Project)
	if err != nil {
		return nil, err
	}
	own, err := x.core.Store().ExportRemotes(ctx, req.Project)
	if err != nil {
		return nil, fmt.Errorf("export: look up project %d: %w", req.Project, err)
	}
	if err := x.allowRemote(remote, shown, own); err != nil {
		return nil, err
	}
	if _, err := x.core.Sandbox(); err != nil {
		return nil, err
	}
	arts, err := x.core.Artifacts()
	if err != nil {
		return nil, err
	}
	g := &guest{x: x, actor: req.Actor, project: ref}

	head, err := g.head(ctx, req.Branch)
	if err != nil {
		return nil, err
	}
	if head != req.ExpectedHead {
		return nil, &HeadMovedError{Branch: req.Branch, Expected: req.ExpectedHead, Actual: head}
	}

	bundle, err := g.bundle(ctx, req.Branch, arts)
	if err != nil {
		return nil, err
	}

	h, err := x.newHostRepo()
	if err != nil {
		return nil, err
	}
	defer h.remove()
	pctx, cancel := context.WithTimeout(ctx, x.opts.PushTimeout)
	defer cancel()
	got, err := h.fetchBundle(pctx, bundle, req.Branch)
	if err != nil {
		return nil, err
	}
	if got != head {
		return nil, &HeadMovedError{Branch: req.Branch, Expected: req.ExpectedHead, Actual: got}
	}
	token, err := x.token()
	if err != nil {
		return nil, err
	}
	if err := h.push(pctx, req.Remote, remote, req.Branch, token); err != nil {
		return nil, err
	}
	x.log.Info("export: pushed", "project", req.Project, "branch", req.Branch, "head", head, "remote", shown)
	return &Result{Pushed: true, Head: head, Remote: shown}, nil
}

// projectRef looks the project up: it must exist and be managed.
func (x *Exporter) projectRef(ctx context.Context, id int64) (sandbox.ProjectRef, error) {
	if id <= 0 {
		return sandbox.ProjectRef{}, fmt.Errorf("%w: project id %d", ErrInvalid, id)
	}
	p, err := x.core.Store().GetProject(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return sandbox.ProjectRef{}, fmt.Errorf("export: project %d: %w", id, sandbox.ErrNotFound)
	}
	if err != nil {
		return sandbox.ProjectRef{}, fmt.Errorf("export: look up project %d: %w", id, err)
	}
	if p.Kind != store.ProjectManaged {
		return sandbox.ProjectRef{}, fmt.Errorf("%w: project %d is a %s project; only managed projects are exported", ErrInvalid, id, p.Kind)
	}
	return sandbox.ProjectRef{Kind: sandbox.ProjectManaged, ProjectID: id}, nil
}

// token returns the credential to push with ("" for none).
func (x *Exporter) token() (string, error) {
	if x.opts.Token != "" {
		return x.opts.Token, nil
	}
	if x.opts.TokenFile == "" {
		return "", nil
	}
	b, err := os.ReadFile(x.opts.TokenFile)
	if err != nil {
		return "", fmt.Errorf("export: read the token file: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// checkRemote parses and admits a remote. It returns the URL as parsed
// (for a path, a file URL) and the remote as shown to callers (without
// user information).
func (x *Exporter) checkRemote(raw string) (u *url.URL, shown string, err error) {
	if raw == "" {
		return nil, "", fmt.Errorf("%w: remote is empty", ErrInvalid)
	}
	for _, r := range raw {
		if r < 0x20 || r == 0x7f || r == ' ' {
			return nil, "", fmt.Errorf("%w: remote contains white space or a control character", ErrInvalid)
		}
	}
	if strings.HasPrefix(raw, "/") {
		if !x.opts.AllowInsecure {
			return nil, "", fmt.Errorf("%w: remote paths are not allowed", ErrInvalid)
		}
		if filepath.Clean(raw) != raw {
			return nil, "", fmt.Errorf("%w: remote path %q is not clean", ErrInvalid, raw)
		}
		return &url.URL{Scheme: "file", Path: raw}, raw, nil
	}
	u, err = url.Parse(raw)
	if err != nil {
		return nil, "", fmt.Errorf("%w: remote is not a URL: %s", ErrInvalid, redactText(err.Error(), raw, ""))
	}
	switch u.Scheme {
	case "https":
	case "http", "file":
		if !x.opts.AllowInsecure {
			return nil, "", fmt.Errorf("%w: %s remotes are not allowed (https only)", ErrInvalid, u.Scheme)
		}
	default:
		return nil, "", fmt.Errorf("%w: remote scheme %q is not allowed (https only)", ErrInvalid, u.Scheme)
	}
	if u.Scheme != "file" && u.Host == "" {
		return nil, "", fmt.Errorf("%w: remote has no host", ErrInvalid)
	}
	if u.Opaque != "" || u.Fragment != "" {
		return nil, "", fmt.Errorf("%w: remote is not a plain URL", ErrInvalid)
	}
	return u, redactURL(u), nil
}

// checkBranch validates a branch name with the host's git
// (check-ref-format), never running anything in the machine.
func (x *Exporter) checkBranch(ctx context.Context, b string) error {
	if b == "" || strings.HasPrefix(b, "-") || strings.HasPrefix(b, "refs/") || b == "HEAD" {
		return fmt.Errorf("%w: branch %q is not a branch name", ErrInvalid, b)
	}
	for _, r := range b {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("%w: branch name contains a control character", ErrInvalid)
		}
	}
	res, err := x.hostGit(ctx, "", nil, "check-ref-format", "refs/heads/"+b)
	if err != nil {
		return err
	}
	if !res.ok() {
		return fmt.Errorf("%w: branch %q is not a valid branch name", ErrInvalid, b)
	}
	return nil
}

// track marks an artifact as belonging to a running export (the Sweeper
// leaves it alone) or, with on false, no longer.
func (x *Exporter) track(id int64, on bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if on {
		x.inFlight[id] = true
	} else {
		delete(x.inFlight, id)
	}
}

func (x *Exporter) running(id int64) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.inFlight[id]
}

// newBundlePath returns a fresh guest path for a bundle.
func newBundlePath() string { return BundlePrefix + uuid.NewString() + ".bundle" }

// redactURL renders u without its user information.
func redactURL(u *url.URL) string {
	c := *u
	c.User = nil
	return c.String()
}

// redactText removes secrets from s (corral's redactor), and the token
// and the raw remote's password wherever they occur (a password shorter
// than 8 bytes only within URLs, lest every occurrence of a common word
// go).
func redactText(s, rawRemote, token string) string {
	known := []string{token}
	if rawRemote != "" {
		if u, err := url.Parse(rawRemote); err == nil && u.User != nil {
			if p, ok := u.User.Password(); ok && len(p) >= 8 {
				known = append(known, p)
			}
		}
	}
	return redact.New(known...).String(s)
}
