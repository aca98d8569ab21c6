package store

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// holdWriter takes the store's write connection in a transaction, so that
// the next hot write waits for it (running alone, the writer busy) and the
// ones after it queue. release commits the transaction.
func holdWriter(t *testing.T, s *sqliteStore) (release func()) {
	t.Helper()
	tx, err := s.w.BeginTx(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			if err := tx.Commit(); err != nil {
				t.Error(err)
			}
		})
	}
	t.Cleanup(release)
	return release
}

// waitWriter waits until the writer is busy and n requests are queued.
func waitWriter(t *testing.T, s *sqliteStore, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		s.wr.mu.Lock()
		busy, queued := s.wr.busy, len(s.wr.queue)
		s.wr.mu.Unlock()
		if busy && queued == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("writer busy %v with %d queued, want busy with %d", busy, queued, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// countBatches sets testHookBatch for the test; it returns the sizes of the
// batches run so far.
func countBatches(t *testing.T, also func(n int)) func() []int {
	var (
		mu    sync.Mutex
		sizes []int
	)
	testHookBatch = func(n int) {
		mu.Lock()
		sizes = append(sizes, n)
		mu.Unlock()
		if also != nil {
			also(n)
		}
	}
	t.Cleanup(func() { testHookBatch = nil })
	return func() []int {
		mu.Lock()
		defer mu.Unlock()
		return append([]int(nil), sizes...)
	}
}

func testProject(t *testing.T, s Store) int64 {
	t.Helper()
	p, err := s.CreateProject(context.Background(), NewProject{Kind: ProjectHost, Name: "p", Root: "/p"})
	if err != nil {
		t.Fatal(err)
	}
	return p.ID
}

// Many goroutines running every hot write of a command each get their own
// results: their journal IDs, their leases released, their entries ended.
func TestBatchedWritesConcurrent(t *testing.T) {
	eachBackend(t, func(t *testing.T, d *testDB) {
		s, c := d.newStore(t)
		ctx := context.Background()
		project := testProject(t, s)
		batches := countBatches(t, nil)

		const workers, each = 32, 40
		type cmd struct {
			lease   string
			journal int64
		}
		got := make([][]cmd, workers)
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				for i := range each {
					l, err := s.CreateLease(ctx, NewLease{Account: int64(w + 1), Project: project, Kind: "terminal", TTL: time.Hour}, c.Now())
					if err != nil {
						t.Error(err)
						return
					}
					j, err := s.JournalStart(ctx, JournalCommand{Account: int64(w + 1), Project: project, Lease: l.ID, LeaseKind: "terminal", Argv: []string{"cmd", l.ID}})
					if err != nil {
						t.Error(err)
						return
					}
					code := i
					if err := s.JournalFinish(ctx, j, JournalEnd{Outcome: OutcomeExit, Code: &code}); err != nil {
						t.Error(err)
						return
					}
					// Finishing twice: the second finds no running entry.
					if err := s.JournalFinish(ctx, j, JournalEnd{Outcome: OutcomeExit, Code: &code}); !errors.Is(err, ErrNotFound) {
						t.Errorf("second JournalFinish(%d) = %v, want ErrNotFound", j, err)
					}
					if err := s.ReleaseHeldLease(ctx, l.ID, c.Now()); err != nil {
						t.Error(err)
						return
					}
					got[w] = append(got[w], cmd{l.ID, j})
				}
			})
		}
		wg.Wait()
		if t.Failed() {
			return
		}

		entries, err := s.ListJournal(ctx, JournalFilter{Limit: workers*each + 10})
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) != workers*each {
			t.Fatalf("%d journal entries, want %d", len(entries), workers*each)
		}
		byID := map[int64]JournalEntry{}
		for _, e := range entries {
			byID[e.ID] = e
		}
		for w, cmds := range got {
			for i, c := range cmds {
				e, ok := byID[c.journal]
				switch {
				case !ok:
					t.Fatalf("worker %d: journal ID %d not in the journal", w, c.journal)
				case e.Lease != c.lease || e.Account != int64(w+1) || len(e.Argv) != 2 || e.Argv[1] != c.lease:
					t.Fatalf("worker %d: journal ID %d is %+v, want lease %s", w, c.journal, e, c.lease)
				case e.End.Outcome != OutcomeExit || e.End.Code == nil || *e.End.Code != i:
					t.Fatalf("worker %d: entry %d ended %+v, want exit %d", w, c.journal, e.End, i)
				}
				delete(byID, c.journal)
			}
		}
		live, err := s.LiveLeaseCount(ctx)
		if err != nil {
			t.Fatal(err)
		}
		released, err := s.ListLeases(ctx, LeaseFilter{State: LeaseReleased})
		if err != nil {
			t.Fatal(err)
		}
		if live != 0 || len(released) != workers*each {
			t.Errorf("%d live and %d released leases, want 0 and %d", live, len(released), workers*each)
		}
		checkClockInvariant(t, d, s, project)
		if d.backend == SchemeSQLite && len(batches()) == 0 {
			t.Error("no batch ran: the test did not exercise SQLite's group commit")
		}
	})
}

// In a batch, a statement that fails (a duplicate lease ID, a lease on an
// unknown project) fails its caller only.
func TestBatchFailureIsItsCallerOnly(t *testing.T) {
	c := newClock()
	d := &testDB{backend: SchemeSQLite, url: DefaultURL(t.TempDir())}
	s := d.open(t, Options{Migrate: true, Now: c.Now}).(*sqliteStore)
	ctx := context.Background()
	project := testProject(t, s)
	dup, err := s.CreateLease(ctx, NewLease{Project: project, Kind: "terminal", TTL: time.Hour}, c.Now())
	if err != nil {
		t.Fatal(err)
	}
	batches := countBatches(t, nil)

	release := holdWriter(t, s)
	type result struct {
		lease Lease
		err   error
	}
	create := func(n NewLease) <-chan result {
		ch := make(chan result, 1)
		go func() {
			l, err := s.CreateLease(ctx, n, c.Now())
			ch <- result{l, err}
		}()
		return ch
	}
	first := create(NewLease{Project: project, Kind: "terminal", TTL: time.Hour})
	waitWriter(t, s, 0)
	okBefore := create(NewLease{Project: project, Kind: "terminal", TTL: time.Hour})
	waitWriter(t, s, 1)
	duplicate := create(NewLease{ID: dup.ID, Project: project, Kind: "terminal", TTL: time.Hour})
	waitWriter(t, s, 2)
	noProject := create(NewLease{ID: "no-project", Project: project + 100, Kind: "terminal", TTL: time.Hour})
	waitWriter(t, s, 3)
	okAfter := create(NewLease{Project: project, Kind: "terminal", TTL: time.Hour})
	waitWriter(t, s, 4)
	release()

	for name, ch := range map[string]<-chan result{"first": first, "before": okBefore, "after": okAfter} {
		r := <-ch
		if r.err != nil {
			t.Fatalf("%s: %v", name, r.err)
		}
		if _, err := s.GetLease(ctx, r.lease.ID); err != nil {
			t.Errorf("%s: lease %s not stored: %v", name, r.lease.ID, err)
		}
	}
	if r := <-duplicate; !errors.Is(r.err, ErrExists) {
		t.Errorf("duplicate lease: %v, want ErrExists", r.err)
	}
	if r := <-noProject; !errors.Is(r.err, ErrNotFound) {
		t.Errorf("lease on an unknown project: %v, want ErrNotFound", r.err)
	} else if _, err := s.GetLease(ctx, "no-project"); !errors.Is(err, ErrNotFound) {
		t.Errorf("failed lease stored: %v", err)
	}
	if got := batches(); len(got) != 1 || got[0] != 4 {
		t.Errorf("batches %v, want one of 4", got)
	}
	if n, err := s.LiveLeaseCount(ctx); err != nil || n != 4 {
		t.Errorf("LiveLeaseCount = %d, %v; want 4", n, err)
	}
	checkClockInvariant(t, d, s, project)
}

// A caller that gives up while its statement is queued returns at once and
// its statement never runs; one whose context ends after its statement was
// taken into a batch, before its turn, sees its context's error and nothing
// written.
func TestBatchCancellation(t *testing.T) {
	s, c := newTestStore(t)
	ctx := context.Background()
	project := testProject(t, s)

	type result struct {
		lease Lease
		err   error
	}
	create := func(ctx context.Context, id string) <-chan result {
		ch := make(chan result, 1)
		go func() {
			l, err := s.CreateLease(ctx, NewLease{ID: id, Project: project, Kind: "terminal", TTL: time.Hour}, c.Now())
			ch <- result{l, err}
		}()
		return ch
	}
	assertLease := func(id string, want bool) {
		t.Helper()
		_, err := s.GetLease(ctx, id)
		if want && err != nil || !want && !errors.Is(err, ErrNotFound) {
			t.Errorf("GetLease(%s) = %v; want stored %v", id, err, want)
		}
	}

	t.Run("queued", func(t *testing.T) {
		release := holdWriter(t, s)
		first := create(ctx, "q-first")
		waitWriter(t, s, 0)
		cctx, cancel := context.WithCancel(ctx)
		gaveUp := create(cctx, "q-gave-up")
		waitWriter(t, s, 1)
		cancel()
		// It returns while the writer is still held.
		select {
		case r := <-gaveUp:
			if !errors.Is(r.err, context.Canceled) {
				t.Errorf("cancelled queued CreateLease = %v, want context.Canceled", r.err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a cancelled queued CreateLease did not return")
		}
		last := create(ctx, "q-last")
		waitWriter(t, s, 2) // the cancelled request stays queued until taken
		release()
		for _, ch := range []<-chan result{first, last} {
			if r := <-ch; r.err != nil {
				t.Fatal(r.err)
			}
		}
		assertLease("q-first", true)
		assertLease("q-gave-up", false)
		assertLease("q-last", true)
		s.wr.mu.Lock()
		busy, queued := s.wr.busy, len(s.wr.queue)
		s.wr.mu.Unlock()
		if busy || queued != 0 {
			t.Errorf("writer busy %v with %d queued after the writes, want idle", busy, queued)
		}
	})

	t.Run("taken", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		batches := countBatches(t, func(int) { cancel() })
		release := holdWriter(t, s)
		first := create(ctx, "t-first")
		waitWriter(t, s, 0)
		gaveUp := create(cctx, "t-gave-up")
		waitWriter(t, s, 1)
		other := create(ctx, "t-other")
		waitWriter(t, s, 2)
		release()
		for _, ch := range []<-chan result{first, other} {
			if r := <-ch; r.err != nil {
				t.Fatal(r.err)
			}
		}
		if r := <-gaveUp; !errors.Is(r.err, context.Canceled) {
			t.Errorf("CreateLease cancelled in its batch = %v, want context.Canceled", r.err)
		}
		if got := batches(); len(got) != 1 || got[0] != 2 {
			t.Errorf("batches %v, want one of 2", got)
		}
		assertLease("t-first", true)
		assertLease("t-gave-up", false)
		assertLease("t-other", true)
	})
}

// A batch waits for another process's write lock as a lone statement does,
// for the busy timeout, and then fails every caller; nothing is written.
func TestBatchBusy(t *testing.T) {
	path := filepath.Join(t.TempDir(), "corral.db")
	s := openTest(t, path, Options{Migrate: true, BusyTimeout: 300 * time.Millisecond})
	ctx := context.Background()
	project := testProject(t, s)
	batches := countBatches(t, nil)

	other := rawDB(t, path)
	conn, err := other.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	var failed atomic.Int32
	var wg sync.WaitGroup
	start := time.Now()
	for i := range 3 {
		wg.Go(func() {
			_, err := s.CreateLease(ctx, NewLease{ID: "busy-" + string(rune('a'+i)), Project: project, Kind: "terminal", TTL: time.Hour}, time.Now())
			if isBusy(err) {
				failed.Add(1)
			} else {
				t.Errorf("CreateLease under another process's write lock: %v, want SQLITE_BUSY", err)
			}
		})
		waitWriter(t, s, i)
	}
	wg.Wait()
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Errorf("the writes failed after %v, before the busy timeout", took)
	}
	if _, err := conn.ExecContext(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	if got := batches(); len(got) != 1 || got[0] != 2 {
		t.Errorf("batches %v, want one of 2", got)
	}
	if n, err := s.LiveLeaseCount(ctx); err != nil || n != 0 {
		t.Errorf("LiveLeaseCount = %d, %v; want 0", n, err)
	}
	// The writer works again.
	if _, err := s.CreateLease(ctx, NewLease{Project: project, Kind: "terminal", TTL: time.Hour}, time.Now()); err != nil {
		t.Fatal(err)
	}
}

// TestHotStatementContext: a hot statement run alone under an ended
// context makes no write and returns the context's error; under a live
// cancellable one it runs (without the driver's watcher goroutine: see
// hot) and commits.
func TestHotStatementContext(t *testing.T) {
	eachBackend(t, func(t *testing.T, d *testDB) {
		s, _ := d.newStore(t)
		p := testProject(t, s)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := s.CreateLease(ctx, NewLease{Account: 1, Project: p, Kind: "terminal", TTL: time.Hour}, time.Now()); !errors.Is(err, context.Canceled) {
			t.Fatalf("CreateLease under a cancelled context = %v, want context.Canceled", err)
		}
		if _, _, err := s.GetProjectMember(ctx, p, 1); !errors.Is(err, context.Canceled) {
			t.Errorf("GetProjectMember under a cancelled context = %v, want context.Canceled", err)
		}
		if n, err := s.LiveLeaseCount(context.Background()); err != nil || n != 0 {
			t.Fatalf("live leases after a cancelled create: %d, %v", n, err)
		}
		live, stop := context.WithTimeout(context.Background(), time.Minute)
		defer stop()
		l, err := s.CreateLease(live, NewLease{Account: 1, Project: p, Kind: "terminal", TTL: time.Hour}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if err := s.ReleaseHeldLease(live, l.ID, time.Now()); err != nil {
			t.Fatal(err)
		}
		if got, err := s.GetLease(context.Background(), l.ID); err != nil || got.State != LeaseReleased {
			t.Fatalf("lease after release under a deadline: %+v, %v", got, err)
		}
	})
}

// TestBatchStatementsClosed: a batch runs on statements prepared on the
// driver's write connection; closing the Store closes them, and with them
// the database's files (SQLite keeps a connection with statements left
// open, and its files, alive after close).
func TestBatchStatementsClosed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "corral.db")
	s, err := openSQLite(context.Background(), path, Options{Migrate: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	project := testProject(t, s)
	batches := countBatches(t, nil)
	release := holdWriter(t, s)
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() {
			if _, err := s.CreateLease(ctx, NewLease{Project: project, Kind: "terminal", TTL: time.Hour}, time.Now()); err != nil {
				t.Error(err)
			}
		})
		waitWriter(t, s, i)
	}
	release()
	wg.Wait()
	if got := batches(); len(got) != 1 || got[0] != 2 {
		t.Fatalf("batches %v, want one of 2", got)
	}
	if n, err := s.LiveLeaseCount(ctx); err != nil || n != 3 {
		t.Fatalf("LiveLeaseCount = %d, %v; want 3", n, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip(err)
	}
	for _, fd := range fds {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && strings.HasPrefix(target, path) {
			t.Errorf("after Close, fd %s is still open on %s", fd.Name(), target)
		}
	}
}
