// Package lease implements provider-side leases on the corral store.
//
// A lease is minted by preparation before anything starts, heartbeated by
// whoever holds the work, and ends exactly once: released by its holder, or
// expired because its heartbeats stopped for its TTL. Leases live in the
// store, so the daemon and every runner process see the same table; any
// process's reconciler (Manager.Run) may expire any process's stale lease,
// and each process cancels the work it registered under its own leases
// (Lease.Watch) when it sees them expire. No command therefore outlives its
// lease by much more than the TTL plus one sweep interval, even if its
// holder died.
//
// Live leases block project deletion (store.ErrProjectBusy).
package lease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/store"
)

// Defaults for Options' zero values.
const (
	DefaultTTL             = 15 * time.Second
	DefaultSweepInterval   = 3 * time.Second
	DefaultHeartbeatWindow = 250 * time.Millisecond
)

var (
	// ErrExpired: the lease expired (its heartbeats stopped for its TTL).
	ErrExpired = errors.New("lease: expired")
	// ErrReleased: the lease was released.
	ErrReleased = errors.New("lease: released")
)

// Options configure a Manager. The zero value is usable.
type Options struct {
	// TTL is how long a lease lives without a heartbeat. If zero, 15 s
	// (three missed beats at RunCommand's 5 s interval).
	TTL time.Duration

	// SweepInterval is how often Run sweeps for stale leases. If zero, 3 s.
	SweepInterval time.Duration

	// HeartbeatWindow is how long a heartbeat waits for others to share
	// its store transaction: heartbeats that arrive within one window are
	// written together, which makes them far cheaper. It delays every
	// Heartbeat call by up to the window, so it must stay well below the
	// heartbeat interval. A window that gathers 2000 heartbeats is
	// written at once. If zero, 250 ms; if negative, every heartbeat is
	// written on its own, at once.
	HeartbeatWindow time.Duration

	// Now is the clock that decides expiry. If nil, the store's clock.
	Now func() time.Time

	// Logger receives diagnostics. If nil, slog.Default().
	Logger *slog.Logger

	// Holder names this process in the leases it acquires. If empty,
	// "pid N on HOST".
	Holder string

	// OnExpired, if set, is called for every lease this manager marks
	// expired, whichever process held it (the journal marks that lease's
	// commands interrupted). It is called synchronously from Sweep (or from
	// the Heartbeat or Release call that noticed the expiry) and should not
	// block for long: the next lease's expiry waits for it.
	OnExpired func(store.Lease)
	// OnSweep, if set, is called at the end of every Sweep with the sweep's
	// time (core closes the journal entries of leases released by a process
	// that died before journaling their end). Like OnExpired it should not
	// block for long.
	OnSweep func(ctx context.Context, now time.Time)
}

// Manager acquires leases and reconciles them. Its methods are safe for
// concurrent use. A Manager starts no goroutine of its own except while
// Run runs and while heartbeats wait for their shared transaction.
type Manager struct {
	st     store.Store
	ttl    time.Duration
	sweep  time.Duration
	window time.Duration
	// maxBatch caps the heartbeats written in one transaction.
	maxBatch int
	now      func() time.Time
	log      *slog.Logger
	holder   string
	hook     func(store.Lease)

	mu      sync.Mutex
	held    map[string]*Lease // live leases acquired here
	onSweep func(context.Context, time.Time)
	pending *beatBatch // heartbeats waiting for the window to close

	ka keepAlive // leases heartbeated by the manager's loop (KeepAlive)
}

// NewManager returns a Manager for the leases in st.
func NewManager(st store.Store, opts Options) *Manager {
	m := &Manager{
		st: st, ttl: opts.TTL, sweep: opts.SweepInterval, window: opts.HeartbeatWindow,
		now: opts.Now, log: opts.Logger, holder: opts.Holder, hook: opts.OnExpired, onSweep: opts.OnSweep,
		held: make(map[string]*Lease), maxBatch: defaultMaxBatch,
	}
	if m.ttl <= 0 {
		m.ttl = DefaultTTL
	}
	if m.sweep <= 0 {
		m.sweep = DefaultSweepInterval
	}
	if m.window == 0 {
		m.window = DefaultHeartbeatWindow
	}
	if m.now == nil {
		m.now = st.Now
	}
	if m.log == nil {
		m.log = slog.Default()
	}
	if m.holder == "" {
		host, _ := os.Hostname()
		m.holder = fmt.Sprintf("pid %d on %s", os.Getpid(), host)
	}
	return m
}

// TTL returns the lease time-to-live.
func (m *Manager) TTL() time.Duration { return m.ttl }

// Holder returns the name this manager writes as the holder of the
// leases it acquires (Options.Holder, or "pid N on HOST").
func (m *Manager) Holder() string { return m.holder }

// AcquireRequest describes a lease to acquire.
type AcquireRequest struct {
	Account int64             // the actor's AccountUserID
	Project int64             // the project's ID; it must exist in the store
	Kind    sandbox.LeaseKind // one of the declared kinds
	// Domain is the domain of the plugin the work is done for; empty for
	// core's own work.
	Domain string
	// TenancyVersion, if nonzero, makes the acquisition fail with an error
	// wrapping store.ErrTenancyChanged if the project or the account's
	// membership changed since that version was read (see
	// store.NewLease.TenancyVersion).
	TenancyVersion int64
	// Journal, if non-nil, is the journal entry of the command the lease
	// covers: it is created with the lease, in the same store write
	// (store.NewLease.Journal), and its ID set in Journal.ID.
	Journal *JournalStart
}

// JournalStart is a command's journal entry to create with its lease
// (AcquireRequest.Journal). Core makes it before the command's
// preparation and hands it to the provider through the preparation's
// context (sandbox.JournalIntent); a provider that does not pass it on
// leaves ID zero, and core then records the start itself.
type JournalStart struct {
	// Command is the entry; its Lease is the new lease's ID.
	Command store.JournalCommand
	// ID is the entry's ID once Acquire created it.
	ID int64
}

// Acquire creates a live lease that expires TTL from now unless heartbeated.
// An invalid kind is refused; an unknown project is an error wrapping
// store.ErrNotFound.
func (m *Manager) Acquire(ctx context.Context, req AcquireRequest) (*Lease, error) {
	if !req.Kind.Valid() {
		return nil, fmt.Errorf("lease: acquire: invalid lease kind %q", req.Kind)
	}
	n := store.NewLease{
		Account: req.Account, Project: req.Project, Kind: string(req.Kind), Domain: req.Domain,
		Holder: m.holder, TTL: m.ttl, TenancyVersion: req.TenancyVersion,
	}
	if req.Journal != nil {
		n.Journal = &req.Journal.Command
	}
	row, err := m.st.CreateLease(ctx, n, m.now())
	if err != nil {
		return nil, fmt.Errorf("lease: acquire: %w", err)
	}
	if req.Journal != nil {
		req.Journal.ID = row.Journal
	}
	l := &Lease{m: m, row: row, state: store.LeaseLive, deadline: row.ExpiresAt}
	m.mu.Lock()
	m.held[row.ID] = l
	m.mu.Unlock()
	return l, nil
}

// LiveCount returns the number of live leases in the store, across all
// processes.
func (m *Manager) LiveCount(ctx context.Context) (int, error) {
	n, err := m.st.LiveLeaseCount(ctx)
	if err != nil {
		return 0, fmt.Errorf("lease: %w", err)
	}
	return n, nil
}

// Held returns the number of live leases acquired by this manager.
func (m *Manager) Held() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.held)
}

// Sweep expires every overdue lease in the store (whoever holds it), calls
// OnExpired for each, and calls the Watch callbacks of this manager's
// leases that expired, whether this sweep or another process expired them.
// It returns the leases this call expired. Each Watch callback runs at most
// once, and OnExpired runs once per lease across all processes.
func (m *Manager) Sweep(ctx context.Context) ([]store.Lease, error) {
	now := m.now()
	expired, err := m.st.ExpireLeases(ctx, now)
	if err != nil {
		return nil, fmt.Errorf("lease: sweep: %w", err)
	}
	for _, row := range expired {
		m.mu.Lock()
		l := m.held[row.ID]
		m.mu.Unlock()
		if l != nil {
			l.expired()
		}
		if m.hook != nil {
			m.hook(row)
		}
		m.log.InfoContext(ctx, "lease expired", "lease", row.ID, "project", row.Project,
			"account", row.Account, "kind", row.Kind, "holder", row.Holder)
	}
	if m.onSweep != nil {
		m.onSweep(ctx, now)
	}

	// Leases held here that are past their deadline but were not expired by
	// this sweep: another process may have expired them.
	var overdue []string
	m.mu.Lock()
	for id, l := range m.held {
		if l.overdue(now) {
			overdue = append(overdue, id)
		}
	}
	m.mu.Unlock()
	if len(overdue) == 0 {
		return expired, nil
	}
	rows, err := m.st.LeasesByID(ctx, overdue)
	if err != nil {
		return expired, fmt.Errorf("lease: sweep: %w", err)
	}
	for _, id := range overdue {
		row, ok := rows[id]
		m.mu.Lock()
		l := m.held[id]
		m.mu.Unlock()
		if l == nil {
			continue
		}
		switch {
		case !ok || row.State == store.LeaseExpired:
			// Gone (its project deleted) or expired elsewhere.
			l.expired()
		case row.State == store.LeaseReleased:
			l.released()
		}
	}
	return expired, nil
}

// Run sweeps every SweepInterval until ctx is done, then returns nil. A
// failed sweep is logged and retried at the next tick.
func (m *Manager) Run(ctx context.Context) error {
	t := time.NewTicker(m.sweep)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if _, err := m.Sweep(ctx); err != nil && ctx.Err() == nil {
				m.log.WarnContext(ctx, "lease sweep failed", "err", err)
			}
		}
	}
}

// InterruptJournal returns an Options.OnExpired hook that marks the
// journal entries still running under an expired lease interrupted: their
// commands were cancelled (or their holder died) and will never report an
// end. Failures are logged (to slog.Default() if log is nil).
func InterruptJournal(st store.Store, log *slog.Logger) func(store.Lease) {
	if log == nil {
		log = slog.Default()
	}
	return func(l store.Lease) {
		ctx, cancel := context.WithTimeout(context.Background(), flushTimeout)
		defer cancel()
		if _, err := st.JournalInterrupt(ctx, l.ID, "lease expired"); err != nil {
			log.Warn("journal: cannot mark the commands of an expired lease interrupted", "lease", l.ID, "err", err)
		}
	}
}

func (m *Manager) forget(id string) {
	m.mu.Lock()
	delete(m.held, id)
	m.mu.Unlock()
}

// Lease is a lease acquired by a Manager. It implements sandbox.Lease. Its
// methods are safe for concurrent use.
type Lease struct {
	m   *Manager
	row store.Lease // as created; immutable

	mu       sync.Mutex
	state    store.LeaseState // as this process last saw it
	deadline time.Time        // expiry as of the last successful heartbeat
	watchers []func()
}

var _ sandbox.Lease = (*Lease)(nil)

// ID returns the lease's ID (a UUID).
func (l *Lease) ID() string { return l.row.ID }

// AccountUserID returns the account the lease was acquired for.
func (l *Lease) AccountUserID() int64 { return l.row.Account }

// Kind returns the lease kind.
func (l *Lease) Kind() sandbox.LeaseKind { return sandbox.LeaseKind(l.row.Kind) }

// ProjectID returns the project the lease covers.
func (l *Lease) ProjectID() int64 { return l.row.Project }

// Domain returns the plugin domain the lease was acquired under.
func (l *Lease) Domain() string { return l.row.Domain }

// Created returns when the lease was acquired.
func (l *Lease) Created() time.Time { return l.row.Created }

// Deadline returns when the lease expires unless heartbeated, as of its
// last successful heartbeat in this process.
func (l *Lease) Deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

// Watch registers cancel to be called once if the lease expires: when a
// sweep (of this or another process) expires it, or when Heartbeat or
// Release finds it expired. It is never called after a successful Release.
// cancel runs in a goroutine of its own, so it may block (to cancel a
// session through the worker, say) without holding up the reconciler; if
// the lease is already known to have expired, that goroutine starts before
// Watch returns. Watch may be called more than once; each callback runs at
// most once.
func (l *Lease) Watch(cancel func()) {
	l.mu.Lock()
	switch l.state {
	case store.LeaseLive:
		l.watchers = append(l.watchers, cancel)
		l.mu.Unlock()
	case store.LeaseExpired:
		l.mu.Unlock()
		go cancel()
	default:
		l.mu.Unlock()
	}
}

// Heartbeat extends the lease to expire TTL from now. It may wait up to the
// manager's HeartbeatWindow to share a store transaction with other
// heartbeats. It fails with an error wrapping ErrExpired if the lease
// expired or is past its deadline (and then marks it expired and cancels
// its watchers), ErrReleased if it was released, or the store's error (the
// lease is then not extended, and expires if the failures last its TTL).
// If ctx ends first, Heartbeat returns ctx's error; the heartbeat may still
// be written.
func (l *Lease) Heartbeat(ctx context.Context) error {
	l.mu.Lock()
	state := l.state
	l.mu.Unlock()
	switch state {
	case store.LeaseReleased:
		return fmt.Errorf("lease %s: heartbeat: %w", l.row.ID, ErrReleased)
	case store.LeaseExpired:
		return fmt.Errorf("lease %s: heartbeat: %w", l.row.ID, ErrExpired)
	}
	err := l.m.heartbeat(ctx, l)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, store.ErrLeaseExpired), errors.Is(err, store.ErrNotFound):
		l.m.noticeExpired(ctx, l)
		return fmt.Errorf("lease %s: heartbeat: %w (%w)", l.row.ID, ErrExpired, err)
	case errors.Is(err, store.ErrLeaseReleased):
		l.released()
		return fmt.Errorf("lease %s: heartbeat: %w", l.row.ID, ErrReleased)
	}
	return fmt.Errorf("lease %s: heartbeat: %w", l.row.ID, err)
}

// Release ends the lease and forgets its watchers. It is idempotent:
// releasing a released lease returns nil. Releasing a lease that expired,
// or is past its deadline, does not hide it: the error wraps ErrExpired
// (and the lease is marked expired, its watchers cancelled). On a store
// failure the lease stays live and Release may be retried.
func (l *Lease) Release(ctx context.Context) error {
	_, err := l.release(ctx, func(at time.Time) (bool, error) {
		return false, l.m.st.ReleaseHeldLease(ctx, l.row.ID, at)
	})
	return err
}

// ReleaseAndFinish releases the lease exactly as Release does and, in the
// same store write, records the end of the command of journal entry id
// (store.ReleaseAndFinish): one write for a command's end instead of two.
// journaled reports that the entry was finished with the release; when it
// is false (the lease was released already, or could not be released:
// then err says why, as from Release) the entry was not touched and the
// caller journals the end on its own.
func (l *Lease) ReleaseAndFinish(ctx context.Context, id int64, end store.JournalEnd) (journaled bool, err error) {
	return l.release(ctx, func(at time.Time) (bool, error) {
		return l.m.st.ReleaseAndFinish(ctx, l.row.ID, at, id, end)
	})
}

// release is Release with the store's release write given: write releases
// the lease at the given time and reports what else it recorded.
func (l *Lease) release(ctx context.Context, write func(at time.Time) (bool, error)) (bool, error) {
	l.mu.Lock()
	state := l.state
	l.mu.Unlock()
	switch state {
	case store.LeaseReleased:
		return false, nil
	case store.LeaseExpired:
		return false, fmt.Errorf("lease %s: release: %w", l.row.ID, ErrExpired)
	}
	ok, err := write(l.m.now())
	switch {
	case err == nil:
		l.released()
		return ok, nil
	case errors.Is(err, store.ErrLeaseExpired), errors.Is(err, store.ErrNotFound):
		l.m.noticeExpired(ctx, l)
		return false, fmt.Errorf("lease %s: release: %w (%w)", l.row.ID, ErrExpired, err)
	}
	return false, fmt.Errorf("lease %s: release: %w", l.row.ID, err)
}

// noticeExpired handles a lease its holder found expired or overdue: a
// sweep marks it (and any other overdue lease) expired in the store and
// runs the hooks; the lease's own watchers run even if the sweep fails.
func (m *Manager) noticeExpired(ctx context.Context, l *Lease) {
	if _, err := m.Sweep(context.WithoutCancel(ctx)); err != nil {
		m.log.WarnContext(ctx, "lease sweep failed", "lease", l.row.ID, "err", err)
	}
	l.expired()
}

// expired marks the lease expired locally and runs its watchers, once.
func (l *Lease) expired() {
	l.mu.Lock()
	if l.state != store.LeaseLive {
		l.mu.Unlock()
		return
	}
	l.state = store.LeaseExpired
	ws := l.watchers
	l.watchers = nil
	l.mu.Unlock()
	l.m.forget(l.row.ID)
	if len(ws) > 0 {
		go func() {
			for _, w := range ws {
				w()
			}
		}()
	}
}

// released marks the lease released locally and drops its watchers.
func (l *Lease) released() {
	l.mu.Lock()
	if l.state == store.LeaseLive {
		l.state = store.LeaseReleased
		l.watchers = nil
	}
	l.mu.Unlock()
	l.m.forget(l.row.ID)
}

func (l *Lease) overdue(now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.state == store.LeaseLive && l.deadline.Before(now)
}

func (l *Lease) extend(deadline time.Time) {
	l.mu.Lock()
	if deadline.After(l.deadline) {
		l.deadline = deadline
	}
	l.mu.Unlock()
}

// defaultMaxBatch caps the heartbeats written in one transaction.
const defaultMaxBatch = 2000

// beatBatch is a group of heartbeats written in one store transaction.
type beatBatch struct {
	once   sync.Once
	leases []*Lease
	done   chan struct{} // closed when errs and err are set
	errs   []error
	err    error
}

// heartbeat writes l's heartbeat, batched with others arriving within the
// window, and returns the store's verdict for it.
func (m *Manager) heartbeat(ctx context.Context, l *Lease) error {
	if m.window < 0 {
		at := m.now()
		if err := m.st.HeartbeatLease(ctx, l.row.ID, at); err != nil {
			return err
		}
		l.extend(at.Add(l.row.TTL))
		return nil
	}
	m.mu.Lock()
	b := m.pending
	if b == nil {
		b = &beatBatch{done: make(chan struct{})}
		m.pending = b
		time.AfterFunc(m.window, func() { m.flush(b) })
	}
	i := len(b.leases)
	b.leases = append(b.leases, l)
	full := len(b.leases) >= m.maxBatch
	if full {
		m.pending = nil // later heartbeats start a new batch
	}
	m.mu.Unlock()
	if full {
		go m.flush(b) // the timer's flush will find the batch already done
	}
	select {
	case <-b.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	if b.err != nil {
		return b.err
	}
	return b.errs[i]
}

// flushTimeout bounds a batch's store transaction; it exceeds the store's
// busy timeout so that a busy database reports SQLITE_BUSY first.
const flushTimeout = 30 * time.Second

func (m *Manager) flush(b *beatBatch) {
	b.once.Do(func() { m.flushOnce(b) })
}

func (m *Manager) flushOnce(b *beatBatch) {
	m.mu.Lock()
	if m.pending == b {
		m.pending = nil
	}
	m.mu.Unlock()
	ids := make([]string, len(b.leases))
	for i, l := range b.leases {
		ids[i] = l.row.ID
	}
	ctx, cancel := context.WithTimeout(context.Background(), flushTimeout)
	defer cancel()
	at := m.now()
	b.errs, b.err = m.st.HeartbeatLeases(ctx, ids, at)
	if b.err == nil {
		for i, l := range b.leases {
			if b.errs[i] == nil {
				l.extend(at.Add(l.row.TTL))
			}
		}
	}
	close(b.done)
}
