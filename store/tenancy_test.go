package store

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestTenancyCache: a lease created with the tenancy version of a cached
// read is refused (ErrTenancyChanged, no row) after any change to the
// project or the membership, made by this Store or by another process's
// (another Store on the same file), and the next cached read sees the
// change. Every kind of tenancy write is covered.
func TestTenancyCache(t *testing.T) {
	eachBackend(t, func(t *testing.T, d *testDB) {
		ctx := context.Background()
		s, err := Open(ctx, d.url, Options{Migrate: true})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		other, err := Open(ctx, d.url, Options{}) // another process's store
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close()

		alice, err := s.CreateAccount(ctx, "alice")
		must(t, err)
		bob, err := s.CreateAccount(ctx, "bob")
		must(t, err)
		p, err := s.CreateProject(ctx, NewProject{Kind: ProjectManaged, Name: "p", Root: "/p"})
		must(t, err)
		_, err = s.AddMember(ctx, Member{Project: p.ID, Account: alice.ID, Role: RoleOwner})
		must(t, err)
		_, err = s.AddMember(ctx, Member{Project: p.ID, Account: bob.ID, Role: RoleMember})
		must(t, err)

		lease := func(account, version int64) error {
			_, err := s.CreateLease(ctx, NewLease{Account: account, Project: p.ID, Kind: "terminal", TTL: time.Minute, TenancyVersion: version}, time.Now())
			return err
		}
		// warm reads the tenancy through the cache twice (the second read is
		// the cached one) and checks a lease under its version is accepted.
		warm := func(account int64) Tenancy {
			t.Helper()
			var ten Tenancy
			for range 2 {
				var err error
				if ten, err = s.CachedTenancy(ctx, p.ID, account); err != nil {
					t.Fatalf("CachedTenancy: %v", err)
				}
			}
			if ten.Version == 0 {
				t.Fatal("CachedTenancy returned no version")
			}
			if err := lease(account, ten.Version); err != nil {
				t.Fatalf("lease under a current version: %v", err)
			}
			return ten
		}
		live := func() int {
			t.Helper()
			ls, err := s.ListLeases(ctx, LeaseFilter{Project: p.ID})
			must(t, err)
			return len(ls)
		}
		// changed checks that a lease under ten's version is now refused, with
		// no row written.
		changed := func(what string, account int64, ten Tenancy) {
			t.Helper()
			n := live()
			if err := lease(account, ten.Version); !errors.Is(err, ErrTenancyChanged) {
				t.Fatalf("%s: lease under the old version: %v, want ErrTenancyChanged", what, err)
			}
			if live() != n {
				t.Fatalf("%s: a refused lease was written", what)
			}
		}

		// Trust granted by another process: the next read sees it.
		ten := warm(bob.ID)
		must(t, other.UpdateMember(ctx, Member{Project: p.ID, Account: bob.ID, Role: RoleMember, Trusted: true}))
		changed("update member", bob.ID, ten)
		if got, err := s.CachedTenancy(ctx, p.ID, bob.ID); err != nil || !got.Member.Trusted {
			t.Fatalf("after the update: %+v, %v; want trusted", got.Member, err)
		}

		// The machine spec changed by another process.
		ten = warm(bob.ID)
		must(t, other.SetProjectMachine(ctx, p.ID, DefaultImage, MachineLimits{Memory: 1 << 30}))
		changed("machine spec", bob.ID, ten)
		if got, err := s.CachedTenancy(ctx, p.ID, bob.ID); err != nil || got.Project.Limits.Memory != 1<<30 {
			t.Fatalf("after the spec change: %+v, %v", got.Project.Limits, err)
		}

		// The network switched.
		ten = warm(bob.ID)
		must(t, other.SetProjectNetwork(ctx, p.ID, !ten.Project.Network))
		changed("network", bob.ID, ten)

		// Membership revoked by another process: denied at once.
		ten = warm(bob.ID)
		must(t, other.RemoveMember(ctx, p.ID, bob.ID))
		changed("remove member", bob.ID, ten)
		if _, err := s.CachedTenancy(ctx, p.ID, bob.ID); !errors.Is(err, ErrNotMember) {
			t.Fatalf("after the removal: %v, want ErrNotMember", err)
		}

		// A member added: a cached denial does not exist (denials are never
		// cached), and the new member is seen at once.
		_, err = other.AddMember(ctx, Member{Project: p.ID, Account: bob.ID, Role: RoleMember})
		must(t, err)
		ten = warm(bob.ID)

		// The account deleted (its memberships go by cascade).
		must(t, other.DeleteAccount(ctx, bob.ID))
		changed("delete account", bob.ID, ten)
		if _, err := s.CachedTenancy(ctx, p.ID, bob.ID); !errors.Is(err, ErrNotMember) {
			t.Fatalf("after deleting the account: %v, want ErrNotMember", err)
		}

		// By this store itself, too.
		ten = warm(alice.ID)
		must(t, s.UpdateMember(ctx, Member{Project: p.ID, Account: alice.ID, Role: RoleOwner, Trusted: true}))
		changed("own update", alice.ID, ten)

		// The project deleted (after its leases end).
		ten = warm(alice.ID)
		ls, err := s.ListLeases(ctx, LeaseFilter{Project: p.ID, State: LeaseLive})
		must(t, err)
		for _, l := range ls {
			must(t, s.ReleaseHeldLease(ctx, l.ID, time.Now()))
		}
		must(t, other.DeleteProject(ctx, p.ID))
		if err := lease(alice.ID, ten.Version); err == nil {
			t.Fatal("a lease was created on a deleted project")
		}
		if _, err := s.CachedTenancy(ctx, p.ID, alice.ID); !errors.Is(err, ErrNotFound) {
			t.Fatalf("after deleting the project: %v, want ErrNotFound", err)
		}
	})
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
