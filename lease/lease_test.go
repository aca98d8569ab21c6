package lease

import (
	"context"
	"errors"
	"github.com/corral-sandbox/corral/internal/pgtest"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/pdeath"

	"go.uber.org/goleak"

	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/store"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(pgtest.WithServer(m), goleak.IgnoreTopFunction(pdeath.SpawnerFunc))
}

// backends are the store backends the tests that touch the store run on.
var backends = []string{store.SchemeSQLite, store.SchemePostgres}

// storeURL returns the URL of an empty database on backend for t (on
// PostgreSQL, skipping t where no server can run).
func storeURL(t *testing.T, backend string) string {
	if backend == store.SchemePostgres {
		return pgtest.NewDatabase(t)
	}
	return store.DefaultURL(t.TempDir())
}

// eachBackend runs f as a subtest per backend.
func eachBackend(t *testing.T, f func(t *testing.T, backend string)) {
	for _, b := range backends {
		t.Run(b, func(t *testing.T) { f(t, b) })
	}
}

type clock struct {
	mu   sync.Mutex
	t    time.Time
	tick time.Duration // added after every reading
}

func newClock() *clock { return &clock{t: time.UnixMilli(1_800_000_000_000)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.t
	c.t = c.t.Add(c.tick)
	return t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// calls counts the calls of a Watch callback, which runs in a goroutine of
// its own.
type calls struct{ n atomic.Int32 }

func (c *calls) fn() { c.n.Add(1) }

// expect waits for want calls, then checks that no more come.
func (c *calls) expect(t *testing.T, want int32) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for c.n.Load() < want && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
	if got := c.n.Load(); got != want {
		t.Fatalf("callback called %d times; want %d", got, want)
	}
}

type fixture struct {
	st      store.Store
	clock   *clock
	project int64
}

func newFixture(t *testing.T) *fixture { return newFixtureOn(t, store.SchemeSQLite) }

// newFixtureOn is newFixture on backend.
func newFixtureOn(t *testing.T, backend string) *fixture {
	t.Helper()
	c := newClock()
	st, err := store.Open(context.Background(), storeURL(t, backend), store.Options{Migrate: true, Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	p, err := st.CreateProject(context.Background(), store.NewProject{Kind: store.ProjectManaged, Name: "p", Root: "/p"})
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{st: st, clock: c, project: p.ID}
}

func (f *fixture) manager(opts Options) *Manager {
	if opts.Now == nil {
		opts.Now = f.clock.Now
	}
	if opts.HeartbeatWindow == 0 {
		opts.HeartbeatWindow = time.Millisecond
	}
	return NewManager(f.st, opts)
}

func acquire(t *testing.T, m *Manager, project int64) *Lease {
	t.Helper()
	l, err := m.Acquire(context.Background(), AcquireRequest{Account: 42, Project: project, Kind: sandbox.LeaseTerminal, Domain: "sandbox"})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestAcquireHeartbeatRelease(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	m := f.manager(Options{Holder: "test"})
	if m.TTL() != DefaultTTL {
		t.Fatalf("TTL = %v; want %v", m.TTL(), DefaultTTL)
	}
	l := acquire(t, m, f.project)
	if l.ID() == "" || l.AccountUserID() != 42 || l.Kind() != sandbox.LeaseTerminal || l.ProjectID() != f.project || l.Domain() != "sandbox" {
		t.Fatalf("lease = %s %d %s %d %s", l.ID(), l.AccountUserID(), l.Kind(), l.ProjectID(), l.Domain())
	}
	row, err := f.st.GetLease(ctx, l.ID())
	if err != nil || row.State != store.LeaseLive || row.Holder != "test" || !row.ExpiresAt.Equal(f.clock.Now().Add(DefaultTTL)) {
		t.Fatalf("row = %+v, %v", row, err)
	}
	if n, _ := m.LiveCount(ctx); n != 1 || m.Held() != 1 {
		t.Fatalf("LiveCount = %d, Held = %d; want 1, 1", n, m.Held())
	}

	f.clock.Advance(10 * time.Second)
	if err := l.Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	want := f.clock.Now().Add(DefaultTTL)
	if row, _ := f.st.GetLease(ctx, l.ID()); !row.ExpiresAt.Equal(want) || !l.Deadline().Equal(want) {
		t.Fatalf("after heartbeat: expires %v, deadline %v; want %v", row.ExpiresAt, l.Deadline(), want)
	}
	// 20 s after acquisition, 10 s after the beat: still live.
	f.clock.Advance(10 * time.Second)
	if exp, err := m.Sweep(ctx); err != nil || len(exp) != 0 {
		t.Fatalf("Sweep = %v, %v; want nothing expired", exp, err)
	}

	var cancels calls
	l.Watch(cancels.fn)
	for i := range 2 {
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release #%d: %v", i+1, err)
		}
	}
	if row, _ := f.st.GetLease(ctx, l.ID()); row.State != store.LeaseReleased {
		t.Fatalf("state = %s; want released", row.State)
	}
	if err := l.Heartbeat(ctx); !errors.Is(err, ErrReleased) {
		t.Fatalf("Heartbeat after Release = %v; want ErrReleased", err)
	}
	f.clock.Advance(time.Hour)
	if _, err := m.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	cancels.expect(t, 0)
	if m.Held() != 0 {
		t.Fatalf("released lease: Held = %d", m.Held())
	}
	if n, _ := m.LiveCount(ctx); n != 0 {
		t.Fatalf("LiveCount = %d", n)
	}
}

func TestAcquireRefuses(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	m := f.manager(Options{})
	if _, err := m.Acquire(ctx, AcquireRequest{Project: f.project, Kind: "shell"}); err == nil {
		t.Fatal("invalid kind accepted")
	}
	if _, err := m.Acquire(ctx, AcquireRequest{Project: 999, Kind: sandbox.LeaseFiles}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unknown project = %v; want store.ErrNotFound", err)
	}
	if n, _ := m.LiveCount(ctx); n != 0 {
		t.Fatalf("LiveCount = %d", n)
	}
}

// The reconciler expires a stale lease, cancels its work exactly once,
// reports it to OnExpired, and leaves heartbeated leases alone.
func TestSweepExpiresStaleLease(t *testing.T) {
	eachBackend(t, func(t *testing.T, backend string) {
		ctx := context.Background()
		f := newFixtureOn(t, backend)
		var hooked []string
		m := f.manager(Options{OnExpired: func(l store.Lease) { hooked = append(hooked, l.ID) }})
		stale := acquire(t, m, f.project)
		fresh := acquire(t, m, f.project)
		var cancels, freshCancels calls
		stale.Watch(cancels.fn)
		fresh.Watch(freshCancels.fn)

		f.clock.Advance(10 * time.Second)
		if err := fresh.Heartbeat(ctx); err != nil {
			t.Fatal(err)
		}
		f.clock.Advance(5*time.Second + time.Millisecond) // stale is 1 ms overdue
		exp, err := m.Sweep(ctx)
		if err != nil || len(exp) != 1 || exp[0].ID != stale.ID() || exp[0].State != store.LeaseExpired {
			t.Fatalf("Sweep = %+v, %v; want the stale lease", exp, err)
		}
		cancels.expect(t, 1)
		freshCancels.expect(t, 0)
		if len(hooked) != 1 || hooked[0] != stale.ID() {
			t.Fatalf("OnExpired saw %v", hooked)
		}
		// Sweeping again neither cancels nor reports it again.
		f.clock.Advance(time.Second)
		if exp, _ := m.Sweep(ctx); len(exp) != 0 || len(hooked) != 1 {
			t.Fatalf("second sweep: %v, hooked %v", exp, hooked)
		}
		cancels.expect(t, 1)
		// A watcher registered after expiry runs at once.
		var late calls
		stale.Watch(late.fn)
		late.expect(t, 1)
		// Expiry is reported, not hidden.
		if err := stale.Heartbeat(ctx); !errors.Is(err, ErrExpired) {
			t.Fatalf("Heartbeat after expiry = %v; want ErrExpired", err)
		}
		for range 2 {
			if err := stale.Release(ctx); !errors.Is(err, ErrExpired) {
				t.Fatalf("Release after expiry = %v; want ErrExpired", err)
			}
		}
		if err := fresh.Release(ctx); err != nil {
			t.Fatal(err)
		}
		cancels.expect(t, 1)
		freshCancels.expect(t, 0)
	})
}

// A holder that finds its lease overdue before any sweep ran marks it
// expired itself, and the expiry still reaches the watchers and the hook
// exactly once.
func TestOverdueFoundByHolder(t *testing.T) {
	ctx := context.Background()
	for _, op := range []string{"heartbeat", "release"} {
		t.Run(op, func(t *testing.T) {
			f := newFixture(t)
			var hooked atomic.Int32
			m := f.manager(Options{TTL: time.Second, OnExpired: func(store.Lease) { hooked.Add(1) }})
			l := acquire(t, m, f.project)
			var cancels calls
			l.Watch(cancels.fn)
			f.clock.Advance(2 * time.Second)
			var err error
			if op == "heartbeat" {
				err = l.Heartbeat(ctx)
			} else {
				err = l.Release(ctx)
			}
			if !errors.Is(err, ErrExpired) {
				t.Fatalf("%s overdue = %v; want ErrExpired", op, err)
			}
			if row, _ := f.st.GetLease(ctx, l.ID()); row.State != store.LeaseExpired {
				t.Fatalf("state = %s; want expired", row.State)
			}
			if _, err := m.Sweep(ctx); err != nil {
				t.Fatal(err)
			}
			cancels.expect(t, 1)
			if hooked.Load() != 1 {
				t.Fatalf("hooked %d; want 1", hooked.Load())
			}
		})
	}
}

// sharedStores opens one database twice, as the daemon's and a runner's
// stores on clock c, with one managed project; they close with the test.
func sharedStores(t *testing.T, c *clock, backend string) (daemonStore, runnerStore store.Store, p store.Project) {
	t.Helper()
	ctx := context.Background()
	path := storeURL(t, backend)
	daemonStore, err := store.Open(ctx, path, store.Options{Migrate: true, Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { daemonStore.Close() })
	runnerStore, err = store.Open(ctx, path, store.Options{Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { runnerStore.Close() })
	p, err = daemonStore.CreateProject(ctx, store.NewProject{Kind: store.ProjectManaged, Name: "p", Root: "/p"})
	if err != nil {
		t.Fatal(err)
	}
	return daemonStore, runnerStore, p
}

// The daemon's reconciler expires a runner's lease; the runner's own sweep
// then cancels the runner's work. Both processes share one database.
func TestExpiryAcrossProcesses(t *testing.T) {
	eachBackend(t, func(t *testing.T, backend string) {
		ctx := context.Background()
		c := newClock()
		daemonStore, runnerStore, p := sharedStores(t, c, backend)

		var daemonHooked, runnerHooked []string
		journal := InterruptJournal(daemonStore, nil)
		daemon := NewManager(daemonStore, Options{Holder: "daemon", HeartbeatWindow: -1, OnExpired: func(l store.Lease) {
			daemonHooked = append(daemonHooked, l.ID)
			journal(l)
		}})
		runner := NewManager(runnerStore, Options{Holder: "runner", HeartbeatWindow: -1, OnExpired: func(l store.Lease) { runnerHooked = append(runnerHooked, l.ID) }})

		l, err := runner.Acquire(ctx, AcquireRequest{Account: 1, Project: p.ID, Kind: sandbox.LeaseRunner, Domain: "runner"})
		if err != nil {
			t.Fatal(err)
		}
		var cancels calls
		l.Watch(cancels.fn)
		entry, err := runnerStore.JournalStart(ctx, store.JournalCommand{Account: 1, Project: p.ID, Domain: "runner", Lease: l.ID(), LeaseKind: "runner", Argv: []string{"sleep", "60"}})
		if err != nil {
			t.Fatal(err)
		}
		if n, _ := daemonStore.ProjectLiveLeases(ctx, p.ID); n != 1 {
			t.Fatalf("ProjectLiveLeases = %d; want 1", n)
		}
		if n, _ := daemon.LiveCount(ctx); n != 1 {
			t.Fatalf("daemon sees %d live leases; want 1", n)
		}
		if err := daemonStore.DeleteProject(ctx, p.ID); !errors.Is(err, store.ErrProjectBusy) {
			t.Fatalf("daemon DeleteProject = %v; want ErrProjectBusy", err)
		}

		c.Advance(DefaultTTL + time.Millisecond)
		if exp, err := daemon.Sweep(ctx); err != nil || len(exp) != 1 || exp[0].Holder != "runner" {
			t.Fatalf("daemon Sweep = %+v, %v", exp, err)
		}
		cancels.expect(t, 0) // the daemon cannot cancel the runner's work directly
		if exp, err := runner.Sweep(ctx); err != nil || len(exp) != 0 {
			t.Fatalf("runner Sweep = %+v, %v; want nothing newly expired", exp, err)
		}
		cancels.expect(t, 1)
		if runner.Held() != 0 {
			t.Fatalf("runner sweep: held %d; want 0", runner.Held())
		}
		if len(daemonHooked) != 1 || len(runnerHooked) != 0 {
			t.Fatalf("hooks: daemon %v, runner %v", daemonHooked, runnerHooked)
		}
		if js, _ := runnerStore.ListJournal(ctx, store.JournalFilter{Lease: l.ID()}); len(js) != 1 || js[0].ID != entry || js[0].End.Outcome != store.OutcomeInterrupted {
			t.Fatalf("journal of the expired lease = %+v; want its command interrupted", js)
		}
		if n, _ := daemonStore.ProjectLiveLeases(ctx, p.ID); n != 0 {
			t.Fatalf("ProjectLiveLeases = %d; want 0", n)
		}
		if err := l.Release(ctx); !errors.Is(err, ErrExpired) {
			t.Fatalf("Release = %v; want ErrExpired", err)
		}
		if err := daemonStore.DeleteProject(ctx, p.ID); err != nil {
			t.Fatalf("DeleteProject after expiry: %v", err)
		}
	})
}

func TestLiveLeaseBlocksProjectDeletion(t *testing.T) {
	eachBackend(t, func(t *testing.T, backend string) {
		ctx := context.Background()
		f := newFixtureOn(t, backend)
		m := f.manager(Options{})
		l := acquire(t, m, f.project)
		if err := f.st.DeleteProject(ctx, f.project); !errors.Is(err, store.ErrProjectBusy) {
			t.Fatalf("DeleteProject with a live lease = %v; want ErrProjectBusy", err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := f.st.DeleteProject(ctx, f.project); err != nil {
			t.Fatalf("DeleteProject after release: %v", err)
		}
		if _, err := m.Acquire(ctx, AcquireRequest{Project: f.project, Kind: sandbox.LeaseFiles}); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("Acquire on a deleted project = %v; want ErrNotFound", err)
		}
	})
}

// Heartbeats within one window share one transaction: with a clock that
// moves on every reading, they all record the same time.
func TestHeartbeatsAreBatched(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	m := f.manager(Options{HeartbeatWindow: 100 * time.Millisecond})
	var leases []*Lease
	for range 50 {
		leases = append(leases, acquire(t, m, f.project))
	}
	f.clock.tick = time.Millisecond
	var wg sync.WaitGroup
	errs := make(chan error, len(leases))
	for _, l := range leases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- l.Heartbeat(ctx)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	rows, err := f.st.ListLeases(ctx, store.LeaseFilter{Project: f.project})
	if err != nil {
		t.Fatal(err)
	}
	times := map[int64]bool{}
	for _, r := range rows {
		times[r.HeartbeatAt.UnixMilli()] = true
	}
	if len(times) > 3 {
		t.Fatalf("50 concurrent heartbeats were written at %d different times; want them batched", len(times))
	}

	// A full batch is written at once, without waiting for the window.
	full := f.manager(Options{HeartbeatWindow: time.Hour})
	full.maxBatch = 3
	var fl []*Lease
	for range 3 {
		fl = append(fl, acquire(t, full, f.project))
	}
	fullDone := make(chan error, 3)
	for _, l := range fl {
		go func() { fullDone <- l.Heartbeat(ctx) }()
	}
	for range 3 {
		select {
		case err := <-fullDone:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a full batch waited for its window")
		}
	}

	// A heartbeat whose context ends while it waits returns at once.
	m2 := f.manager(Options{HeartbeatWindow: time.Hour})
	l := acquire(t, m2, f.project)
	cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := l.Heartbeat(cctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Heartbeat with an ending context = %v", err)
	}
	// Let the hour-long batch go: flush it now so no timer goroutine
	// outlives the test.
	m2.mu.Lock()
	b := m2.pending
	m2.mu.Unlock()
	m2.flush(b)
}

// Run, with real time: a lease whose holder stops heartbeating is expired
// and its work cancelled within TTL plus a sweep.
func TestRunCancelsAbandonedWork(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "corral.db"), store.Options{Migrate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	p, _ := st.CreateProject(ctx, store.NewProject{Kind: store.ProjectHost, Name: "p", Root: "/p"})
	const ttl = 300 * time.Millisecond
	m := NewManager(st, Options{TTL: ttl, SweepInterval: 20 * time.Millisecond, HeartbeatWindow: 5 * time.Millisecond})
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- m.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-ran; err != nil {
			t.Errorf("Run = %v", err)
		}
	}()

	kept := acquire(t, m, p.ID)
	abandoned := acquire(t, m, p.ID)
	work, cancelWork := context.WithCancel(ctx)
	defer cancelWork()
	abandoned.Watch(cancelWork)
	keptWork, cancelKept := context.WithCancel(ctx)
	defer cancelKept()
	kept.Watch(cancelKept)

	start := time.Now()
	deadline := time.After(5 * time.Second)
	beat := time.NewTicker(ttl / 4)
	defer beat.Stop()
	for work.Err() == nil {
		select {
		case <-beat.C:
			if err := kept.Heartbeat(ctx); err != nil {
				t.Fatalf("heartbeat of the kept lease: %v", err)
			}
		case <-work.Done():
		case <-deadline:
			t.Fatal("abandoned lease's work not cancelled within 5 s")
		}
	}
	if d := time.Since(start); d < ttl {
		t.Fatalf("work cancelled after %v, before the TTL %v", d, ttl)
	}
	if keptWork.Err() != nil {
		t.Fatal("the heartbeated lease's work was cancelled")
	}
	if err := kept.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
