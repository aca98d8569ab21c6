package provider

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path"
	"strings"
	"sync"
	"syscall"

	"github.com/corral-sandbox/corral/lease"
	"github.com/corral-sandbox/corral/machine"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/store"
)

// prepareManaged prepares a command inside the project's machine. Nothing
// runs until Start: Start sends exec-start through the machine gateway,
// which makes three socketpairs and attaches their far ends as the
// command's 0/1/2; Cancel sends exec-cancel. Without a privileged
// transport, preparation fails at once with machine.ErrNoPrivilegedTransport
// (nothing to clean up).
//
// The working directory is a guest path: empty means the image's WorkingDir
// (else /workspace); a relative
// path is taken below /workspace; it must stay inside /workspace or the
// machine's home after cleaning. Output is sanitized by replacing the host
// workspace path with /workspace. The environment is the machine's (its
// image's Env, with its PATH, else the worker's default PATH; then HOME,
// LANG, TERM, USER), then Options.Env, then the request's Env, which wins.
//
// ten, if not nil, is the tenancy read whose version the lease insert
// checks (mintLease): the session starts under its egress policy
// (store.Tenancy.EgressPolicy) instead of reading it again (PolicyEgress).
func (p *Provider) prepareManaged(ctx context.Context, in sandbox.ExecInput, actor sandbox.Actor, proj store.Project, ten *store.Tenancy) (sandbox.Prepared, error) {
	if p.gateway == nil || !p.gateway.HasTransport() {
		return nil, fmt.Errorf("provider: project %d: %w", proj.ID, machine.ErrNoPrivilegedTransport)
	}
	cwd, err := guestCwd(in.Cwd)
	if err != nil {
		return nil, fmt.Errorf("provider: project %d: %w", proj.ID, err)
	}
	// No PATH: the machine's applies (the image's, as Docker's config
	// gives it, else the worker's default, which has the sbin directories
	// root's tools need).
	env := map[string]string{
		"HOME": sandbox.GuestHome,
		"LANG": "C.UTF-8",
		"TERM": "dumb",
		"USER": "corral",
	}
	for _, kv := range p.env {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	if in.User != "" {
		// HOME is the named user's, which the machine knows; USER names
		// the default user.
		delete(env, "HOME")
		delete(env, "USER")
	}
	// The request's variables win over the machine's and the operator's.
	for k, v := range in.Env {
		env[k] = v
	}
	req := machine.ExecRequest{
		Project: machineProject(proj),
		Account: actor.AccountUserID,
		// The session is named after its lease (set below): one lease
		// covers one execution, and an interruption names what it covered.
		ID:    "00000000-0000-0000-0000-000000000000",
		Lease: "00000000-0000-0000-0000-000000000000",
		Argv:  in.Command.Argv(),
		Cwd:   machineCwd(in.Cwd, cwd),
		Env:   env,
		User:  in.User,
	}
	if in.TTY != nil {
		req.TTY = &machine.TTY{Rows: in.TTY.Rows, Cols: in.TTY.Cols}
		env["TERM"] = "xterm-256color"
	}
	// The request must fit in one protocol frame; refuse it here, before a
	// lease exists, rather than fail at start.
	if err := req.CheckSize(); err != nil {
		return nil, fmt.Errorf("provider: project %d: command line too large for a machine (%d bytes of argv and environment): %w",
			proj.ID, requestBytes(in.Command.Argv(), "", in.Env), err)
	}
	l, err := p.mintLease(ctx, in, actor)
	if err != nil {
		return nil, err
	}
	req.ID, req.Lease = l.ID(), l.ID()
	m := &managedExec{
		gw:     p.gateway,
		req:    req,
		lease:  l,
		egress: p.egress,
	}
	if ten != nil {
		m.policy, m.policyVersion = &ten.EgressPolicy, ten.Version
	}
	// Work under an expired lease is cancelled, even if its holder died.
	l.Watch(func() { _ = m.cancel(context.Background()) })
	return &sandbox.ManagedPrepared{
		PreparedCommon: sandbox.PreparedCommon{
			Project:      in.Project,
			Cwd:          cwd,
			DisplayCwd:   cwd,
			Lease:        l,
			Sanitize:     sanitizer([]string{proj.Root}),
			SanitizeHold: sanitizeHold([]string{proj.Root}),
		},
		Start:  m.start,
		Cancel: m.cancel,
	}, nil
}

// machineProject is what the worker needs of proj: its id, workspace,
// image and limits. The default image and limits are sent as nothing, so
// that a project asking for no more than the defaults runs on a worker
// without the machine-spec extension too; any other spec needs it (the
// gateway refuses it with machine.ErrUnsupported otherwise).
func machineProject(proj store.Project) machine.Project {
	p := machine.Project{ID: proj.ID, Workspace: proj.Root}
	if proj.Image != store.DefaultImage {
		p.Image = proj.Image
	}
	l := proj.Limits
	p.Limits = machine.Limits{Memory: l.Memory, Pids: l.Pids, CPUMillis: l.CPUMillis, Disk: l.Disk, Tmp: l.Tmp}
	return p
}

// requestBytes adds up the strings of an exec request.
func requestBytes(argv []string, cwd string, env map[string]string) int {
	n := len(cwd)
	for _, a := range argv {
		n += len(a) + 1
	}
	for k, v := range env {
		n += len(k) + len(v) + 2
	}
	return n
}

// machineCwd is the working directory a request sends the machine: none
// when the caller gave none, so that the machine's image's WorkingDir
// applies (else /workspace), as Docker's does.
func machineCwd(req, resolved string) string {
	if req == "" {
		return ""
	}
	return resolved
}

// guestCwd resolves a requested working directory inside the machine.
func guestCwd(req string) (string, error) {
	if req == "" {
		return DisplayRoot, nil
	}
	p := req
	if !path.IsAbs(p) {
		p = path.Join(DisplayRoot, p)
	}
	p = path.Clean(p)
	for _, root := range []string{DisplayRoot, sandbox.GuestHome} {
		if p == root || strings.HasPrefix(p, root+"/") {
			return p, nil
		}
	}
	return "", fmt.Errorf("cwd %q is outside %s and %s", req, DisplayRoot, sandbox.GuestHome)
}

// managedExec is one prepared managed execution.
type managedExec struct {
	gw     *machine.Gateway
	req    machine.ExecRequest
	lease  *lease.Lease
	egress Egress // nil: no egress service
	// policy is the stored egress policy, confirmed by the lease insert
	// under policyVersion; nil: not read.
	policy        *string
	policyVersion int64

	mu        sync.Mutex
	session   *machine.Session
	cancelled bool
}

func (m *managedExec) start(ctx context.Context) (*sandbox.ManagedExecutionSession, error) {
	m.mu.Lock()
	if m.cancelled {
		m.mu.Unlock()
		return nil, errors.New("provider: execution was cancelled before it started")
	}
	m.mu.Unlock()
	req, release := m.req, func() {}
	if m.egress != nil {
		var (
			env map[string]string
			rel func()
			err error
		)
		if pe, ok := m.egress.(PolicyEgress); ok && m.policy != nil {
			env, rel, err = pe.SessionPolicy(ctx, req.Project, req.Account, req.Lease, *m.policy, m.policyVersion)
		} else {
			env, rel, err = m.egress.Session(ctx, req.Project, req.Account, req.Lease)
		}
		if err != nil {
			return nil, fmt.Errorf("provider: project %d: network: %w", req.Project.ID, err)
		}
		release = rel
		if len(env) > 0 {
			req.Env = maps.Clone(req.Env)
			maps.Copy(req.Env, env)
		}
	}
	s, err := m.gw.Exec(ctx, req)
	if err != nil {
		release()
		return nil, translate(err)
	}
	m.mu.Lock()
	m.session = s
	cancelled := m.cancelled
	m.mu.Unlock()
	if cancelled {
		_ = s.Cancel(context.Background())
	}
	// The session settles with the machine's: no goroutine waits for it.
	// Core collects the end on every path (NewManagedSessionOn), which
	// gives the egress session back.
	sess := sandbox.NewManagedSessionOn(s.Stdin, s.Stdout, s.Stderr, s.Done(), func() (sandbox.Exit, error) {
		exit, err := s.Wait()
		release()
		if err != nil {
			return sandbox.Exit{}, translate(err)
		}
		return sandbox.Exit{Code: exit.Code, Signal: exit.Signal, OOMKilled: exit.OOMKilled}, nil
	})
	if s.TTY != nil {
		sess.Resize = s.Resize
	}
	if s.CanSignal() {
		sess.Signal = func(sig syscall.Signal) error { return translate(s.Signal(sig)) }
	}
	return sess, nil
}

// cancel kills the session's whole process tree (exec-cancel). It is
// idempotent; before Start it makes Start refuse.
func (m *managedExec) cancel(ctx context.Context) error {
	m.mu.Lock()
	m.cancelled = true
	s := m.session
	m.mu.Unlock()
	if s == nil {
		return nil
	}
	err := s.Cancel(ctx)
	if errors.Is(err, machine.ErrInterrupted) || errors.Is(err, machine.ErrClosed) {
		// The worker cancels every session of a lost connection itself.
		return nil
	}
	return err
}

// translate maps the gateway's errors onto the seam's sentinels.
func translate(err error) error {
	switch {
	case errors.Is(err, machine.ErrNotStarted):
		return fmt.Errorf("%w: %w", sandbox.ErrNotStarted, err)
	case errors.Is(err, machine.ErrInterrupted), errors.Is(err, machine.ErrMachineFailed), errors.Is(err, machine.ErrUnavailable),
		errors.Is(err, machine.ErrClosed), errors.Is(err, machine.ErrNoPrivilegedTransport):
		return fmt.Errorf("%w: %w", sandbox.ErrTransport, err)
	}
	return err
}
