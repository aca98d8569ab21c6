package lease

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/testenv"
)

// TestKeepAlive: the manager's loop heartbeats kept-alive leases (their
// expiry moves), reports a lease released elsewhere once, and stops.
func TestKeepAlive(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	m := f.manager(Options{})
	a, b := acquire(t, m, f.project), acquire(t, m, f.project)
	before := a.Deadline()

	var failsA, failsB atomic.Int32
	var errB atomic.Pointer[error]
	stopA := a.KeepAlive(50*time.Millisecond, func(error) { failsA.Add(1) })
	stopB := b.KeepAlive(50*time.Millisecond, func(err error) { errB.Store(&err); failsB.Add(1) })

	f.clock.Advance(time.Second)
	testenv.WaitFor(t, 5*time.Second, "a heartbeated", func() bool { return a.Deadline().After(before) })
	row, err := f.st.GetLease(ctx, a.ID())
	if err != nil || !row.ExpiresAt.After(before) {
		t.Fatalf("store expiry %v (was %v): %v", row.ExpiresAt, before, err)
	}

	// b is released behind the holder's back (as by another process).
	if _, err := f.st.ReleaseLease(ctx, b.ID(), f.clock.Now()); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "b's failure reported", func() bool { return failsB.Load() == 1 })
	if p := errB.Load(); p == nil || !errors.Is(*p, ErrReleased) {
		t.Fatalf("b failed with %v, want ErrReleased", p)
	}
	time.Sleep(150 * time.Millisecond)
	if failsB.Load() != 1 || failsA.Load() != 0 {
		t.Fatalf("failures: a %d, b %d", failsA.Load(), failsB.Load())
	}
	stopB()
	stopA()
	stopA()
	testenv.WaitFor(t, 5*time.Second, "the loop ended", func() bool {
		m.ka.mu.Lock()
		defer m.ka.mu.Unlock()
		return !m.ka.running
	})
	if n := m.keepAliveCount(); n != 0 {
		t.Fatalf("%d leases still kept alive", n)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestKeepAliveExpired: a lease whose heartbeat comes after its TTL is
// expired (recorded in the store) and its holder is told, once.
func TestKeepAliveExpired(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	m := f.manager(Options{})
	l := acquire(t, m, f.project)
	var fails atomic.Int32
	var got atomic.Pointer[error]
	stop := l.KeepAlive(20*time.Millisecond, func(err error) { got.Store(&err); fails.Add(1) })
	defer stop()
	f.clock.Advance(m.TTL() + time.Second)
	testenv.WaitFor(t, 5*time.Second, "the expiry reported", func() bool { return fails.Load() == 1 })
	if p := got.Load(); p == nil || !errors.Is(*p, ErrExpired) {
		t.Fatalf("failed with %v, want ErrExpired", p)
	}
	row, err := f.st.GetLease(ctx, l.ID())
	if err != nil || row.State != "expired" {
		t.Fatalf("store state %q, %v", row.State, err)
	}
	time.Sleep(100 * time.Millisecond)
	if fails.Load() != 1 {
		t.Fatalf("reported %d times", fails.Load())
	}
}
