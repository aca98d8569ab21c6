package store

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/corral-sandbox/corral/internal/errdefs"
)

// TestConstraintErrorsForPeople: a duplicate says what exists, in words,
// and is classified conflict; SQLite's text stays out of the message.
func TestConstraintErrorsForPeople(t *testing.T) {
	eachBackend(t, func(t *testing.T, d *testDB) {
		s, _ := d.newStore(t)
		ctx := context.Background()
		if _, err := s.CreateAccount(ctx, "bob"); err != nil {
			t.Fatal(err)
		}
		_, err := s.CreateAccount(ctx, "bob")
		if !errors.Is(err, ErrExists) || errdefs.KindOf(err) != errdefs.Conflict {
			t.Fatalf("duplicate account: %v (class %q)", err, errdefs.KindOf(err))
		}
		if err.Error() != `account "bob" already exists` || strings.Contains(err.Error(), "UNIQUE") {
			t.Fatalf("duplicate account message: %q", err)
		}
		if _, err := s.CreateProject(ctx, NewProject{Kind: ProjectHost, Name: "web", Root: "/srv/web"}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.CreateProject(ctx, NewProject{Kind: ProjectHost, Name: "web", Root: "/srv/web2"}); err == nil || err.Error() != `project "web" already exists` {
			t.Fatalf("duplicate project: %v", err)
		}
	})
}

// TestTokensByIDAndDeleteAccount: a revoked token shows as revoked, a
// deleted account's tokens are gone, and the only owner of a project
// cannot be deleted.
func TestTokensByIDAndDeleteAccount(t *testing.T) {
	eachBackend(t, func(t *testing.T, d *testDB) {
		s, _ := d.newStore(t)
		ctx := context.Background()
		alice, _ := s.CreateAccount(ctx, "alice")
		bob, _ := s.CreateAccount(ctx, "bob")
		_, ta, _ := s.CreateToken(ctx, alice.ID, "a")
		pb, tb, _ := s.CreateToken(ctx, bob.ID, "b")
		if _, id, err := s.AuthenticateToken(ctx, pb); err != nil || id != tb.ID {
			t.Fatalf("AuthenticateToken = %d, %v", id, err)
		}
		if err := s.RevokeToken(ctx, ta.ID); err != nil {
			t.Fatal(err)
		}
		p, _ := s.CreateProject(ctx, NewProject{Kind: ProjectHost, Name: "web", Root: "/srv/web"})
		if _, err := s.AddMember(ctx, Member{Project: p.ID, Account: bob.ID, Role: RoleOwner}); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteAccount(ctx, bob.ID); !errors.Is(err, ErrSoleOwner) || !strings.Contains(err.Error(), `only owner of project "web"`) {
			t.Fatalf("delete the only owner: %v", err)
		}
		if _, err := s.AddMember(ctx, Member{Project: p.ID, Account: alice.ID, Role: RoleOwner}); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteAccount(ctx, bob.ID); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteAccount(ctx, bob.ID); !errors.Is(err, ErrNotFound) {
			t.Fatalf("delete twice: %v", err)
		}
		got, err := s.TokensByID(ctx, []int64{ta.ID, tb.ID, 999})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got[ta.ID].Revoked.IsZero() {
			t.Fatalf("TokensByID = %+v", got)
		}
		if all, err := s.ListTokens(ctx, 0); err != nil || len(all) != 1 || all[0].ID != ta.ID {
			t.Fatalf("ListTokens(0) = %+v, %v", all, err)
		}
		if ms, _ := s.ListMembers(ctx, p.ID); len(ms) != 1 || ms[0].Account != alice.ID {
			t.Fatalf("members after delete: %+v", ms)
		}
	})
}
