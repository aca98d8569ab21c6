package store

import (
	"context"
	"errors"
	"slices"
	"testing"
)

func TestGrants(t *testing.T) {
	eachBackend(t, func(t *testing.T, d *testDB) {
		ctx := context.Background()
		s, err := Open(ctx, d.url, Options{Migrate: true})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		a, err := s.CreateAccount(ctx, "alice")
		if err != nil {
			t.Fatal(err)
		}
		if on, err := s.HostPaths(ctx, a.ID); err != nil || on {
			t.Fatalf("new account: host paths %v, %v", on, err)
		}
		for _, want := range []bool{true, true, false} {
			if err := s.SetHostPaths(ctx, a.ID, want); err != nil {
				t.Fatal(err)
			}
			if on, err := s.HostPaths(ctx, a.ID); err != nil || on != want {
				t.Fatalf("host paths %v, %v; want %v", on, err, want)
			}
		}
		if err := s.SetHostPaths(ctx, 999, true); !errors.Is(err, ErrNotFound) {
			t.Errorf("unknown account: %v", err)
		}
		p, err := s.CreateProject(ctx, NewProject{Kind: ProjectManaged, Name: "p", Root: "/x"})
		if err != nil {
			t.Fatal(err)
		}
		if r, err := s.ExportRemotes(ctx, p.ID); err != nil || r != nil {
			t.Fatalf("new project: %q, %v", r, err)
		}
		want := []string{"github.com/org/*", "example.com/a/b"}
		if err := s.SetExportRemotes(ctx, p.ID, want); err != nil {
			t.Fatal(err)
		}
		if r, err := s.ExportRemotes(ctx, p.ID); err != nil || !slices.Equal(r, want) {
			t.Fatalf("export remotes %q, %v", r, err)
		}
		if err := s.SetExportRemotes(ctx, p.ID, []string{"a\nb"}); err == nil {
			t.Error("multi-line pattern accepted")
		}
		if _, err := s.ExportRemotes(ctx, 999); !errors.Is(err, ErrNotFound) {
			t.Errorf("unknown project: %v", err)
		}
	})
}
