package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestTenancyChurnCostsOthersNothing: tenant A adds, updates and removes
// members of its own project in a loop (and deletes an account whose
// membership goes by cascade, and switches its project's network), from
// another process's Store on the same file, while tenant B runs commands
// in its own project the way a preparation does (a cached tenancy read,
// then its lease and journal entry under that version). B's commands are
// never refused for A's changes (the version is per project, schema 16),
// though A commits at least one change between any two of them; yet every
// revocation of B's own membership, made by that other process, refuses
// B's next lease and denies the read after it. (With schema 11's global
// version, every one of B's commands is refused once.)
func TestTenancyChurnCostsOthersNothing(t *testing.T) {
	eachBackend(t, func(t *testing.T, d *testDB) {
		ctx := context.Background()
		s := d.open(t, Options{Migrate: true}) // B's process
		other := d.open(t, Options{})          // A's process, and the admin's

		acct := func(name string) int64 {
			a, err := s.CreateAccount(ctx, name)
			must(t, err)
			return a.ID
		}
		a, x, b, bOwner := acct("a"), acct("x"), acct("b"), acct("b-owner")
		pa, err := s.CreateProject(ctx, NewProject{Kind: ProjectManaged, Name: "pa", Root: "/pa"})
		must(t, err)
		pb, err := s.CreateProject(ctx, NewProject{Kind: ProjectManaged, Name: "pb", Root: "/pb"})
		must(t, err)
		for _, m := range []Member{{Project: pa.ID, Account: a, Role: RoleOwner}, {Project: pb.ID, Account: bOwner, Role: RoleOwner},
			{Project: pb.ID, Account: b, Role: RoleMember}} {
			_, err := s.AddMember(ctx, m)
			must(t, err)
		}

		// A's churn, until stop.
		var churns atomic.Int64
		stop := make(chan struct{})
		churnErr := make(chan error, 1)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			churnErr <- func() error {
				for i := 0; ; i++ {
					select {
					case <-stop:
						return nil
					default:
					}
					var err error
					switch i % 5 {
					case 0:
						_, err = other.AddMember(ctx, Member{Project: pa.ID, Account: x, Role: RoleMember})
					case 1:
						err = other.UpdateMember(ctx, Member{Project: pa.ID, Account: x, Role: RoleMember, Trusted: true})
					case 2:
						err = other.RemoveMember(ctx, pa.ID, x)
					case 3:
						err = other.SetProjectNetwork(ctx, pa.ID, i%2 == 0)
					case 4: // a member whose account is deleted: the cascade
						var y Account
						if y, err = other.CreateAccount(ctx, fmt.Sprintf("y%d", i)); err == nil {
							if _, err = other.AddMember(ctx, Member{Project: pa.ID, Account: y.ID, Role: RoleMember}); err == nil {
								err = other.DeleteAccount(ctx, y.ID)
							}
						}
					}
					if err != nil {
						return fmt.Errorf("churn %d: %w", i, err)
					}
					churns.Add(1)
				}
			}()
		}()
		defer func() {
			close(stop)
			wg.Wait()
			if err := <-churnErr; err != nil {
				t.Error(err)
			}
		}()
		// waitChurn returns once A committed a change after seen.
		waitChurn := func(seen int64) {
			t.Helper()
			for deadline := time.Now().Add(10 * time.Second); churns.Load() <= seen; time.Sleep(50 * time.Microsecond) {
				if time.Now().After(deadline) {
					t.Fatal("tenant A's churn made no progress")
				}
			}
		}
		// command is one of B's preparations: nil, ErrTenancyChanged (lease
		// refused: counted by the store) or the read's error.
		command := func() error {
			ten, err := s.CachedTenancy(ctx, pb.ID, b)
			if err != nil {
				return err
			}
			l, err := s.CreateLease(ctx, NewLease{Account: b, Project: pb.ID, Kind: "terminal", TTL: time.Minute, TenancyVersion: ten.Version,
				Journal: &JournalCommand{Account: b, Project: pb.ID, LeaseKind: "terminal", Argv: []string{"true"}}}, time.Now())
			if err != nil {
				return err
			}
			return s.ReleaseHeldLease(ctx, l.ID, time.Now())
		}

		const commands, revokeEvery = 60, 10
		revocations := int64(0)
		for i := 1; i <= commands; i++ {
			waitChurn(churns.Load())
			if err := command(); err != nil {
				t.Fatalf("command %d of B, after A's change: %v (%d refusals)", i, err, refused(s))
			}
			if i%revokeEvery != 0 {
				continue
			}
			// B's membership revoked by the other process: B's next command
			// is refused at its lease, and the read after it denies.
			must(t, other.RemoveMember(ctx, pb.ID, b))
			revocations++
			if err := command(); !errors.Is(err, ErrTenancyChanged) {
				t.Fatalf("B's command after its revocation %d: %v, want ErrTenancyChanged", revocations, err)
			}
			if err := command(); !errors.Is(err, ErrNotMember) {
				t.Fatalf("B's read after its revocation %d: %v, want ErrNotMember", revocations, err)
			}
			_, err := other.AddMember(ctx, Member{Project: pb.ID, Account: b, Role: RoleMember})
			must(t, err)
		}
		if got := refused(s); got != revocations {
			t.Fatalf("%d of B's leases refused, want %d (one per revocation of its own membership): A's changes cost B", got, revocations)
		}
		if n := churns.Load(); n < commands {
			t.Fatalf("A made only %d changes during B's %d commands", n, commands)
		}
	})
}
