package store

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// checkClockInvariant fails unless exactly the live leases have a
// lease_clock row, each with its lease's project, and the counts agree.
func checkClockInvariant(t *testing.T, d *testDB, s Store, projects ...int64) {
	t.Helper()
	ctx := context.Background()
	if bad := d.queryInt(t, `
		SELECT count(*) FROM leases l LEFT JOIN lease_clock c ON c.seq = l.seq
		WHERE (l.state = 'live') <> (c.seq IS NOT NULL) OR c.project <> l.project`); bad != 0 {
		t.Fatalf("%d lease(s) whose clock does not match their state", bad)
	}
	if orphans := d.queryInt(t, "SELECT count(*) FROM lease_clock WHERE seq NOT IN (SELECT seq FROM leases)"); orphans != 0 {
		t.Fatalf("%d clock(s) without a lease", orphans)
	}
	total := 0
	for _, p := range projects {
		n, err := s.ProjectLiveLeases(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		live, err := s.ListLeases(ctx, LeaseFilter{Project: p, State: LeaseLive})
		if err != nil {
			t.Fatal(err)
		}
		all, err := s.ListLeases(ctx, LeaseFilter{Project: p})
		if err != nil {
			t.Fatal(err)
		}
		want := 0
		for _, l := range all {
			if l.State == LeaseLive {
				want++
			}
		}
		if n != want || len(live) != want {
			t.Fatalf("project %d: ProjectLiveLeases = %d, ListLeases(live) = %d; want %d", p, n, len(live), want)
		}
		total += n
	}
	if n, err := s.LiveLeaseCount(ctx); err != nil || n != total {
		t.Fatalf("LiveLeaseCount = %d, %v; want %d", n, err, total)
	}
}

// Random lives of leases on two projects keep a clock for exactly the live
// ones (the schema's triggers), and every count agrees.
func TestLeaseClockInvariant(t *testing.T) {
	eachBackend(t, func(t *testing.T, d *testDB) {
		ctx := context.Background()
		s, c := d.newStore(t)
		p1, _ := s.CreateProject(ctx, NewProject{Kind: ProjectHost, Name: "p1", Root: "/p1"})
		p2, _ := s.CreateProject(ctx, NewProject{Kind: ProjectManaged, Name: "p2", Root: "/p2"})
		rng := rand.New(rand.NewPCG(1, 2))
		var ids []string
		for i := range 300 {
			switch op := rng.IntN(10); {
			case op < 4 || len(ids) == 0:
				p := []int64{p1.ID, p2.ID}[rng.IntN(2)]
				l, err := s.CreateLease(ctx, NewLease{Project: p, Kind: "terminal", TTL: time.Duration(1+rng.IntN(20)) * time.Second}, c.Now())
				if err != nil {
					t.Fatal(err)
				}
				ids = append(ids, l.ID)
			case op < 7:
				_, err := s.ReleaseLease(ctx, ids[rng.IntN(len(ids))], c.Now())
				if err != nil && !errors.Is(err, ErrLeaseExpired) {
					t.Fatal(err)
				}
			case op < 9:
				err := s.HeartbeatLease(ctx, ids[rng.IntN(len(ids))], c.Now())
				if err != nil && !errors.Is(err, ErrLeaseExpired) && !errors.Is(err, ErrLeaseReleased) {
					t.Fatal(err)
				}
			default:
				if _, err := s.ExpireLeases(ctx, c.Now()); err != nil {
					t.Fatal(err)
				}
			}
			c.Advance(time.Duration(rng.IntN(1000)) * time.Millisecond)
			if i%10 == 0 {
				checkClockInvariant(t, d, s, p1.ID, p2.ID)
			}
		}
		checkClockInvariant(t, d, s, p1.ID, p2.ID)
	})
}

// A release that finds the lease overdue looks again in a transaction: if
// another process's heartbeat (its clock slightly behind) extended the lease
// in between, the lease is released after all. A release on time never
// takes that path.
func TestReleaseLeaseFallback(t *testing.T) {
	eachBackend(t, func(t *testing.T, d *testDB) {
		ctx := context.Background()
		s, c := d.newStore(t)
		p, _ := s.CreateProject(ctx, NewProject{Kind: ProjectHost, Name: "p", Root: "/p"})
		const ttl = 15 * time.Second
		calls := 0
		testHookReleaseFallback = func() { calls++ }
		t.Cleanup(func() { testHookReleaseFallback = nil })

		onTime, _ := s.CreateLease(ctx, NewLease{Project: p.ID, Kind: "terminal", TTL: ttl}, c.Now())
		if _, err := s.ReleaseLease(ctx, onTime.ID, c.Now().Add(ttl)); err != nil || calls != 0 {
			t.Fatalf("release at the deadline = %v after %d fallback(s); want nil, none", err, calls)
		}

		start := c.Now()
		l, _ := s.CreateLease(ctx, NewLease{Project: p.ID, Kind: "terminal", TTL: ttl}, start)
		at := start.Add(ttl + time.Millisecond) // 1 ms overdue
		testHookReleaseFallback = func() {
			calls++
			// Another process, its clock 1 ms behind, heartbeats in between.
			if err := s.HeartbeatLease(ctx, l.ID, start.Add(ttl)); err != nil {
				t.Errorf("skewed heartbeat: %v", err)
			}
		}
		got, err := s.ReleaseLease(ctx, l.ID, at)
		if err != nil || calls != 1 {
			t.Fatalf("release after the skewed heartbeat = %v after %d fallback(s); want nil, 1", err, calls)
		}
		want := l
		want.State, want.ReleasedAt = LeaseReleased, at
		want.HeartbeatAt, want.ExpiresAt = start.Add(ttl), start.Add(2*ttl)
		if got != want {
			t.Fatalf("released lease = %+v; want %+v", got, want)
		}
		if row, err := s.GetLease(ctx, l.ID); err != nil || row != want {
			t.Fatalf("GetLease = %+v, %v; want %+v", row, err, want)
		}
		checkClockInvariant(t, d, s, p.ID)

		// Without the heartbeat the overdue lease is not released.
		testHookReleaseFallback = func() { calls++ }
		o, _ := s.CreateLease(ctx, NewLease{Project: p.ID, Kind: "terminal", TTL: ttl}, start)
		if _, err := s.ReleaseLease(ctx, o.ID, at); !errors.Is(err, ErrLeaseExpired) || calls != 2 {
			t.Fatalf("release overdue = %v after %d fallback(s); want ErrLeaseExpired, 2", err, calls)
		}
		if row, _ := s.GetLease(ctx, o.ID); row.State != LeaseLive {
			t.Fatalf("overdue lease after a refused release: %+v", row)
		}
		checkClockInvariant(t, d, s, p.ID)
	})
}

// Concurrent releases of one lease on two handles (two processes): exactly
// one releases it, and both report success.
func TestConcurrentReleaseAcrossHandles(t *testing.T) {
	eachBackend(t, func(t *testing.T, d *testDB) {
		ctx := context.Background()
		c := newClock()
		a := d.open(t, Options{Migrate: true, Now: c.Now})
		b := d.open(t, Options{Now: c.Now})
		p, _ := a.CreateProject(ctx, NewProject{Kind: ProjectHost, Name: "p", Root: "/p"})
		for i := range 50 {
			l, err := a.CreateLease(ctx, NewLease{Project: p.ID, Kind: "files", TTL: time.Minute}, c.Now())
			if err != nil {
				t.Fatal(err)
			}
			errs := make(chan error, 2)
			for _, st := range []Store{a, b} {
				go func() {
					got, err := st.ReleaseLease(ctx, l.ID, c.Now())
					if err == nil && (got.State != LeaseReleased || !got.ReleasedAt.Equal(c.Now())) {
						err = fmt.Errorf("released row %+v", got)
					}
					errs <- err
				}()
			}
			for range 2 {
				if err := <-errs; err != nil {
					t.Fatalf("round %d: %v", i, err)
				}
			}
		}
		checkClockInvariant(t, d, a, p.ID)
	})
}

// ReleaseHeldLease has ReleaseLease's outcomes, and leaves the same row.
func TestReleaseHeldLease(t *testing.T) {
	eachBackend(t, func(t *testing.T, d *testDB) {
		ctx := context.Background()
		s, c := d.newStore(t)
		p, _ := s.CreateProject(ctx, NewProject{Kind: ProjectHost, Name: "p", Root: "/p"})
		const ttl = 15 * time.Second
		for _, tc := range []struct {
			name string
			// prepare returns the lease ID to release and the time to release it at.
			prepare func(t *testing.T) (string, time.Time)
			want    error
		}{
			{"live", func(t *testing.T) (string, time.Time) {
				l, _ := s.CreateLease(ctx, NewLease{Project: p.ID, Kind: "files", TTL: ttl}, c.Now())
				return l.ID, c.Now().Add(ttl)
			}, nil},
			{"released", func(t *testing.T) (string, time.Time) {
				l, _ := s.CreateLease(ctx, NewLease{Project: p.ID, Kind: "files", TTL: ttl}, c.Now())
				if _, err := s.ReleaseLease(ctx, l.ID, c.Now()); err != nil {
					t.Fatal(err)
				}
				return l.ID, c.Now().Add(time.Second)
			}, nil},
			{"overdue", func(t *testing.T) (string, time.Time) {
				l, _ := s.CreateLease(ctx, NewLease{Project: p.ID, Kind: "files", TTL: ttl}, c.Now())
				return l.ID, c.Now().Add(ttl + time.Millisecond)
			}, ErrLeaseExpired},
			{"expired", func(t *testing.T) (string, time.Time) {
				l, _ := s.CreateLease(ctx, NewLease{Project: p.ID, Kind: "files", TTL: ttl}, c.Now())
				if _, err := s.ExpireLeases(ctx, c.Now().Add(2*ttl)); err != nil {
					t.Fatal(err)
				}
				return l.ID, c.Now().Add(2 * ttl)
			}, ErrLeaseExpired},
			{"unknown", func(t *testing.T) (string, time.Time) { return "nope", c.Now() }, ErrNotFound},
		} {
			t.Run(tc.name, func(t *testing.T) {
				var rows [2]Lease
				for i, release := range []func(id string, at time.Time) error{
					func(id string, at time.Time) error { _, err := s.ReleaseLease(ctx, id, at); return err },
					func(id string, at time.Time) error { return s.ReleaseHeldLease(ctx, id, at) },
				} {
					id, at := tc.prepare(t)
					err := release(id, at)
					if (tc.want == nil) != (err == nil) || (tc.want != nil && !errors.Is(err, tc.want)) {
						t.Fatalf("release #%d = %v; want %v", i, err, tc.want)
					}
					rows[i], _ = s.GetLease(ctx, id)
					rows[i].ID = ""
				}
				if rows[0] != rows[1] {
					t.Fatalf("rows differ: ReleaseLease left %+v, ReleaseHeldLease %+v", rows[0], rows[1])
				}
				if tc.want == nil && rows[1].State != LeaseReleased {
					t.Fatalf("state after release: %+v", rows[1])
				}
				checkClockInvariant(t, d, s, p.ID)
			})
		}
	})
}

// One ExpireLeases expires several leases at once, each with its own last
// heartbeat and expiry, and leaves the others live.
func TestExpireLeasesKeepsEachClock(t *testing.T) {
	eachBackend(t, func(t *testing.T, d *testDB) {
		ctx := context.Background()
		s, c := d.newStore(t)
		p, _ := s.CreateProject(ctx, NewProject{Kind: ProjectHost, Name: "p", Root: "/p"})
		start := c.Now()
		want := map[string]time.Time{} // expiring lease → its last heartbeat
		for i := range 5 {
			l, err := s.CreateLease(ctx, NewLease{Project: p.ID, Kind: "files", TTL: 10 * time.Second}, start)
			if err != nil {
				t.Fatal(err)
			}
			beat := start.Add(time.Duration(i) * time.Second)
			if err := s.HeartbeatLease(ctx, l.ID, beat); err != nil {
				t.Fatal(err)
			}
			if i < 3 {
				want[l.ID] = beat
			}
		}
		keep, _ := s.CreateLease(ctx, NewLease{Project: p.ID, Kind: "files", TTL: time.Minute}, start)
		at := start.Add(12*time.Second + time.Millisecond) // leases beaten at 0, 1, 2 s are overdue
		exp, err := s.ExpireLeases(ctx, at)
		if err != nil || len(exp) != len(want) {
			t.Fatalf("ExpireLeases = %+v, %v; want %d leases", exp, err, len(want))
		}
		for _, l := range exp {
			beat, ok := want[l.ID]
			if !ok || l.State != LeaseExpired || !l.ExpiredAt.Equal(at) || !l.HeartbeatAt.Equal(beat) || !l.ExpiresAt.Equal(beat.Add(10*time.Second)) {
				t.Fatalf("expired %+v; want heartbeat %v", l, beat)
			}
			if got, _ := s.GetLease(ctx, l.ID); got != l {
				t.Fatalf("GetLease = %+v; want %+v", got, l)
			}
		}
		if n, _ := s.ProjectLiveLeases(ctx, p.ID); n != 3 {
			t.Fatalf("ProjectLiveLeases = %d; want 3", n)
		}
		if got, _ := s.GetLease(ctx, keep.ID); got.State != LeaseLive {
			t.Fatalf("lease on time: %+v", got)
		}
		checkClockInvariant(t, d, s, p.ID)
	})
}
