package egress

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/corral-sandbox/corral/machine"
	"github.com/corral-sandbox/corral/store"
)

// LoadPolicy returns project's stored policy (the zero Policy, mode none,
// when none was stored).
func LoadPolicy(ctx context.Context, st store.Store, project int64) (Policy, error) {
	s, err := st.EgressPolicy(ctx, project)
	if err != nil {
		return Policy{Mode: ModeNone}, err
	}
	return parseStored(project, s)
}

// parseStored parses project's stored policy JSON ("": mode none).
func parseStored(project int64, s string) (Policy, error) {
	if s == "" {
		return Policy{Mode: ModeNone}, nil
	}
	var p Policy
	if err := json.Unmarshal([]byte(s), &p); err != nil {
		return Policy{}, fmt.Errorf("egress: stored policy of project %d: %w", project, err)
	}
	return p.Normalized(), nil
}

// StorePolicy validates p and stores it for project (normalized). Errors
// wrap ErrBadPolicy for a bad policy, store.ErrNotFound for an unknown
// project.
func StorePolicy(ctx context.Context, st store.Store, project int64, p Policy) (Policy, error) {
	p = p.Normalized()
	if _, err := p.Compile(); err != nil {
		return Policy{}, err
	}
	b, err := json.Marshal(p)
	if err != nil {
		return Policy{}, err
	}
	return p, st.SetEgressPolicy(ctx, project, string(b))
}

// Gateway is what the Manager needs of machine.Gateway: listeners in a
// machine, and sessions (to start a machine that does not run yet).
type Gateway interface {
	Listener
	Exec(ctx context.Context, req machine.ExecRequest) (*machine.Session, error)
}

// ManagerOptions configure a Manager.
type ManagerOptions struct {
	// Service configures the proxies (floor, resolver, limits). Its Audit,
	// if set, is called after the Manager journaled a record.
	Service Options
	// Store holds the policies and receives the journal rows. Required.
	Store store.Store
	// Gateway reaches the machines. Required.
	Gateway Gateway
	// Poll is how often the policies of live machines are re-read; 0
	// means one second.
	Poll time.Duration
	// StartArgv is the command run to start a machine that does not run
	// yet, before its proxies are armed, under the lease of the session
	// that needs the proxies; nil means ["true"].
	StartArgv []string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Manager is core's egress service: for every project with managed
// sessions running it keeps the policy of the project's machine current
// (re-read every Poll, and at once on PolicyChanged) and, while the policy
// is mode proxy, the machine's proxies armed. Create it with NewManager;
// its methods are safe for concurrent use.
//
// Listener lifetime: the listeners are core's descriptors from Arm until
// the project's last session ends (or the policy leaves mode proxy, or
// Close): then they are closed. The worker stops an idle machine later; a
// new session re-arms the new machine.
type Manager struct {
	svc   *Service
	st    store.Store
	gw    Gateway
	log   *slog.Logger
	poll  time.Duration
	start []string
	audit func(Record)

	mu       sync.Mutex
	closed   bool
	machines map[int64]*managed
	stop     chan struct{}
	done     chan struct{}
}

// take returns the policy to apply: pol read at version ver, or the one
// e has if it was read later (a session prepared before a policy change
// may start after the change was applied). Called with mg.mu held.
func (e *managed) take(pol Policy, ver int64) Policy {
	if ver < e.version {
		return e.policy
	}
	e.policy, e.version = pol, ver
	return pol
}

type managed struct {
	project  machine.Project
	account  int64
	sessions int
	policy   Policy
	version  int64    // the project's tenancy version policy was read at (store.Tenancy.Version)
	m        *Machine // nil unless armed
	arming   chan struct{}
}

// NewManager returns a Manager and starts its poller.
func NewManager(opts ManagerOptions) (*Manager, error) {
	if opts.Store == nil || opts.Gateway == nil {
		return nil, errors.New("egress: a store and a gateway are required")
	}
	mg := &Manager{st: opts.Store, gw: opts.Gateway, log: opts.Logger, poll: opts.Poll, start: opts.StartArgv,
		audit: opts.Service.Audit, machines: make(map[int64]*managed), stop: make(chan struct{}), done: make(chan struct{})}
	if mg.log == nil {
		mg.log = slog.Default()
	}
	if mg.poll <= 0 {
		mg.poll = time.Second
	}
	if mg.start == nil {
		mg.start = []string{"true"}
	}
	sopts := opts.Service
	sopts.Audit = mg.journal
	if sopts.Logger == nil {
		sopts.Logger = mg.log
	}
	svc, err := NewService(sopts)
	if err != nil {
		return nil, err
	}
	mg.svc = svc
	go mg.run()
	return mg, nil
}

// journal writes r to the store, then passes it on.
func (mg *Manager) journal(r Record) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := mg.st.AppendEgress(ctx, store.EgressEntry{Account: r.Account, Project: r.Project, Protocol: r.Protocol,
		Name: r.Name, Addr: r.Addr, Port: r.Port, Verdict: r.Verdict, Rule: r.Rule, Error: r.Error,
		BytesIn: r.BytesIn, BytesOut: r.BytesOut, StartedAt: r.Start, Duration: r.Duration}); err != nil {
		mg.log.Error("egress journal", "project", r.Project, "err", err)
	}
	if mg.audit != nil {
		mg.audit(r)
	}
}

// Session is called before a managed session of project p starts (for
// account, under lease, the session's lease ID): it counts the session
// and, when the project's policy is mode proxy, arms the machine's proxies
// first (starting the machine with StartArgv, under the same lease, when it
// does not run yet) and returns the proxy environment to
// add to the session's. The caller calls release once the session ended
// (or did not start); release is idempotent. An error (the machine could
// not be armed) leaves nothing counted: the session should not run, as it
// would find no proxy.
func (mg *Manager) Session(ctx context.Context, p machine.Project, account int64, lease string) (env map[string]string, release func(), err error) {
	return mg.session(ctx, p, account, lease, func() (Policy, int64, error) { return mg.load(ctx, p.ID) })
}

// load reads project's stored policy and its version.
func (mg *Manager) load(ctx context.Context, project int64) (Policy, int64, error) {
	s, ver, err := mg.st.EgressPolicyAt(ctx, project)
	if err != nil {
		return Policy{Mode: ModeNone}, 0, err
	}
	pol, err := parseStored(project, s)
	return pol, ver, err
}

// SessionPolicy is Session under the project's stored policy as the caller
// read it (the JSON of store.Tenancy.EgressPolicy, "" for mode none),
// instead of reading it again: the caller must know it is current, as a
// preparation does whose lease insert confirmed the tenancy version of that
// read (a policy change bumps it). version is that version
// (store.Tenancy.Version): a policy the Manager applied meanwhile from a
// later read (the poller, PolicyChanged) is kept instead.
func (mg *Manager) SessionPolicy(ctx context.Context, p machine.Project, account int64, lease, stored string, version int64) (env map[string]string, release func(), err error) {
	return mg.session(ctx, p, account, lease, func() (Policy, int64, error) {
		pol, err := parseStored(p.ID, stored)
		return pol, version, err
	})
}

func (mg *Manager) session(ctx context.Context, p machine.Project, account int64, lease string, load func() (Policy, int64, error)) (env map[string]string, release func(), err error) {
	mg.mu.Lock()
	if mg.closed {
		mg.mu.Unlock()
		return nil, nil, errors.New("egress: manager closed")
	}
	e := mg.machines[p.ID]
	if e == nil {
		e = &managed{project: p, account: account}
		mg.machines[p.ID] = e
	}
	e.sessions++
	mg.mu.Unlock()
	var once sync.Once
	release = func() { once.Do(func() { mg.release(p.ID) }) }

	pol, ver, err := load()
	if err != nil {
		release()
		return nil, nil, err
	}
	mg.mu.Lock()
	pol = e.take(pol, ver)
	mg.mu.Unlock()
	if pol.Mode != ModeProxy {
		return nil, release, nil
	}
	if err := mg.arm(ctx, e, pol, ver, lease); err != nil {
		release()
		return nil, nil, err
	}
	return Env(), release, nil
}

// release uncounts a session; the last one disarms the machine.
func (mg *Manager) release(project int64) {
	mg.mu.Lock()
	e := mg.machines[project]
	if e == nil {
		mg.mu.Unlock()
		return
	}
	e.sessions--
	var m *Machine
	if e.sessions == 0 {
		m, e.m = e.m, nil
		delete(mg.machines, project)
	}
	mg.mu.Unlock()
	if m != nil {
		m.Close()
	}
}

// arm makes sure e's machine has its proxies, under policy pol read at
// version ver, or a later one e has. The machine's policy is set under
// mg.mu, so that of two arms the later read's policy stays. A machine that
// does not run yet is started under lease; with no lease (the poller, a
// policy change) it is not: the next session arms it.
func (mg *Manager) arm(ctx context.Context, e *managed, pol Policy, ver int64, lease string) error {
	for {
		mg.mu.Lock()
		pol = e.take(pol, ver)
		if e.m != nil {
			err := e.m.SetPolicy(pol)
			mg.mu.Unlock()
			return err
		}
		if w := e.arming; w != nil { // another session is arming it
			mg.mu.Unlock()
			select {
			case <-w:
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		w := make(chan struct{})
		e.arming = w
		armedAt := e.version
		mg.mu.Unlock()
		m, err := mg.armNew(ctx, e, pol, lease)
		mg.mu.Lock()
		e.arming = nil
		close(w)
		if err == nil {
			if e.sessions == 0 || mg.closed { // released meanwhile
				mg.mu.Unlock()
				m.Close()
				return errors.New("egress: machine released while arming")
			}
			e.m = m
			if e.version > armedAt { // a later read while arming (mode none refuses all)
				err = m.SetPolicy(e.policy)
			}
		}
		mg.mu.Unlock()
		return err
	}
}

func (mg *Manager) armNew(ctx context.Context, e *managed, pol Policy, lease string) (*Machine, error) {
	m, err := mg.svc.NewMachine(e.account, e.project.ID, pol)
	if err != nil {
		return nil, err
	}
	err = m.Arm(ctx, mg.gw, e.project)
	if errors.Is(err, machine.ErrNoMachine) && lease != "" {
		// Start the machine with a session of its own, covered by the
		// lease of the session that needs the proxies, then arm it: the
		// proxies must listen before that session's program runs.
		s, serr := mg.gw.Exec(ctx, machine.ExecRequest{Project: e.project, Account: e.account, Lease: lease,
			Argv: mg.start, Cwd: machine.GuestWorkspace})
		if serr != nil {
			return nil, fmt.Errorf("egress: start the machine of project %d: %w", e.project.ID, serr)
		}
		s.Stdin.Close()
		s.Wait()
		s.Close()
		err = m.Arm(ctx, mg.gw, e.project)
	}
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("egress: project %d: %w", e.project.ID, err)
	}
	return m, nil
}

// PolicyChanged re-reads project's policy now (the API calls it after
// storing one); the poller does the same every Poll for every live machine.
func (mg *Manager) PolicyChanged(ctx context.Context, project int64) {
	mg.mu.Lock()
	e := mg.machines[project]
	mg.mu.Unlock()
	if e != nil {
		mg.refresh(ctx, e)
	}
}

// refresh applies e's stored policy: arming, updating or disarming.
func (mg *Manager) refresh(ctx context.Context, e *managed) {
	pol, ver, err := mg.load(ctx, e.project.ID)
	if err != nil {
		mg.log.Warn("egress: policy", "project", e.project.ID, "err", err)
		return
	}
	mg.mu.Lock()
	live := e.sessions > 0 && mg.machines[e.project.ID] == e
	if live {
		pol = e.take(pol, ver)
	}
	armed := e.m
	mg.mu.Unlock()
	if !live {
		return
	}
	switch {
	case pol.Mode == ModeProxy:
		if err := mg.arm(ctx, e, pol, ver, ""); err != nil {
			mg.log.Warn("egress: arm", "project", e.project.ID, "err", err)
		}
	case armed != nil:
		mg.mu.Lock()
		if e.m == armed && e.policy.Mode != ModeProxy {
			e.m = nil
		} else {
			armed = nil // re-armed under a later proxy policy meanwhile
		}
		mg.mu.Unlock()
		if armed != nil {
			armed.Close()
		}
	}
}

func (mg *Manager) run() {
	defer close(mg.done)
	t := time.NewTicker(mg.poll)
	defer t.Stop()
	for {
		select {
		case <-mg.stop:
			return
		case <-t.C:
		}
		mg.mu.Lock()
		live := make([]*managed, 0, len(mg.machines))
		for _, e := range mg.machines {
			live = append(live, e)
		}
		mg.mu.Unlock()
		for _, e := range live {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			mg.refresh(ctx, e)
			cancel()
		}
	}
}

// Close stops the poller and disarms every machine. It is idempotent.
func (mg *Manager) Close() error {
	mg.mu.Lock()
	if mg.closed {
		mg.mu.Unlock()
		return nil
	}
	mg.closed = true
	var ms []*Machine
	for _, e := range mg.machines {
		if e.m != nil {
			ms = append(ms, e.m)
			e.m = nil
		}
	}
	mg.mu.Unlock()
	close(mg.stop)
	<-mg.done
	for _, m := range ms {
		m.Close()
	}
	return nil
}
