package lease

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/store"
)

// TestReleaseAndFinishExpired: a command whose lease expired before it
// ended (overdue at its end, or already expired by another process's
// reconciler) is not ended silently by the one-statement end: the release
// reports ErrExpired, the end is not journaled with it (the caller
// journals the failure), the lease stays expired, and the entry the
// reconciler marked interrupted keeps that outcome.
func TestReleaseAndFinishExpired(t *testing.T) {
	eachBackend(t, func(t *testing.T, backend string) {
		ctx := context.Background()
		c := newClock()
		daemonStore, runnerStore, p := sharedStores(t, c, backend)
		journal := InterruptJournal(daemonStore, nil)
		daemon := NewManager(daemonStore, Options{Holder: "daemon", HeartbeatWindow: -1, OnExpired: journal})
		runner := NewManager(runnerStore, Options{Holder: "runner", HeartbeatWindow: -1})
		code := 0
		end := store.JournalEnd{Outcome: store.OutcomeExit, Code: &code}
		acquire := func() (*Lease, int64) {
			t.Helper()
			js := &JournalStart{Command: store.JournalCommand{Account: 1, Project: p.ID, Domain: "sandbox", LeaseKind: "terminal", Argv: []string{"sleep", "60"}}}
			l, err := runner.Acquire(ctx, AcquireRequest{Account: 1, Project: p.ID, Kind: sandbox.LeaseTerminal, Domain: "sandbox", Journal: js})
			if err != nil || js.ID == 0 {
				t.Fatalf("Acquire: %v (entry %d)", err, js.ID)
			}
			return l, js.ID
		}
		entry := func(id int64) store.JournalEntry {
			t.Helper()
			es, err := runnerStore.ListJournal(ctx, store.JournalFilter{Project: p.ID})
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range es {
				if e.ID == id {
					return e
				}
			}
			t.Fatalf("no entry %d", id)
			return store.JournalEntry{}
		}

		// Overdue at its end: nobody expired it yet.
		l, id := acquire()
		c.Advance(DefaultTTL + time.Millisecond)
		journaled, err := l.ReleaseAndFinish(ctx, id, end)
		if !errors.Is(err, ErrExpired) || journaled {
			t.Fatalf("overdue: ReleaseAndFinish = %v, %v; want ErrExpired, not journaled", journaled, err)
		}
		if e := entry(id); e.End.Outcome == store.OutcomeExit {
			t.Fatalf("overdue: the entry was finished as an exit: %+v", e.End)
		}
		if got, _ := runnerStore.GetLease(ctx, l.ID()); got.State == store.LeaseReleased {
			t.Fatalf("overdue lease released: %+v", got)
		}

		// Expired by the daemon's reconciler first.
		l, id = acquire()
		c.Advance(DefaultTTL + time.Millisecond)
		if exp, err := daemon.Sweep(ctx); err != nil || len(exp) != 1 {
			t.Fatalf("daemon Sweep = %+v, %v", exp, err)
		}
		journaled, err = l.ReleaseAndFinish(ctx, id, end)
		if !errors.Is(err, ErrExpired) || journaled {
			t.Fatalf("expired: ReleaseAndFinish = %v, %v; want ErrExpired, not journaled", journaled, err)
		}
		if e := entry(id); e.End.Outcome != store.OutcomeInterrupted {
			t.Fatalf("expired: entry %+v; want interrupted kept", e.End)
		}
		if got, _ := runnerStore.GetLease(ctx, l.ID()); got.State != store.LeaseExpired {
			t.Fatalf("expired lease: %+v", got)
		}
		// Its second release says so again, without writing.
		if _, err := l.ReleaseAndFinish(ctx, id, end); !errors.Is(err, ErrExpired) {
			t.Fatalf("second release of an expired lease: %v", err)
		}
	})
}
