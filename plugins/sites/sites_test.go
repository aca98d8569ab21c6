package sites

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/corral-sandbox/corral/plugin"
	"github.com/corral-sandbox/corral/store"
)

func TestValidName(t *testing.T) {
	for name, want := range map[string]bool{
		"app": true, "a": true, "my-app-2": true, "0day": true,
		"": false, "-app": false, "app-": false, "App": false, "a_b": false, "a.b": false, "a/b": false,
		"abcdefghijabcdefghijabcdefghijabcdefghijabcdefghijabcdefghij123":  true,
		"abcdefghijabcdefghijabcdefghijabcdefghijabcdefghijabcdefghij1234": false,
	} {
		if got := ValidName(name); got != want {
			t.Errorf("ValidName(%q) = %v", name, got)
		}
	}
}

func TestTable(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "db"), store.Options{Migrate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	p1, err := st.CreateProject(ctx, store.NewProject{Kind: store.ProjectManaged, Name: "one", Root: "/w/one"})
	if err != nil {
		t.Fatal(err)
	}
	p2, err := st.CreateProject(ctx, store.NewProject{Kind: store.ProjectManaged, Name: "two", Root: "/w/two"})
	if err != nil {
		t.Fatal(err)
	}
	tb := New(Options{Store: st})

	if _, err := tb.Publish(ctx, p1.ID, "app", 8000, 7); err != nil {
		t.Fatal(err)
	}
	// Republishing by the same project replaces the port.
	if s, err := tb.Publish(ctx, p1.ID, "app", 8080, 7); err != nil || s.Port != 8080 {
		t.Fatalf("republish: %+v %v", s, err)
	}
	if _, err := tb.Publish(ctx, p2.ID, "app", 9000, 8); !errors.Is(err, ErrTaken) {
		t.Errorf("name of another project: %v", err)
	}
	for _, tc := range []struct {
		project int64
		name    string
		port    int
	}{{p1.ID, "Bad", 1}, {p1.ID, "ok", 0}, {p1.ID, "ok", 65536}, {999, "ok", 1}, {0, "ok", 1}} {
		if _, err := tb.Publish(ctx, tc.project, tc.name, tc.port, 7); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: %v", tc, err)
		}
	}
	s, err := tb.Lookup(ctx, "app")
	if err != nil || s.Project != p1.ID || s.Port != 8080 || s.By != 7 || s.Published.IsZero() {
		t.Fatalf("lookup: %+v %v", s, err)
	}
	if list, _ := tb.List(ctx, p1.ID); len(list) != 1 || list[0].Name != "app" {
		t.Errorf("list: %+v", list)
	}
	if list, _ := tb.List(ctx, p2.ID); len(list) != 0 {
		t.Errorf("list of another project: %+v", list)
	}
	if err := tb.Unpublish(ctx, p2.ID, "app"); !errors.Is(err, ErrNotFound) {
		t.Errorf("unpublish by another project: %v", err)
	}
	if err := tb.Unpublish(ctx, p1.ID, "app"); err != nil {
		t.Fatal(err)
	}
	if _, err := tb.Lookup(ctx, "app"); !errors.Is(err, ErrNotFound) {
		t.Errorf("lookup after unpublish: %v", err)
	}
}

// TestRegistration: the plugin provides the sites domain through a
// registry, and its control implements Control.
func TestRegistration(t *testing.T) {
	r := plugin.New(plugin.Options{})
	if err := r.RegisterDomain(plugin.DomainSites, plugin.Implements[Control](), plugin.DomainOptions{Absent: ErrUnavailable}); err != nil {
		t.Fatal(err)
	}
	st := r.Load(context.Background(), []plugin.Registration{Registration(Options{})}, plugin.Config{})
	if len(st) != 1 || st[0].State != plugin.StateLoaded {
		t.Fatalf("load: %+v", st)
	}
	if _, err := plugin.ResolveCoreAs[Control](r, plugin.DomainSites); err != nil {
		t.Fatal(err)
	}
	r2 := plugin.New(plugin.Options{})
	if err := r2.RegisterDomain(plugin.DomainSites, plugin.Implements[Control](), plugin.DomainOptions{Absent: ErrUnavailable}); err != nil {
		t.Fatal(err)
	}
	r2.Load(context.Background(), []plugin.Registration{Registration(Options{})}, plugin.Config{Disabled: []string{Name}})
	if _, err := plugin.ResolveCoreAs[Control](r2, plugin.DomainSites); !errors.Is(err, ErrUnavailable) || !errors.Is(err, plugin.ErrAbsent) {
		t.Errorf("disabled: %v", err)
	}
}

// TestTablePersists: with a store, a publication survives reopening it
// (a daemon restart), so another project cannot take the name then.
func TestTablePersists(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "db")
	st, err := store.Open(ctx, path, store.Options{Migrate: true})
	if err != nil {
		t.Fatal(err)
	}
	p1, _ := st.CreateProject(ctx, store.NewProject{Kind: store.ProjectManaged, Name: "one", Root: "/w/one"})
	p2, _ := st.CreateProject(ctx, store.NewProject{Kind: store.ProjectManaged, Name: "two", Root: "/w/two"})
	if _, err := New(Options{Store: st}).Publish(ctx, p1.ID, "app", 8000, 7); err != nil {
		t.Fatal(err)
	}
	st.Close()
	st, err = store.Open(ctx, path, store.Options{Migrate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	tb := New(Options{Store: st})
	if s, err := tb.Lookup(ctx, "app"); err != nil || s.Project != p1.ID || s.Port != 8000 || s.By != 7 {
		t.Fatalf("after reopen: %+v %v", s, err)
	}
	if _, err := tb.Publish(ctx, p2.ID, "app", 9000, 8); !errors.Is(err, ErrTaken) {
		t.Errorf("another project after reopen: %v", err)
	}
}
