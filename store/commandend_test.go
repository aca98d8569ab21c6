package store

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// TestReleaseAndFinish: one write releases the lease and finishes the
// entry; a lease that is not releasable leaves the entry running and is
// reported as ReleaseHeldLease reports it; in a batch of concurrent ends,
// a refused one does not fail the others.
func TestReleaseAndFinish(t *testing.T) {
	eachBackend(t, func(t *testing.T, d *testDB) {
		ctx := context.Background()
		s, err := Open(ctx, d.url, Options{Migrate: true})
		must(t, err)
		defer s.Close()
		p, err := s.CreateProject(ctx, NewProject{Kind: ProjectHost, Name: "p", Root: "/p"})
		must(t, err)
		now := time.Now()
		start := func(ttl time.Duration) (Lease, int64) {
			t.Helper()
			l, err := s.CreateLease(ctx, NewLease{Account: 1, Project: p.ID, Kind: "terminal", TTL: ttl}, now)
			must(t, err)
			id, err := s.JournalStart(ctx, JournalCommand{Account: 1, Project: p.ID, Lease: l.ID, LeaseKind: "terminal", Argv: []string{"true"}})
			must(t, err)
			return l, id
		}
		entry := func(id int64) JournalEntry {
			t.Helper()
			list, err := s.ListJournal(ctx, JournalFilter{Limit: 1000})
			must(t, err)
			for _, e := range list {
				if e.ID == id {
					return e
				}
			}
			t.Fatalf("no entry %d", id)
			return JournalEntry{}
		}
		state := func(l Lease) LeaseState {
			t.Helper()
			got, err := s.GetLease(ctx, l.ID)
			must(t, err)
			return got.State
		}
		three := 3
		end := JournalEnd{Outcome: OutcomeExit, Code: &three, StdoutBytes: 5, StderrBytes: 7}

		l, id := start(time.Minute)
		if ok, err := s.ReleaseAndFinish(ctx, l.ID, now.Add(time.Second), id, end); !ok || err != nil {
			t.Fatalf("live lease: %v, %v", ok, err)
		}
		if e := entry(id); e.End.Outcome != OutcomeExit || e.End.Code == nil || *e.End.Code != 3 || e.End.StdoutBytes != 5 || e.End.StderrBytes != 7 || e.Ended.IsZero() {
			t.Fatalf("entry after the end: %+v", e)
		}
		if st := state(l); st != LeaseReleased {
			t.Fatalf("lease %s after the end", st)
		}
		checkClockInvariant(t, d, s, p.ID)

		// Released already: idempotent, and the entry is left to the caller.
		l, id = start(time.Minute)
		must(t, s.ReleaseHeldLease(ctx, l.ID, now))
		if ok, err := s.ReleaseAndFinish(ctx, l.ID, now, id, end); ok || err != nil {
			t.Fatalf("released lease: %v, %v; want false, nil", ok, err)
		}
		if e := entry(id); e.End.Outcome != "" {
			t.Fatalf("entry of a released lease finished: %+v", e)
		}

		// Overdue: not released, not hidden, entry untouched.
		l, id = start(time.Second)
		if ok, err := s.ReleaseAndFinish(ctx, l.ID, now.Add(time.Hour), id, end); ok || !errors.Is(err, ErrLeaseExpired) {
			t.Fatalf("overdue lease: %v, %v; want ErrLeaseExpired", ok, err)
		}
		if e := entry(id); e.End.Outcome != "" || state(l) != LeaseLive {
			t.Fatalf("overdue lease's end wrote: %+v, %s", e, state(l))
		}
		if ok, err := s.ReleaseAndFinish(ctx, "no-such-lease", now, id, end); ok || !errors.Is(err, ErrNotFound) {
			t.Fatalf("unknown lease: %v, %v; want ErrNotFound", ok, err)
		}
		if ok, err := s.ReleaseAndFinish(ctx, l.ID, now, id, JournalEnd{Outcome: OutcomeExit}); ok || err == nil || state(l) != LeaseLive {
			t.Fatalf("invalid end: %v, %v; want an error and nothing written", ok, err)
		}

		// An entry finished already (interrupted) keeps its outcome.
		l, id = start(time.Minute)
		if _, err := s.JournalInterrupt(ctx, l.ID, "gone"); err != nil {
			t.Fatal(err)
		}
		if ok, err := s.ReleaseAndFinish(ctx, l.ID, now, id, end); !ok || err != nil || state(l) != LeaseReleased {
			t.Fatalf("interrupted entry: %v, %v", ok, err)
		}
		if e := entry(id); e.End.Outcome != OutcomeInterrupted {
			t.Fatalf("interrupted entry rewritten: %+v", e)
		}

		// Concurrent ends batch together; the refused ones fail alone.
		type cmd struct {
			l    Lease
			id   int64
			gone bool
		}
		var cmds []cmd
		for i := range 32 {
			l, id := start(time.Minute)
			c := cmd{l: l, id: id, gone: i%2 == 1}
			if c.gone {
				must(t, s.ReleaseHeldLease(ctx, l.ID, now))
			}
			cmds = append(cmds, c)
		}
		var wg sync.WaitGroup
		for _, c := range cmds {
			wg.Go(func() {
				ok, err := s.ReleaseAndFinish(ctx, c.l.ID, now, c.id, end)
				if ok == c.gone || err != nil {
					t.Errorf("lease %s (released before: %v): %v, %v", c.l.ID, c.gone, ok, err)
				}
			})
		}
		wg.Wait()
		for _, c := range cmds {
			if e := entry(c.id); (e.End.Outcome == OutcomeExit) == c.gone {
				t.Errorf("entry %d (lease released before: %v): %+v", c.id, c.gone, e.End)
			}
		}
	})
}

// TestCreateLeaseWithJournal: the lease and its command's entry are
// created by one statement, which returns the entry's ID; a refused lease
// (tenancy changed, unknown project) leaves no entry either; concurrent
// starts, batched, get distinct IDs that are their entries'.
func TestCreateLeaseWithJournal(t *testing.T) {
	eachBackend(t, func(t *testing.T, d *testDB) {
		ctx := context.Background()
		s, err := Open(ctx, d.url, Options{Migrate: true})
		must(t, err)
		defer s.Close()
		acct, err := s.CreateAccount(ctx, "a")
		must(t, err)
		p, err := s.CreateProject(ctx, NewProject{Kind: ProjectHost, Name: "p", Root: "/p"})
		must(t, err)
		_, err = s.AddMember(ctx, Member{Project: p.ID, Account: acct.ID, Role: RoleOwner})
		must(t, err)
		cmd := func() *JournalCommand {
			return &JournalCommand{Account: acct.ID, Project: p.ID, Domain: "plugin", LeaseKind: "terminal",
				Argv: []string{"echo", "hi"}, Limits: Limits{TimeoutMS: 5}}
		}
		entries := func() map[int64]JournalEntry {
			t.Helper()
			list, err := s.ListJournal(ctx, JournalFilter{Limit: 1000})
			must(t, err)
			m := map[int64]JournalEntry{}
			for _, e := range list {
				m[e.ID] = e
			}
			return m
		}
		ten, err := s.CachedTenancy(ctx, p.ID, acct.ID)
		must(t, err)
		l, err := s.CreateLease(ctx, NewLease{Account: acct.ID, Project: p.ID, Kind: "terminal", Domain: "sandbox", TTL: time.Minute,
			TenancyVersion: ten.Version, Journal: cmd()}, time.Now())
		must(t, err)
		e, ok := entries()[l.Journal]
		if l.Journal == 0 || !ok || e.Lease != l.ID || e.Domain != "plugin" || e.Account != acct.ID || e.LeaseKind != "terminal" ||
			len(e.Argv) != 2 || e.Argv[1] != "hi" || e.Limits.TimeoutMS != 5 || e.End.Outcome != "" || e.Started.IsZero() {
			t.Fatalf("entry %d: %+v (found %v)", l.Journal, e, ok)
		}
		if got, err := s.GetLease(ctx, l.ID); err != nil || got.State != LeaseLive || got.Domain != "sandbox" {
			t.Fatalf("lease %+v, %v", got, err)
		}
		checkClockInvariant(t, d, s, p.ID)
		code := 0
		if ok, err := s.ReleaseAndFinish(ctx, l.ID, time.Now(), l.Journal, JournalEnd{Outcome: OutcomeExit, Code: &code}); !ok || err != nil {
			t.Fatalf("end: %v, %v", ok, err)
		}

		// Refused: nothing written.
		n := len(entries())
		must(t, s.UpdateMember(ctx, Member{Project: p.ID, Account: acct.ID, Role: RoleOwner, Trusted: true}))
		if _, err := s.CreateLease(ctx, NewLease{Account: acct.ID, Project: p.ID, Kind: "terminal", TTL: time.Minute,
			TenancyVersion: ten.Version, Journal: cmd()}, time.Now()); !errors.Is(err, ErrTenancyChanged) {
			t.Fatalf("stale tenancy: %v, want ErrTenancyChanged", err)
		}
		if _, err := s.CreateLease(ctx, NewLease{Account: acct.ID, Project: 999, Kind: "terminal", TTL: time.Minute, Journal: cmd()}, time.Now()); !errors.Is(err, ErrNotFound) {
			t.Fatalf("unknown project: %v, want ErrNotFound", err)
		}
		if len(entries()) != n {
			t.Fatal("a refused lease left a journal entry")
		}
		if ls, _ := s.ListLeases(ctx, LeaseFilter{State: LeaseLive}); len(ls) != 0 {
			t.Fatalf("a refused lease was written: %+v", ls)
		}

		var wg sync.WaitGroup
		var mu sync.Mutex
		got := map[int64]string{}
		for range 32 {
			wg.Go(func() {
				l, err := s.CreateLease(ctx, NewLease{Account: acct.ID, Project: p.ID, Kind: "terminal", TTL: time.Minute, Journal: cmd()}, time.Now())
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				got[l.Journal] = l.ID
				mu.Unlock()
			})
		}
		wg.Wait()
		all := entries()
		if len(got) != 32 {
			t.Fatalf("%d distinct entry IDs for 32 starts", len(got))
		}
		for id, lease := range got {
			if all[id].Lease != lease {
				t.Errorf("entry %d is lease %q's, not %q's", id, all[id].Lease, lease)
			}
		}
	})
}
