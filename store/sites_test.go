package store

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestPublications: unique names, re-publishing by the holder, refusal for
// another project, deletion with the project, and rows that survive a
// reopen of the file.
func TestPublications(t *testing.T) {
	eachBackend(t, func(t *testing.T, d *testDB) {
		ctx := context.Background()
		c := newClock()
		s, err := Open(ctx, d.url, Options{Migrate: true, Now: c.Now})
		if err != nil {
			t.Fatal(err)
		}
		p1, _ := s.CreateProject(ctx, NewProject{Kind: ProjectManaged, Name: "one", Root: "/w/one"})
		p2, _ := s.CreateProject(ctx, NewProject{Kind: ProjectManaged, Name: "two", Root: "/w/two"})
		pub, err := s.PutPublication(ctx, Publication{Name: "app", Project: p1.ID, Port: 8000, Owner: 7})
		if err != nil || pub.Created.IsZero() {
			t.Fatalf("put: %+v %v", pub, err)
		}
		c.Advance(time.Minute)
		again, err := s.PutPublication(ctx, Publication{Name: "app", Project: p1.ID, Port: 8080, Owner: 8})
		if err != nil || again.Port != 8080 || again.Owner != 8 || !again.Created.Equal(pub.Created) {
			t.Fatalf("re-publish: %+v %v", again, err)
		}
		if _, err := s.PutPublication(ctx, Publication{Name: "app", Project: p2.ID, Port: 1, Owner: 9}); !errors.Is(err, ErrNameTaken) || !errors.Is(err, ErrExists) {
			t.Errorf("name of another project: %v", err)
		}
		if _, err := s.PutPublication(ctx, Publication{Name: "x", Project: 999, Port: 1, Owner: 9}); !errors.Is(err, ErrNotFound) {
			t.Errorf("unknown project: %v", err)
		}
		if _, err := s.PutPublication(ctx, Publication{Name: "bad", Project: p1.ID, Port: 0, Owner: 9}); err == nil {
			t.Error("port 0 stored")
		}
		if _, err := s.PutPublication(ctx, Publication{Name: "gone", Project: p2.ID, Port: 3000, Owner: 9}); err != nil {
			t.Fatal(err)
		}
		if err := s.DeletePublication(ctx, p2.ID, "app"); !errors.Is(err, ErrNotFound) {
			t.Errorf("delete by another project: %v", err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}

		s = d.open(t, Options{Migrate: true})
		got, err := s.GetPublication(ctx, "app")
		if err != nil || got.Project != p1.ID || got.Port != 8080 || got.Owner != 8 || !got.Created.Equal(pub.Created) {
			t.Fatalf("after reopen: %+v %v", got, err)
		}
		if list, err := s.ListPublications(ctx, p1.ID); err != nil || len(list) != 1 || list[0].Name != "app" {
			t.Errorf("list: %+v %v", list, err)
		}
		if err := s.DeleteProject(ctx, p2.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetPublication(ctx, "gone"); !errors.Is(err, ErrNotFound) {
			t.Errorf("publication of a deleted project: %v", err)
		}
		if err := s.DeletePublication(ctx, p1.ID, "app"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetPublication(ctx, "app"); !errors.Is(err, ErrNotFound) {
			t.Errorf("after delete: %v", err)
		}
	})
}

func TestLiveToken(t *testing.T) {
	eachBackend(t, func(t *testing.T, d *testDB) {
		s, _ := d.newStore(t)
		ctx := context.Background()
		a, _ := s.CreateAccount(ctx, "alice")
		plain, tok, err := s.CreateToken(ctx, a.ID, "t")
		if err != nil {
			t.Fatal(err)
		}
		acct, id, err := s.AuthenticateToken(ctx, plain)
		if err != nil || acct.ID != a.ID || id != tok.ID {
			t.Fatalf("AuthenticateToken: %+v %d %v", acct, id, err)
		}
		if got, err := s.LiveToken(ctx, tok.ID); err != nil || got.Account != a.ID {
			t.Fatalf("LiveToken: %+v %v", got, err)
		}
		if err := s.RevokeToken(ctx, tok.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := s.LiveToken(ctx, tok.ID); !errors.Is(err, ErrNotFound) {
			t.Errorf("revoked: %v", err)
		}
		if _, err := s.LiveToken(ctx, 12345); !errors.Is(err, ErrNotFound) {
			t.Errorf("unknown: %v", err)
		}
	})
}
