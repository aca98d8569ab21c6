package sandbox

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Admission control. A Control with an Admitter (ControlOptions.Admitter)
// asks it before every RunCommand (kind AdmitCommand, reserving the
// command's output limits: the bytes its capture may hold) and every Open
// or PrepareExecution (kind AdmitSession: WebSocket sessions, terminals,
// language servers), before anything is prepared. A refusal wraps ErrBusy and is
// returned as a KindPrepare CommandError: nothing was prepared, no lease
// exists. The reservation is given back when the work settled: when
// RunCommand returns, or when a session's lease is released.
//
// A caller that keeps a command's output after RunCommand returned (the
// daemon, while it writes a response of tens of MiB) reserves the command
// itself with Control.Admit and passes the ticket in the context
// (WithTicket): RunCommand then uses the ticket instead of reserving again,
// and the caller releases it once the output is gone.
//
// The budget lives in the Control so that every consumer of one process —
// the daemon's HTTP API, the runner, the CLI, plugins — shares it.

// AdmissionKind says what is admitted.
type AdmissionKind string

// The kinds of admission.
const (
	AdmitCommand AdmissionKind = "command" // a RunCommand call
	AdmitSession AdmissionKind = "session" // an Open or PrepareExecution call (a long-lived session)
	// AdmitInput reserves Bytes of a request's input the caller holds in
	// memory (the daemon's command stdin) against the captured-bytes
	// budget; it counts no command.
	AdmitInput AdmissionKind = "input"
)

// Admission is what a command or session asks for.
type Admission struct {
	Kind    AdmissionKind
	Account int64 // the actor's account
	// Bytes is the captured output the command may hold: the sum of its
	// stream limits (Stdout+Stderr, or Combined). Zero for sessions, whose
	// output is forwarded, not captured.
	Bytes int64
}

// Admitter decides whether work may start.
type Admitter interface {
	// Admit reserves what a asks for and returns the function that gives
	// it back, or an error wrapping ErrBusy (and reserves nothing). The
	// release function is called exactly once. Admit must not block for
	// long: it is called on every command's path.
	Admit(ctx context.Context, a Admission) (release func(), err error)
}

// Budget bounds what may be in flight at once. A zero field is unlimited.
type Budget struct {
	// CapturedBytes bounds the sum of the output limits of running
	// commands (a command asking 64 MiB per stream reserves 128 MiB).
	CapturedBytes int64
	// Commands bounds concurrent RunCommand calls.
	Commands int
	// Sessions bounds concurrent sessions (prepared executions that are
	// not RunCommand's: WebSocket sessions, language servers).
	Sessions int
}

// Usage is what is in flight.
type Usage struct {
	CapturedBytes int64
	Commands      int
	Sessions      int
}

// Limiter is an Admitter with a global Budget and a Budget per account. It
// is safe for concurrent use; the zero value admits everything.
type Limiter struct {
	Global     Budget
	PerAccount Budget

	mu       sync.Mutex
	total    Usage
	accounts map[int64]*Usage
}

// NewLimiter returns a Limiter with the given budgets.
func NewLimiter(global, perAccount Budget) *Limiter {
	return &Limiter{Global: global, PerAccount: perAccount}
}

// Admit implements Admitter: it refuses (ErrBusy) work that would take the
// global or the account's usage over its budget. A command that reserves
// more than a budget in all is refused the same way (it could never run).
func (l *Limiter) Admit(_ context.Context, a Admission) (func(), error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	acct := l.accounts[a.Account]
	if acct == nil {
		acct = &Usage{}
	}
	if err := over(l.Global, l.total, a, "the daemon's"); err != nil {
		return nil, err
	}
	if err := over(l.PerAccount, *acct, a, fmt.Sprintf("account %d's", a.Account)); err != nil {
		return nil, err
	}
	if l.accounts == nil {
		l.accounts = make(map[int64]*Usage)
	}
	l.accounts[a.Account] = acct
	add(&l.total, a, 1)
	add(acct, a, 1)
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			add(&l.total, a, -1)
			add(acct, a, -1)
			if *acct == (Usage{}) {
				delete(l.accounts, a.Account)
			}
		})
	}, nil
}

// Usage returns the global usage and account's.
func (l *Limiter) Usage(account int64) (global, acct Usage) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if u := l.accounts[account]; u != nil {
		acct = *u
	}
	return l.total, acct
}

func add(u *Usage, a Admission, sign int) {
	switch a.Kind {
	case AdmitCommand:
		u.Commands += sign
		u.CapturedBytes += int64(sign) * a.Bytes
	case AdmitSession:
		u.Sessions += sign
	case AdmitInput:
		u.CapturedBytes += int64(sign) * a.Bytes
	}
}

// over reports why a does not fit budget b given usage u.
func over(b Budget, u Usage, a Admission, whose string) error {
	switch a.Kind {
	case AdmitCommand:
		if b.Commands > 0 && u.Commands+1 > b.Commands {
			return fmt.Errorf("%w: %s budget of %d concurrent commands is exhausted; retry later", ErrBusy, whose, b.Commands)
		}
		if b.CapturedBytes > 0 && a.Bytes > b.CapturedBytes {
			return fmt.Errorf("%w: the command's output limits (%d bytes) exceed %s budget of %d captured bytes; ask for smaller limits", ErrBusy, a.Bytes, whose, b.CapturedBytes)
		}
		if b.CapturedBytes > 0 && u.CapturedBytes+a.Bytes > b.CapturedBytes {
			return fmt.Errorf("%w: %s budget of %d captured bytes is exhausted (%d in flight, this command reserves %d); retry later", ErrBusy, whose, b.CapturedBytes, u.CapturedBytes, a.Bytes)
		}
	case AdmitSession:
		if b.Sessions > 0 && u.Sessions+1 > b.Sessions {
			return fmt.Errorf("%w: %s budget of %d concurrent sessions is exhausted; retry later", ErrBusy, whose, b.Sessions)
		}
	case AdmitInput:
		if b.CapturedBytes > 0 && u.CapturedBytes+a.Bytes > b.CapturedBytes {
			return fmt.Errorf("%w: %s budget of %d captured bytes cannot hold the request's input (%d in flight, this input reserves %d); retry later or send less", ErrBusy, whose, b.CapturedBytes, u.CapturedBytes, a.Bytes)
		}
	}
	return nil
}

// Ticket is a reservation made with Control.Admit.
type Ticket struct {
	admitter Admitter
	a        Admission
	release  func()
	mu       sync.Mutex
	used     bool
	released bool
}

// Release gives the reservation back. It is idempotent; a nil Ticket does
// nothing.
func (t *Ticket) Release() {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.released {
		t.released = true
		if t.release != nil {
			t.release()
		}
	}
}

// use claims t for one call that asks for a; it reports false if t is
// spent, released, from another admitter or too small.
func (t *Ticket) use(ad Admitter, a Admission) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.used || t.released || t.admitter != ad || t.a.Kind != a.Kind || t.a.Account != a.Account || t.a.Bytes < a.Bytes {
		return false
	}
	t.used = true
	return true
}

type ticketKey struct{}

// WithTicket returns a context that carries t: the next RunCommand (or
// PrepareExecution, for a session ticket) of the Control that issued it,
// for the same account and within its bytes, uses it instead of reserving.
// The caller still releases t.
func WithTicket(ctx context.Context, t *Ticket) context.Context {
	return context.WithValue(ctx, ticketKey{}, t)
}

// Admit reserves a with c's Admitter and returns the ticket (a ticket that
// reserves nothing when c has no Admitter). A refusal is a KindPrepare
// CommandError wrapping ErrBusy.
func (c *Control) Admit(ctx context.Context, a Admission) (*Ticket, error) {
	t := &Ticket{admitter: c.opts.Admitter, a: a}
	if c.opts.Admitter == nil {
		return t, nil
	}
	rel, err := c.opts.Admitter.Admit(ctx, a)
	if err != nil {
		return nil, newError(KindPrepare, err, "%v", err)
	}
	t.release = rel
	return t, nil
}

// admit reserves a for one call: through the context's ticket if it covers
// a, else with the Admitter. The returned release is never nil.
func (c *Control) admit(ctx context.Context, a Admission) (func(), *CommandError) {
	if c.opts.Admitter == nil {
		return func() {}, nil
	}
	if t, ok := ctx.Value(ticketKey{}).(*Ticket); ok && t != nil && t.use(c.opts.Admitter, a) {
		return func() {}, nil
	}
	rel, err := c.opts.Admitter.Admit(ctx, a)
	if err != nil {
		return nil, newError(KindPrepare, err, "%v", err)
	}
	return rel, nil
}

// reservedBytes is what a command with limit l reserves.
func reservedBytes(l OutputLimit) int64 {
	if l.Combined > 0 {
		return l.Combined
	}
	return l.Stdout + l.Stderr
}

// admittedLease gives a session's reservation back when its lease is
// released (the first Release call, whatever its outcome).
type admittedLease struct {
	Lease
	once    sync.Once
	release func()
}

func (l *admittedLease) Release(ctx context.Context) error {
	err := l.Lease.Release(ctx)
	l.once.Do(l.release)
	return err
}

// admittedKeepAliver is an admittedLease over a lease that keeps itself
// alive.
type admittedKeepAliver struct {
	*admittedLease
	ka KeepAliver
}

func (l admittedKeepAliver) KeepAlive(interval time.Duration, failed func(error)) (stop func()) {
	return l.ka.KeepAlive(interval, failed)
}

func wrapAdmitted(l Lease, release func()) Lease {
	al := &admittedLease{Lease: l, release: release}
	if ka, ok := l.(KeepAliver); ok {
		return admittedKeepAliver{al, ka}
	}
	return al
}
