// Package sandboxtest holds the conformance suite every sandbox provider
// passes (Run) and a fake provider for consumers' own tests (Provider).
package sandboxtest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/corral-sandbox/corral/internal/pdeath"

	"github.com/corral-sandbox/corral/sandbox"
)

// Lease is an in-memory sandbox.Lease that counts what is done to it.
type Lease struct {
	id      string
	account int64
	kind    sandbox.LeaseKind

	// HeartbeatErr, if set, is returned by every Heartbeat.
	HeartbeatErr atomic.Pointer[error]
	// ReleaseErr, if set, is returned by every Release.
	ReleaseErr atomic.Pointer[error]

	Heartbeats atomic.Int64
	Releases   atomic.Int64
	released   atomic.Bool
}

// NewLease returns a live lease.
func NewLease(id string, account int64, kind sandbox.LeaseKind) *Lease {
	return &Lease{id: id, account: account, kind: kind}
}

// ID implements sandbox.Lease.
func (l *Lease) ID() string { return l.id }

// AccountUserID implements sandbox.Lease.
func (l *Lease) AccountUserID() int64 { return l.account }

// Kind implements sandbox.Lease.
func (l *Lease) Kind() sandbox.LeaseKind { return l.kind }

// Heartbeat implements sandbox.Lease.
func (l *Lease) Heartbeat(context.Context) error {
	l.Heartbeats.Add(1)
	if p := l.HeartbeatErr.Load(); p != nil {
		return *p
	}
	if l.released.Load() {
		return errors.New("lease released")
	}
	return nil
}

// Release implements sandbox.Lease.
func (l *Lease) Release(context.Context) error {
	l.Releases.Add(1)
	if p := l.ReleaseErr.Load(); p != nil {
		return *p
	}
	l.released.Store(true)
	return nil
}

// Released reports whether Release succeeded at least once.
func (l *Lease) Released() bool { return l.released.Load() }

// Provider is a fake sandbox.Provider for consumers' tests. It runs the
// requested program directly on the host (host projects) or as a local
// process behind a ManagedExecutionSession (managed projects), in its own
// process group. It records every preparation and counts cancellations.
type Provider struct {
	// Kind, if set, is the kind of every project this provider knows: it
	// prepares that branch whatever the request says (as a provider that
	// looks the project up would), so a mismatch reaches core's target check.
	Kind sandbox.ProjectKind
	// Refuse, if non-nil, makes every preparation fail with it.
	Refuse error
	// Dir is the working directory for commands with an empty Cwd; empty
	// means the test process's directory.
	Dir string
	// Mutate, if non-nil, may alter each prepared execution before it is
	// returned (to test target validation).
	Mutate func(sandbox.Prepared)
	// Sanitize is installed on every prepared execution.
	Sanitize func(string) string
	// SanitizeHold is installed with Sanitize (see
	// sandbox.PreparedCommon.SanitizeHold).
	SanitizeHold func(string) int
	// OnLease, if non-nil, sees each lease minted.
	OnLease func(*Lease)

	mu       sync.Mutex
	leases   []*Lease
	calls    atomic.Int64
	cancels  atomic.Int64
	sequence atomic.Int64
}

var _ sandbox.Provider = (*Provider)(nil)

// Calls reports how many preparations were asked for.
func (p *Provider) Calls() int64 { return p.calls.Load() }

// Cancels reports how many times a prepared execution was cancelled.
func (p *Provider) Cancels() int64 { return p.cancels.Load() }

// Leases returns the leases minted so far.
func (p *Provider) Leases() []*Lease {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*Lease(nil), p.leases...)
}

// LastLease returns the most recent lease, or nil.
func (p *Provider) LastLease() *Lease {
	ls := p.Leases()
	if len(ls) == 0 {
		return nil
	}
	return ls[len(ls)-1]
}

// PrepareExecution implements sandbox.Provider.
func (p *Provider) PrepareExecution(ctx context.Context, in sandbox.ExecInput, actor sandbox.Actor) (sandbox.Prepared, error) {
	p.calls.Add(1)
	if p.Refuse != nil {
		return nil, p.Refuse
	}
	path, err := exec.LookPath(in.Command.File)
	if err != nil {
		path = in.Command.File // let the start fail, as a real sandbox would
	}
	dir := in.Cwd
	if dir == "" {
		dir = p.Dir
	}
	lease := NewLease(fmt.Sprintf("fake-%d", p.sequence.Add(1)), actor.AccountUserID, in.LeaseKind)
	p.mu.Lock()
	p.leases = append(p.leases, lease)
	p.mu.Unlock()
	if p.OnLease != nil {
		p.OnLease(lease)
	}
	common := sandbox.PreparedCommon{Project: in.Project, Cwd: dir, DisplayCwd: dir, Lease: lease, Sanitize: p.Sanitize, SanitizeHold: p.SanitizeHold}
	env := []string{"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"}
	for _, k := range slices.Sorted(maps.Keys(in.Env)) {
		env = slices.DeleteFunc(env, func(e string) bool { return strings.HasPrefix(e, k+"=") })
		env = append(env, k+"="+in.Env[k])
	}
	var prep sandbox.Prepared
	kind := in.Project.Kind
	if p.Kind != "" {
		kind = p.Kind
	}
	switch kind {
	case sandbox.ProjectHost:
		prep = &sandbox.LocalPrepared{
			PreparedCommon: common,
			Mode:           sandbox.LocalDirect,
			Launch:         sandbox.Launch{Path: path, Args: in.Command.Argv(), Env: env, Dir: dir},
			Cancel:         func(context.Context) error { p.cancels.Add(1); return nil },
		}
	default:
		m := &managedFake{path: path, argv: in.Command.Argv(), env: env, dir: dir, cancels: &p.cancels}
		prep = &sandbox.ManagedPrepared{PreparedCommon: common, Start: m.start, Cancel: m.cancel}
	}
	if p.Mutate != nil {
		p.Mutate(prep)
	}
	return prep, nil
}

// managedFake serves the managed contract with a local process group.
type managedFake struct {
	path, dir string
	argv, env []string
	cancels   *atomic.Int64

	mu  sync.Mutex
	cmd *exec.Cmd
}

func (m *managedFake) start(context.Context) (*sandbox.ManagedExecutionSession, error) {
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		outR.Close()
		outW.Close()
		return nil, err
	}
	cmd := &exec.Cmd{Path: m.path, Args: m.argv, Env: m.env, Dir: m.dir, Stdin: inR, Stdout: outW, Stderr: errW,
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}}
	err = pdeath.Start(cmd)
	inR.Close()
	outW.Close()
	errW.Close()
	if err != nil {
		inW.Close()
		outR.Close()
		errR.Close()
		return nil, fmt.Errorf("%w: %w", sandbox.ErrNotStarted, err)
	}
	m.mu.Lock()
	m.cmd = cmd
	m.mu.Unlock()
	s, settle := sandbox.NewManagedSession(inW, outR, errR)
	go func() {
		err := cmd.Wait()
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
		switch {
		case ws.Signaled():
			settle(sandbox.ExitSignal(signalName(ws.Signal())), nil)
		case ws.Exited():
			settle(sandbox.ExitCode(ws.ExitStatus()), nil)
		default:
			settle(sandbox.Exit{}, fmt.Errorf("%w: %v", sandbox.ErrTransport, err))
		}
	}()
	return s, nil
}

func (m *managedFake) cancel(context.Context) error {
	m.cancels.Add(1)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd != nil {
		_ = syscall.Kill(-m.cmd.Process.Pid, syscall.SIGKILL)
	}
	return nil
}
